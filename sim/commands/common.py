"""What every command shares: printing results, the progress bar, the cluster flags, `--profile`,
TRACE inputs and the timed-trace outputs. Each piece exists here once.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.measured import cluster_spec
from topology.cluster import Cluster
from topology.presets import PRESETS
from traces.chrome import dumps_chrome
from traces.errors import ConfigError, show
from traces.files import Outputs
from traces.io import dumps as dumps_trace
from traces.json_chunks import gzip_counted
from traces.ops import Trace
from traces.units import parse_size

if TYPE_CHECKING:
    from sim.engine.replay import Progress

MAX_SIZES = 64


def error(message: str) -> None:
    """One line on stderr: what every refusal and failure prints."""
    if sys.stderr is not None:
        print(f"parasim: error: {message}", file=sys.stderr)


def emit(text: str) -> None:
    """Print `text` on stdout and flush it now, so a full disk (`> /dev/full`) is one error line
    here rather than a traceback at exit."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        silence_stdout()
        raise ConfigError(f"cannot write to stdout: {err.strerror or err}") from None


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what could not be written
    neither fails nor prints a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests capture)
        pass


def _hidden() -> bool:
    """No bar where stderr is not a terminal: never `\\r` frames in logs."""
    return sys.stderr is None or not sys.stderr.isatty()


class _Off:
    """What a hidden bar is asked (tqdm's `disable=True` bar, without importing tqdm: 20 ms of
    a `parasim simulate` whose stderr is a pipe)."""

    disable = True
    n, total, postfix = 0, None, None

    def update(self, n: float = 1) -> None:
        self.n += n  # type: ignore[assignment]

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text  # type: ignore[assignment]

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressBar:
    """A tqdm bar on stderr, drawn only when stderr is a terminal; `progress` is its `update`
    there, None elsewhere (the replay then counts nothing for it). It shows BAR_DELAY_S after
    it starts and its clock moves between counts (`Heartbeat`)."""

    def __init__(self, desc: str, unit: str) -> None:
        self.bar: Any = _Off()
        self.progress: Progress | None = None
        if not _hidden():
            from tqdm import tqdm
            self.bar = tqdm(desc=desc, unit=unit, delay=BAR_DELAY_S, leave=False,
                            mininterval=BAR_MININTERVAL_S, miniters=1)
            self.progress = self.update
        self.beat = Heartbeat(self.bar)

    def update(self, done: int, total: int | None) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.beat.stop()
        self.bar.close()


BAR_DELAY_S = 1.0
"""A bar appears once its work has run this long (shorter work draws nothing)."""
BAR_MININTERVAL_S = 0.5
HEARTBEAT_S = 0.5


class Heartbeat:
    """Redraws a shown bar every HEARTBEAT_S from a thread of its own, so its clock moves
    and it appears BAR_DELAY_S after it starts even while no unit is counted (a long first
    unit looked hung: `--chrome` showed 'writing: 0/1 done' for 36 s)."""

    def __init__(self, bar: Any) -> None:
        self.bar, self.stopped = bar, threading.Event()
        if not getattr(bar, "disable", True):
            threading.Thread(target=self._beat, name="parasim-bar", daemon=True).start()

    def _beat(self) -> None:
        start = time.monotonic()
        while not self.stopped.wait(HEARTBEAT_S):
            if time.monotonic() - start >= BAR_DELAY_S:
                self.bar.refresh()

    def stop(self) -> None:
        self.stopped.set()


class UnitBars:
    """`progress(unit, done, total)` of `traces.json_chunks` as one bar per unit in turn
    ('--chrome step.json.gz: ranks', then ': events', then ': bytes gzipped'); a unit whose
    bar has given way to the next one is not drawn again."""

    def __init__(self, label: str, item: str, rank: str = "ranks") -> None:
        self.label, self.words = label, {"rank": rank, "item": item, "byte": "bytes gzipped"}
        self.unit = ""
        self.bar: ProgressBar | None = None
        self.finished: set[str] = set()

    def __call__(self, unit: str, done: int, total: int | None) -> None:
        if unit in self.finished:
            return
        if unit != self.unit:
            self.finished.add(self.unit)
            self.close()
            self.unit, self.bar = unit, ProgressBar(f"{self.label}: {self.words[unit]}",
                                                    unit)
        assert self.bar is not None
        self.bar.update(done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__()
            self.bar = None

    def shown(self) -> bool:
        """Whether its bars are drawn (stderr a terminal): else nobody need count for them."""
        return not _hidden()

    def __enter__(self) -> UnitBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def job_progress(label: str, steps: int) -> Iterator[None]:
    """While a local job runs in the block, a bar of its ranks joining, then of rank 0's ops
    over `steps` recorded steps (`executor.watch`); on a terminal only."""
    if _hidden():
        yield
        return
    from executor.watch import watching  # the executor, and torch, only for a job

    with UnitBars(label, f"ops over {steps} step{'s' * (steps != 1)}", "ranks joined") as bars, \
            watching(bars, steps):
        yield


class Phases:
    """One bar over a command's named phases (validate: microbenchmarks, run, simulate), on
    stderr and only on a terminal: which phase runs now, how many are done, the time spent.

        with Phases("validate", 4) as phase:
            phase("microbenchmarks"); ...; phase("run"); ...
    """

    def __init__(self, desc: str, total: int) -> None:
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=desc, delay=BAR_DELAY_S, leave=False,
                        disable=_hidden(), mininterval=BAR_MININTERVAL_S,
                        bar_format="{desc}: {n}/{total} done{postfix} [{elapsed}]")
        self.beat = Heartbeat(self.bar)
        self.started = False

    def __call__(self, name: str) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_postfix_str(name)

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.beat.stop()
        self.bar.close()


