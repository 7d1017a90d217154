"""What every command shares: printing results, the progress bar, the cluster flags, `--profile`,
TRACE inputs and the timed-trace outputs. Each piece exists here once.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.measured import cluster_spec
from topology.cluster import Cluster
from topology.presets import PRESETS
from traces.chrome import dumps_chrome
from traces.errors import ConfigError, show
from traces.files import Outputs
from traces.gzipped import text_or_gzip
from traces.io import dumps as dumps_trace
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
    there, None elsewhere (the replay then counts nothing for it)."""

    def __init__(self, desc: str, unit: str) -> None:
        self.bar: Any = _Off()
        self.progress: Progress | None = None
        if not _hidden():
            from tqdm import tqdm
            self.bar = tqdm(desc=desc, unit=unit, delay=1.0, leave=False, mininterval=0.5)
            self.progress = self.update

    def update(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


class Phases:
    """One bar over a command's named phases (validate: microbenchmarks, run, simulate), on
    stderr and only on a terminal: which phase runs now, how many are done, the time spent.

        with Phases("validate", 4) as phase:
            phase("microbenchmarks"); ...; phase("run"); ...
    """

    def __init__(self, desc: str, total: int) -> None:
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=desc, delay=1.0, leave=False, disable=_hidden(),
                        bar_format="{desc}: {n}/{total} done{postfix} [{elapsed}]")
        self.started = False

    def __call__(self, name: str) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_postfix_str(name)

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def progress_over(items: list[Any], desc: str) -> Any:
    """`items`, iterated under a bar of their own (tqdm, on a terminal only)."""
    from tqdm import tqdm
    return tqdm(items, desc=desc, delay=1.0, leave=False, disable=_hidden())


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
    """--trace (parasim's JSON) and --chrome (Perfetto), each gzipped when it ends in .gz
    (a phase bar on a terminal: a large step's files take tens of seconds)."""
    flags = [f for f in ("--trace", "--chrome") if f in targets]
    with Phases("writing", len(flags)) as phase:
        for flag in flags:
            phase(f"{flag} {targets[flag].name}")
            dumps = dumps_trace if flag == "--trace" else dumps_chrome
            outputs.write(targets[flag], text_or_gzip(dumps(timed), targets[flag]))


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
