"""Microbenchmarks for calibration: what to measure (a target: cluster, world, kernels), the
bench spec, the host's backend, running them through the executor, and reading measured traces.

`parasim calibrate` and `parasim validate` both use these (`sim.commands`); the executor (and
torch) load only when the microbenchmarks run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import Experiment, experiment_from_dict
from sim.profile import Profile, default_profile
from sim.settings import Setting, apply_settings
from topology.cluster import Cluster
from topology.config import read_cluster
from topology.presets import PRESETS
from traces.bench import ALL_COLLECTIVE_KINDS, COLLECTIVE_KINDS, BenchSpec, Probe, probe_grid
from traces.errors import ConfigError, show
from traces.files import load_toml
from traces.ops import Trace

DEFAULT_SIZES = "4K:256M"
DEFAULT_PROBES = "64x32x1,64x32x4,64x128x1,64x128x4,256x32x1,256x32x4,256x128x1,256x128x4"
MAX_RANKS = 8
MAX_PROBES = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What the microbenchmarks run for: a cluster and the world and kernels to time on it."""

    cluster: Cluster
    world: int
    dtype: str
    attention: str
    profile: Profile
    """The profile the target already has (its defaults, or its config's)."""


# --- what to measure --------------------------------------------------------------------------

def resolve_target(name: str, ranks: int | None = None,
                   settings: Sequence[Setting] = ()) -> Target:
    """A preset, a cluster TOML or a config TOML, as a microbenchmark target (with `--set`
    settings in place: a preset is the table `[cluster] preset = NAME`)."""
    if not name:
        raise ConfigError("--run: an empty name names no cluster or config")
    if name in PRESETS:
        table = apply_settings({"cluster": {"preset": name}}, settings)["cluster"]
        return _cluster_target(read_cluster(table), name, ranks)
    path = Path(name)
    if path.suffix != ".toml":
        raise ConfigError(f"--run: {show(name)} is neither a preset ({', '.join(PRESETS)}) "
                          "nor a .toml cluster or config")
    data = apply_settings(load_toml(path), settings)
    if "model" not in data:
        table = data.get("cluster")
        if not isinstance(table, dict):
            raise ConfigError(f"--run: {path} has neither [model] nor [cluster]")
        return _cluster_target(read_cluster(table), name, ranks)
    if ranks is not None:
        raise ConfigError("--ranks: a config's world is its layout's")
    exp = experiment_from_dict(data, name=path.stem, base=path.parent)
    return experiment_target(exp)


def experiment_target(exp: Experiment) -> Target:
    """A config's cluster (as its profile leaves it), world and kernels."""
    if exp.layout.world > MAX_RANKS:
        raise ConfigError(f"--run: the config's {exp.layout.world} ranks are more than the "
                          f"{MAX_RANKS} a local run spawns")
    return Target(cluster=exp.cluster, world=exp.layout.world, dtype=exp.model.data_dtype,
                  attention=exp.model.attention, profile=exp.profile)


def _cluster_target(spec: Any, name: str, ranks: int | None) -> Target:
    devices = spec.num_devices
    if ranks is None:
        ranks = max(2, min(devices, os.cpu_count() or 1, MAX_RANKS))
    if not 2 <= ranks <= min(devices, MAX_RANKS):
        raise ConfigError(f"--ranks: {ranks} must be from 2 to {min(devices, MAX_RANKS)} "
                          f"(the cluster's accelerators, at most {MAX_RANKS} local ranks)")
    if spec.preset == "localhost":  # as many ranks as run: the cluster is this host's
        spec = read_cluster({"preset": "localhost", "gpus_per_node": ranks})
    cluster = spec.build()
    return Target(cluster=cluster, world=ranks, dtype="fp32", attention="flash",
                  profile=default_profile(cluster.accelerator))


