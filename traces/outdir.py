"""A run's output folder (`run --out`, `calibrate --keep`, `validate --keep`): one set of files.

    staged = StagedDir.check("--out", "runs/tiny", inputs=[config], force=False)
    ... write every file under staged.path ...
    staged.commit()          # moved in whole; staged.discard() (or an error) leaves nothing

`StagedDir.check` refuses, before anything runs, a folder that cannot become this run's: an
empty path, a file, a dangling symlink or a symlink loop, a place that cannot be written (/proc,
a read-only file system, a disk with less than `MIN_FREE_BYTES` free), a folder that holds one
of the run's own inputs, one holding files that are not a run's, and one holding another run
unless `force`. The files are written to a fresh hidden folder beside the target (on its file
system, so the move is a rename) and renamed into place only when all are written: a failed or
interrupted run leaves nothing half-written, and never a mixture of two runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from traces.errors import ConfigError

MIN_FREE_BYTES = 64 * 2**20
"""The space a run's folder needs at the start: a 2-rank tiny run writes about 1 MB of traces,
the microbenchmarks about 5 MB; a disk with less than 64 MiB free is as good as full, and is
refused before minutes of measuring instead of after."""

RUN_FILE = re.compile(r"(rank\d+|chrome|kernels-rank\d+)\.json(\.gz)?|bench|run")
"""What a parasim run leaves in its folder (`run`: rank<r>.json, chrome.json, kernels-rank<r>
.json; `validate --keep`: bench/ and run/)."""
_STAGE_PREFIX = ".parasim-stage-"


@dataclass(slots=True)
class StagedDir:
    target: Path
    path: Path
    """The hidden folder the files are written to."""
    flag: str
    replace: bool
    """The target holds an older run that `commit` replaces (`force`)."""

    @classmethod
    def check(cls, flag: str, out: str, *, inputs: Iterable[os.PathLike[str] | str] = (),
              force: bool = False, force_flag: str = "--force") -> StagedDir:
        """The checks of the module doc, then the hidden folder made (which proves the place
        writable)."""
        if not out:
            raise ConfigError(f"{flag}: an empty path names no directory")
        target = Path(out)
        entries = _entries(flag, target)
        resolved = target.resolve()
        for item in inputs:
            if resolved == Path(item).resolve() or resolved in Path(item).resolve().parents:
                raise ConfigError(f"{flag}: {out} holds {item}, an input of this run; write "
                                  "the run to another directory")
        foreign = sorted(e for e in entries or () if not RUN_FILE.fullmatch(e))
        if foreign:
            raise ConfigError(f"{flag}: {out} holds files that are not a parasim run's "
                              f"({_names(foreign)}); give a new or empty directory")
        if entries and not force:
            hint = (f"give {force_flag} to replace it, or" if force_flag else "remove it or give")
            raise ConfigError(f"{flag}: {out} holds another run ({_names(sorted(entries))}); "
                              f"{hint} a new directory")
        return cls(target, _stage(flag, target), flag, bool(entries))

    def commit(self) -> None:
        """Move the written folder into place, whole (replacing the older run when forced)."""
        target = self.target
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            old = None
            if self.replace and target.exists():
                old = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=_existing(target)))
                os.replace(target, old / "old")
            try:
                os.rename(self.path, target)  # replaces only an empty folder
            except OSError as err:
                if old is not None:
                    os.replace(old / "old", target)
                raise err
        except OSError as err:
            self.discard()
            raise ConfigError(f"{self.flag}: {target} could not take this run's files "
                              f"({_why(err)}): another run wrote there meanwhile? Nothing of "
                              "this run was kept") from None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _entries(flag: str, target: Path) -> list[str] | None:
    """The folder's entries (None: it does not exist yet); every way it cannot be a folder is
    one line."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        if target.is_symlink():
            raise ConfigError(f"{flag}: {target} is a symlink to {os.readlink(target)}, which "
                              "does not exist") from None
        return None
    except OSError as err:  # a symlink loop, a path through a file, no permission
        raise ConfigError(f"{flag}: {target}: {_why(err)}") from None
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{flag}: {target} exists and is not a directory")
    try:
        return os.listdir(target)
    except OSError as err:
        raise ConfigError(f"{flag}: {target}: {_why(err)}") from None


def _existing(target: Path) -> Path:
    """The nearest folder above `target` that exists (where the hidden folder goes)."""
    parent = target.absolute().parent
    while not parent.is_dir():
        parent = parent.parent
    return parent


def _stage(flag: str, target: Path) -> Path:
    parent = _existing(target)
    try:
        info = os.statvfs(parent)
        if info.f_flag & os.ST_RDONLY:
            raise OSError(30, f"{parent} is on a read-only file system")
        stage = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=parent))
    except OSError as err:
        raise ConfigError(f"{flag}: cannot write {target}: {_why(err)}") from None
    free = info.f_bavail * info.f_frsize
    if free < MIN_FREE_BYTES:
        stage.rmdir()
        raise ConfigError(f"{flag}: cannot write {target}: {parent} has {free / 2**20:.1f} MiB "
                          f"free, less than the {MIN_FREE_BYTES // 2**20} MiB a run needs")
    return stage


def _names(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _why(err: OSError) -> str:
    return err.strerror or str(err)


@contextlib.contextmanager
def kept(staged: StagedDir | None) -> Iterator[str | None]:
    """The hidden folder's path while the block writes it (None: nothing is kept), moved in
    whole when the block ends well and removed when it does not (an error, Ctrl-C)."""
    if staged is None:
        yield None
        return
    try:
        yield str(staged.path)
    except BaseException:
        staged.discard()
        raise
    staged.commit()
