"""An experiment: a TOML file with [model], [parallel], [cluster] and optional [sim].

    [model]      layers, hidden, heads, seq_len, vocab, ffn_hidden, dtype, tied_embeddings
    [parallel]   tp, pp, dp, vp, sp, zero, schedule, micro_batch, global_batch, recompute,
                 flash_attention, bucket_bytes, cp
    [cluster]    see topology.config
    [sim]        network = "flow" | "analytic" | "ideal", algo = "auto" | ..., profile = "p.json"

Every key is checked; a bad one raises ConfigError naming the table, key, value and rule.
"""

from __future__ import annotations

import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from sim.collectives import ALGORITHMS
from sim.profile import Profile, default_profile, load_profile
from sim.replay import NETWORKS
from topology.cluster import Cluster
from topology.config import cluster_from_table
from traces.errors import ConfigError, check_keys
from traces.layout import Layout
from traces.model import ModelSpec
from traces.units import parse_size

EXAMPLES = ("gpt3-175b-1024-a100.toml", "llama-7b-zero3-64-h100.toml",
            "gpt-6.7b-tpu-v4-torus.toml")
SIM_KEYS = ("network", "algo", "profile")


@dataclass(frozen=True, kw_only=True)
class Experiment:
    name: str
    model: ModelSpec
    layout: Layout
    cluster: Cluster
    network: str = "flow"
    algo: str = "auto"
    profile: Profile
    warnings: tuple[str, ...] = ()


def example_path(name: str = EXAMPLES[0]) -> Path:
    """A config shipped with the package (the first is `parasim simulate`'s default)."""
    return Path(str(resources.files("sim").joinpath("examples", name)))


def load_experiment(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Experiment:
    """Read and validate a config file; `overrides` (from flags) replace [sim] keys."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return experiment_from_dict(data, name=path.stem, base=path.parent, overrides=overrides)


def experiment_from_dict(data: Mapping[str, Any], *, name: str = "experiment",
                         base: Path = Path("."),
                         overrides: Mapping[str, Any] | None = None) -> Experiment:
    for table in data:
        if table not in ("model", "parallel", "cluster", "sim"):
            raise ConfigError(f"[{table}]: unknown table (known: model, parallel, cluster, sim)")
    for table in ("model", "parallel", "cluster"):
        if not isinstance(data.get(table), dict):
            raise ConfigError(f"[{table}]: missing table")
    model = ModelSpec(**_keys(data["model"], "model", ModelSpec))
    parallel = dict(data["parallel"])
    if "bucket_bytes" in parallel:
        parallel["bucket_bytes"] = parse_size(parallel["bucket_bytes"], "parallel.bucket_bytes")
    layout = Layout(**_keys(parallel, "parallel", Layout))
    _check_bools(parallel, "parallel", ("sp", "flash_attention"))
    _check_bools(data["model"], "model", ("tied_embeddings",))
    cluster = cluster_from_table(data["cluster"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout.validate(model, world=cluster.num_devices,
                        devices_per_server=cluster.devices_per_server)
    sim = {**data.get("sim", {}), **(overrides or {})}
    check_keys(sim, SIM_KEYS, "sim")
    network = sim.get("network", "flow")
    if network not in NETWORKS:
        raise ConfigError(f"sim.network: {network!r} is not one of {', '.join(NETWORKS)}")
    algo = sim.get("algo", "auto")
    if algo != "auto" and algo not in ALGORITHMS:
        raise ConfigError(f"sim.algo: {algo!r} is not auto or one of {', '.join(ALGORITHMS)}")
    profile = (load_profile(base / sim["profile"]) if sim.get("profile")
               else default_profile(cluster.accelerator))
    return Experiment(name=name, model=model, layout=layout, cluster=cluster, network=network,
                      algo=algo, profile=profile, warnings=tuple(str(w.message) for w in caught))


def _keys(table: Mapping[str, Any], where: str, cls: type) -> dict[str, Any]:
    check_keys(table, [f.name for f in fields(cls)], where)
    return dict(table)


def _check_bools(table: Mapping[str, Any], where: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in table and not isinstance(table[key], bool):
            raise ConfigError(f"{where}.{key}: {table[key]!r} must be true or false")