def progress_over(items: list[Any], desc: str) -> Iterator[Any]:
    """`items`, iterated under a bar of their own (tqdm, on a terminal only), shown within
    BAR_DELAY_S of the start even while the first item runs (a sweep's first simulation)."""
    from tqdm import tqdm
    bar = tqdm(items, desc=desc, delay=BAR_DELAY_S, leave=False, disable=_hidden(),
               mininterval=BAR_MININTERVAL_S, miniters=1)
    beat = Heartbeat(bar)
    try:
        yield from bar
    finally:
        beat.stop()
        bar.close()


def config_path(given: str | None, default: Path) -> Path:
    """The CONFIG argument, or the shipped example the command defaults to."""
    return Path(given) if given is not None else default


def cluster_flags(parser: argparse.ArgumentParser, default: str | None, what: str) -> None:
    """--cluster PRESET_OR_TOML, --nodes and --fabric."""
    parser.add_argument("--cluster", default=default,
                        help=f"a preset ({', '.join(PRESETS)}) or a TOML file with [cluster]"
                        f"{what}")
    parser.add_argument("--nodes", type=int, help="servers (default: the cluster's)")
    parser.add_argument("--fabric", help="fat-tree | rail | torus (default: the cluster's)")


def cluster_from_flags(args: argparse.Namespace,
                       settings: dict[str, Any] | None = None) -> Cluster:
    """The cluster --cluster, --nodes and --fabric name, built; `settings` (`--set
    cluster.K=V`'s keys) replace the preset's or file's, and --nodes and --fabric win."""
    overrides = {**(settings or {}), **{k: v for k, v in (("nodes", args.nodes),
                                                          ("fabric", args.fabric))
                                        if v is not None}}
    return cluster_spec(args.cluster, overrides).build()


def profile_flag(path: str | None, inputs: list[Path]) -> str | None:
    """--profile: checked, added to the inputs (never written over), and resolved, as the
    experiment's `[sim] profile` takes it; None when not given."""
    if path is None:
        return None
    if not path:
        raise ConfigError("--profile: an empty path names no file")
    inputs.append(Path(path))
    return str(Path(path).resolve())


def trace_files(path: Path) -> list[Path]:
    """The files a TRACE or DIR argument may read, so that no output overwrites one of them."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path]


def write_timed(outputs: Outputs, targets: dict[str, Path], timed: Trace) -> None:
    """--trace (parasim's JSON) and --chrome (Perfetto), each gzipped when it ends in .gz;
    on a terminal a bar counts the ranks encoded, the ops or events written and the bytes
    gzipped (a large step's files take tens of seconds)."""
    for flag in (f for f in ("--trace", "--chrome") if f in targets):
        path = targets[flag]
        with UnitBars(f"{flag} {path.name}", "ops" if flag == "--trace" else "events") as bars:
            progress = None if _hidden() else bars
            text = (dumps_trace if flag == "--trace" else dumps_chrome)(timed, progress)
            data = gzip_counted(text, progress) if str(path).endswith(".gz") else text
        outputs.write(path, data)


def parse_sizes(text: str) -> list[int]:
    """'1M,16M' | '1K:8G' (doubling, like nccl-tests -b 1K -e 8G -f 2) | '4096'; each size
    from 1 byte to 1 TiB (`traces.units.MAX_SIZE_BYTES`)."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 2:
            raise ConfigError(f"--sizes: {show(text)} is not a range (write e.g. 1K:8G)")
        lo, hi = (parse_size(p, "--sizes") for p in parts)
        if lo > hi:
            raise ConfigError(f"--sizes: {show(text)} starts above its end")
        sizes: list[int] = []
        while lo <= hi and len(sizes) <= MAX_SIZES:
            sizes.append(lo)
            lo *= 2
    else:
        parts = text.split(",")
        if len(parts) > MAX_SIZES:  # before parsing a million of them
            raise ConfigError(f"--sizes: {len(parts):,} sizes, more than {MAX_SIZES}")
        sizes = [parse_size(p, "--sizes") for p in parts]
    if len(sizes) > MAX_SIZES:
        raise ConfigError(f"--sizes: {show(text)} gives more than {MAX_SIZES} sizes")
    return sizes