def fit_target(cluster: str | None, traces: Sequence[Trace],
               settings: Sequence[Setting] = ()) -> Target:
    """The cluster DIRs are fitted on: --cluster (a preset, a cluster TOML or a config, with
    `--set` settings in place), or localhost with as many ranks as the traces hold."""
    world = max((max(max(t.ops, default=0) + 1, t.meta.world_size or 0) for t in traces),
                default=1)
    name = cluster if cluster is not None else "localhost"
    if not name:
        raise ConfigError("--cluster: an empty name names no cluster")
    if name in PRESETS:
        spec = read_cluster(apply_settings({"cluster": {"preset": name}}, settings)["cluster"])
    elif Path(name).suffix == ".toml":
        data = apply_settings(load_toml(name, what="--cluster"), settings)
        if "model" in data:
            target = experiment_target(experiment_from_dict(data, name=Path(name).stem,
                                                            base=Path(name).parent))
            spec = None
        elif isinstance(data.get("cluster"), dict):
            spec = read_cluster(data["cluster"])
        else:
            raise ConfigError(f"--cluster: {name} has neither [model] nor [cluster]")
    else:
        raise ConfigError(f"--cluster: {show(name)} is neither a preset "
                          f"({', '.join(PRESETS)}) nor a .toml cluster or config")
    if spec is not None:
        if spec.preset == "localhost" and world <= MAX_RANKS:
            spec = read_cluster({"preset": "localhost", "gpus_per_node": max(2, world)})
        built = spec.build()
        target = Target(cluster=built, world=world, dtype="fp32", attention="flash",
                        profile=default_profile(built.accelerator))
    if target.cluster.num_devices < world:
        raise ConfigError(f"--cluster: {target.cluster.name} has "
                          f"{target.cluster.num_devices} accelerators but the traces hold "
                          f"{world} ranks")
    return target


def parse_probes(text: str, target: Target) -> tuple[Probe, ...]:
    """'HxSxB,...' (hidden x sequence x micro-batch) as probes of the target's kernels."""
    parts = [p for p in text.split(",") if p]
    if not parts or len(parts) > MAX_PROBES:
        raise ConfigError(f"--probes: {show(text)} must list 1 to {MAX_PROBES} HxSxB shapes")
    probes: list[Probe] = []
    for part in parts:
        fields = part.split("x")
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            raise ConfigError(f"--probes: {show(part)} is not HIDDENxSEQxBATCH (e.g. 64x32x1)")
        h, s, b = (int(f) for f in fields)
        if not (32 <= h <= 8192 and h % 32 == 0 and 1 <= s <= 8192 and 1 <= b <= 64):
            raise ConfigError(f"--probes: {part}: hidden must be a multiple of 32 up to 8192, "
                              "sequence 1 to 8192, micro-batch 1 to 64")
        probes += probe_grid(target.dtype, target.attention, hidden=(h,), seq_len=(s,),
                             micro_batch=(b,))
    return tuple(probes)


def bench_spec(target: Target, sizes: Sequence[int], repeats: int,
               probes: Sequence[Probe]) -> BenchSpec:
    """What --run measures. On GPUs (NCCL) the sweep takes every collective the executor runs;
    on gloo broadcast and all-to-all are left out: the simulator models gloo's lowering and
    per-call cost for the three collectives plans use (`sim.collectives.gloo`), and timings of
    the others, which pay that cost unmodelled, would bias the loopback fit."""
    if not 1 <= repeats <= 100:
        raise ConfigError(f"--repeats: {repeats} must be from 1 to 100")
    cpu = target.cluster.accelerator.name in CPU_ACCELERATORS
    return BenchSpec(world=target.world, sizes=tuple(sizes), repeats=repeats,
                     dtype=target.dtype, probes=tuple(probes),
                     kinds=COLLECTIVE_KINDS if cpu else ALL_COLLECTIVE_KINDS)


CPU_ACCELERATORS = ("CPU-localhost",)
"""Accelerators whose ranks are processes on this host's CPU (gloo)."""
CUDA_MODELS = ("A100", "H100", "H200")
"""GPU models of the presets, as CUDA names them ("NVIDIA A100-SXM4-80GB")."""


def _need_torch() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ConfigError("calibrate --run needs PyTorch: pip install torch==2.13.0 (the CPU "
                          "build) or pip install 'parasim[executor]'")


