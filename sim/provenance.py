"""Provenance: what produced a number, carried by every `--json` object under one key.

    {"parasim": {"version": "0.1.0",
                 "profile": {"name": "default-A100-SXM4-80GB", "calibrated": false},
                 "config_sha256": "9f86d0..."}}

`config_sha256` is the sha256 of the input's bytes: the config file (`simulate`), the trace
(`replay`; a folder of per-rank files hashes as `sha256sum` would list them, see
`files_sha256`), the cluster file (`collective --cluster FILE.toml`), or, where the input is
a preset named by flags (`collective --cluster dgx-h100`), the flags written canonically
(`flags_sha256`). Two results with equal provenance came from the same parasim, the same
profile and the same input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from sim.profile import Profile
from traces.errors import ConfigError
from traces.files import PathLike

KEY = "parasim"
"""The one key provenance sits under, so consumers of the older objects are not broken."""
_CHUNK = 2**20


def parasim_version() -> str:
    """The installed package's version ("unknown" when run from a tree never installed)."""
    try:
        return metadata.version("parasim")
    except metadata.PackageNotFoundError:
        return "unknown"


def provenance(profile: Profile, config_sha256: str) -> dict[str, Any]:
    """The `{"parasim": {...}}` entry to merge into a `--json` object."""
    return {KEY: {"version": parasim_version(),
                  "profile": {"name": profile.name, "calibrated": profile.calibrated},
                  "config_sha256": config_sha256}}


def file_sha256(path: PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (a trace may hold gigabytes)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    return digest.hexdigest()


def files_sha256(paths: Iterable[Path]) -> str:
    """One digest for several files: the sha256 of their `sha256sum` listing (a line
    "<file sha256>  <file name>" each, sorted by name), so renaming a rank's file or changing
    a byte of it changes the result."""
    lines = [f"{file_sha256(p)}  {p.name}\n" for p in sorted(paths, key=lambda p: p.name)]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def flags_sha256(flags: Mapping[str, object]) -> str:
    """The sha256 of command-line flags written canonically (JSON, keys sorted, compact)."""
    text = json.dumps(dict(flags), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()