def host_backend(cluster: Cluster, world: int, what: str) -> str:
    """The backend that runs the target's ranks on the target's devices here: gloo on the CPU
    for localhost, NCCL on CUDA GPUs of the target's model for a GPU preset. One error line
    when this host has no such devices: figures measured on other hardware would be written
    as the target's (an A100 profile of a CPU's gloo timings)."""
    acc = cluster.accelerator.name
    if acc in CPU_ACCELERATORS:
        return "gloo"
    model = acc.split("-")[0]  # "A100" of "A100-SXM4-80GB"
    if model not in CUDA_MODELS:  # TPU-v4
        raise ConfigError(f"{what}: {cluster.name} runs on {acc}, and parasim's "
                          "executor runs ranks on CUDA GPUs or this host's CPU only; calibrate "
                          "on the hardware itself from its traces (parasim calibrate DIR)")
    _need_torch()
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < world:
        raise ConfigError(f"{what}: its {world} ranks run on {acc} GPUs and this "
                          f"host has {count} CUDA GPU{'s' * (count != 1)}: a measurement here "
                          f"would time this host's devices as {acc}s; run on a host with "
                          f"{world} {model}s, or use the localhost preset")
    import torch.distributed as dist

    if not dist.is_nccl_available():
        raise ConfigError(f"{what}: its ranks run on {acc} GPUs over NCCL, and this torch is "
                          "built without NCCL")
    names = sorted({torch.cuda.get_device_name(i) for i in range(world)})
    if not all(model in n for n in names):
        raise ConfigError(f"{what}: its ranks run on {acc} GPUs and this host's are "
                          f"{', '.join(names)}: a measurement here would time them as "
                          f"{acc}s; use the preset of these GPUs")
    return "nccl"


def check_measured_on(trace: Trace, target: Target, where: str) -> None:
    """Traces that say how they were measured (a `parasim run`'s or a profiler's backend)
    must have run on the kind of device the target's cluster has: gloo on a CPU, NCCL on
    GPUs."""
    backend = trace.meta.backend
    cpu = target.cluster.accelerator.name in CPU_ACCELERATORS
    if backend == "gloo" and not cpu or backend == "nccl" and cpu:
        device = "the CPU (gloo)" if backend == "gloo" else "GPUs (NCCL)"
        raise ConfigError(f"{where}: measured on {device}, which is not "
                          f"{target.cluster.accelerator.name} of {target.cluster.name}: its "
                          "figures would be written as another device's; give --cluster "
                          "for the hardware it ran on")


def run_microbenchmarks(spec: BenchSpec, keep: str | None, timeout: float, *,
                        backend: str = "auto") -> Trace:
    """Run the bench plan with the executor (loaded here, lazily); its timed trace."""
    _need_torch()
    if not 1 <= timeout <= 24 * 3600:
        raise ConfigError(f"--timeout: {timeout:g} must be from 1 s to 24 h")
    from executor.bench import run_bench
    from executor.launch import JobFailed

    with _trace_dir(keep) as out:
        try:
            trace = run_bench(spec, out, timeout=timeout, backend=backend)
        except JobFailed as err:
            raise ConfigError(f"calibrate: the microbenchmarks failed: {err}") from None
    if trace is None:  # a torchrun rank other than 0
        raise SystemExit(0)
    return trace


@contextlib.contextmanager
def _trace_dir(keep: str | None) -> Iterator[str]:
    if keep is not None:
        if not keep:
            raise ConfigError("--keep: an empty path names no directory")
        path = Path(keep)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--keep: {keep} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="parasim-bench-") as tmp:
        yield tmp


# --- reading traces ---------------------------------------------------------------------------

def read_traces(path: Path, allow_incomplete: bool = False) -> Trace:
    """A parasim trace file, a PyTorch-profiler JSON (.json / .json.gz), or a folder of
    either, read as `parasim replay` reads them (`sim.measured.load_trace`). A profiler
    trace that gives nothing to fit is one error line saying why."""
    from sim.calibrate.observe import communication, compute
    from sim.measured import load_trace

    loaded = load_trace(path, allow_incomplete=allow_incomplete)
    trace = loaded.trace
    if loaded.source == "kineto" and not communication(trace) and not compute(trace):
        calls = [op for ops in trace.ops.values() for op in ops
                 if op.kind.is_collective or op.kind.is_p2p]
        unsized = sum(op.size_bytes <= 0 for op in calls)
        raise ConfigError(
            f"{path}: a PyTorch-profiler trace with nothing to fit: of its {len(calls)} "
            f"collectives and transfers, {unsized} state no size and the rest are not timed "
            "end to end (a transfer needs its send and its receive), and its compute ops are "
            "not parasim kernels (they state no FLOPs or bytes)")
    return trace
