"""Microbenchmark plans: what `parasim calibrate --run` times, as a plan both interpreters run.

    spec = BenchSpec(world=2, sizes=sweep_sizes(4 * 2**10, 2**20, 4), probes=probe_grid("fp32"))
    plan = bench_plan(spec)        # executor.bench runs it; sim.engine.replay can time it too

A bench plan is an ordinary plan trace, in sections one after another (`meta.bench.sections`):
collective sweeps over every group size and send/recv ping-pong, the interference section (a
probe GEMM and collectives alone, then beside each other), and compute probes over a grid of
shapes. Repetitions are spread in time, and sizes follow nccl-tests.

In full: docs/calibration.md ("The microbenchmarks").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.layout import Layout
from traces.model import DTYPE_BYTES, ModelSpec
from traces.ops import Op, OpKind, Stream, Trace
from traces.plan import build
from traces.purpose import Bench, BenchRole

BENCH_VERSION = 1
COLLECTIVE_KINDS = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER)
"""The collectives plans use."""
ALL_COLLECTIVE_KINDS = (*COLLECTIVE_KINDS, OpKind.BROADCAST, OpKind.ALL_TO_ALL)
"""Every collective the executor runs (broadcast from the group's first member)."""
INTERFERENCE_ALONE = "interference_alone"
INTERFERENCE_OVERLAPPED = "interference_overlapped"
INTERFERENCE_COLLECTIVE = "interference"
INTERFERENCE_COLLECTIVE_ALONE = "interference_collective_alone"
INTERFERENCE_SPACER = "interference_spacer"
"""Op labels of the interference section: the probe alone, a probe while the collective is in
flight, the collective beside the probes, the collective alone, and the short kernel before
each probe and collective (their purposes: `Bench` of a `BenchRole`)."""
_CALL = Bench(BenchRole.CALL)
_OVERLAPPED = Bench(BenchRole.PROBE_OVERLAPPED)
INTERFERENCE_REPEATS = 16
"""Repeats of the interference section (probe alone, collective alone, both together)."""
INTERFERENCE_CHAIN = 16
"""Probes run back to back beside each collective: more than the collective lasts."""
INTERFERENCE_BYTES = 8 * 2**20
"""The large collective of the interference section, the size of a small model's gradient
buckets: on gloo over loopback ~10 ms alone (20-30 ms beside kernels), longer than a probe
(~3.5 ms on a CPU core) and shorter than the chain of probes beside it; a collective the chain
does not outlast, and a probe the collective does not outlast, are left out of the fit,
counted. (On NCCL over NVLink ~0.1 ms: there the probes may not fit inside, and the figures
stay unfitted.)"""
INTERFERENCE_SMALL_BYTES = 64 * 2**10
"""The small one: latency-bound (~0.4-1 ms alone on gloo over loopback), so that what it loses
beside kernels is mostly the wait for a core, not bandwidth."""
INTERFERENCE_SIZES = (INTERFERENCE_BYTES, INTERFERENCE_SMALL_BYTES)
INTERFERENCE_SMALL_CALLS = 3
"""The small collective is timed this many times per repeat (alone, then beside a chain of
INTERFERENCE_SMALL_CHAIN probes): its wait for a core is noisy (1-8 ms), and cheap to time."""
INTERFERENCE_SMALL_CHAIN = 4
MAX_BENCH_OPS = 200_000
MAX_SIZE_BYTES = 2**31
PROBE_LAYERS = 4
"""Layers of a probe model. A kernel reads its weights after the other layers' kernels have
run, as in any real model, not from a cache its own last call left warm: with one layer a
hidden-128 fc1 ran 20-30% faster on a CPU with 1 MiB of L2 per core than in a 4-layer step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One compute probe: a one-layer model's step on one rank."""

    model: ModelSpec
    micro_batch: int
    microbatches: int

    def layout(self) -> Layout:
        return Layout(micro_batch=self.micro_batch,
                      global_batch=self.micro_batch * self.microbatches)

    def to_json(self) -> dict[str, Any]:
        return {"model": dataclasses.asdict(self.model), "micro_batch": self.micro_batch,
                "microbatches": self.microbatches}


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSpec:
    world: int
    sizes: tuple[int, ...] = ()
    """Collective and transfer sizes in bytes (nccl-tests' convention)."""
    group_sizes: tuple[int, ...] = ()
    """Members of each swept group (the first g ranks); default: 2, 4, ... and the world."""
    kinds: tuple[OpKind, ...] = COLLECTIVE_KINDS
    p2p: bool = True
    repeats: int = 5
    dtype: str = "fp32"
    probes: tuple[Probe, ...] = field(default_factory=tuple)
    probe_passes: int = 2
    gap_gemm: tuple[int, int, int] | None = (256, 256, 256)
    """A GEMM (M, N, K) each member runs before each call (None: calls back to back)."""
    interference_gemm: tuple[int, int, int] | None = (512, 512, 512)
    """The probe of the interference section (None: no such section): ~3.5 ms on a CPU core,
    long against the scheduler's time slices (a 256^3 probe of 0.3 ms mostly ran before the
    scheduler shared its core: 0.6 ± 1.4 where 512^3 gave 0.35 ± 0.3 on a 2-core host)."""

    def __post_init__(self) -> None:
        if not 1 <= self.world <= 1024:
            raise ConfigError(f"bench: world {self.world} must be from 1 to 1024")
        if not 1 <= self.repeats <= 1000:
            raise ConfigError(f"bench: repeats {self.repeats} must be from 1 to 1000")
        if not 1 <= self.probe_passes <= 100:
            raise ConfigError(f"bench: probe passes {self.probe_passes} must be from 1 to 100")
        for size in self.sizes:
            if not 1 <= size <= MAX_SIZE_BYTES:
                raise ConfigError(f"bench: size {size} bytes must be from 1 to 2 GiB")
        for g in self.groups():
            if not 2 <= g <= self.world:
                raise ConfigError(f"bench: group size {g} must be from 2 to the world's "
                                  f"{self.world}")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"bench: dtype {self.dtype!r} is not one of "
                              f"{', '.join(DTYPE_BYTES)}")

    def groups(self) -> tuple[int, ...]:
        if self.group_sizes or self.world < 2:
            return self.group_sizes
        sizes = []
        g = 2
        while g < self.world:
            sizes.append(g)
            g *= 2
        return (*sizes, self.world)


def sweep_sizes(low: int, high: int, factor: int = 2) -> tuple[int, ...]:
    """low, low·factor, ... up to high (nccl-tests' -b low -e high -f factor)."""
    if not 1 <= low <= high or factor < 2:
        raise ConfigError(f"bench sizes: {low}..{high} by x{factor} is not a sweep")
    sizes = [low]
    while sizes[-1] * factor <= high:
        sizes.append(sizes[-1] * factor)
    return tuple(sizes)


def probe_grid(dtype: str, attention: str = "flash", *, hidden: Sequence[int] = (64, 256),
               seq_len: Sequence[int] = (32, 128), micro_batch: Sequence[int] = (1, 4),
               head_dim: int = 32, microbatches: int = 2, layers: int = PROBE_LAYERS
               ) -> tuple[Probe, ...]:
    """Probes over a grid of shapes: heads of `head_dim`, a vocabulary of 8·hidden."""
    probes = []
    for h in hidden:
        for s in seq_len:
            for b in micro_batch:
                model = ModelSpec(layers=layers, hidden=h, heads=max(1, h // head_dim),
                                  seq_len=s, vocab=8 * h, dtype=dtype, attention=attention)
                probes.append(Probe(model=model, micro_batch=b, microbatches=microbatches))
    return tuple(probes)


def bench_plan(spec: BenchSpec) -> Trace:
    """The microbenchmark plan of every rank (see the module docstring)."""
    ops: dict[int, list[Op]] = {r: [] for r in range(spec.world)}
    sections: list[dict[str, Any]] = []
    if spec.sizes and spec.world > 1:
        sections.append(_section("collectives", ops, lambda: _collectives(spec, ops)))
    if spec.interference_gemm is not None and spec.world > 1:
        sections.append(_section("interference", ops, lambda: _interference(spec, ops)))
    for _ in range(spec.probe_passes):
        for probe in spec.probes:
            sections.append({**_section("probe", ops, lambda p=probe: _probe(p, ops)),
                             **probe.to_json()})
    total = sum(len(v) for v in ops.values())
    if total > MAX_BENCH_OPS:
        raise ConfigError(f"bench: {total:,} ops, more than {MAX_BENCH_OPS:,} (fewer sizes, "
                          "repeats or probes)")
    meta = TraceMeta(bench={"version": BENCH_VERSION, "sections": sections}, world=spec.world)
    return Trace({r: tuple(v) for r, v in ops.items()}, meta)


def _section(kind: str, ops: dict[int, list[Op]], fill: Any) -> dict[str, Any]:
    """Append a section; its first op on each rank waits for the rank's previous op, so
    sections run one after another on every stream."""
    starts = {r: len(v) for r, v in ops.items()}
    fill()
    for r, v in ops.items():
        first = starts[r]
        if 0 < first < len(v) and first - 1 not in v[first].deps:
            v[first] = dataclasses.replace(v[first], deps=(first - 1, *v[first].deps))
    return {"kind": kind, "ranges": {str(r): [starts[r], len(v)] for r, v in ops.items()}}


def _collectives(spec: BenchSpec, ops: dict[int, list[Op]]) -> None:
    element = DTYPE_BYTES[spec.dtype]
    gap = _gap_op(spec)
    for _ in range(spec.repeats):
        for g in spec.groups():
            group = tuple(range(g))
            for kind in spec.kinds:
                for size in spec.sizes:
                    whole = max(1, size // (g * element)) * g * element
                    for r in group:
                        if gap is not None:
                            ops[r].append(gap)
                        ops[r].append(Op(kind=kind, stream=Stream.COMPUTE, name="bench",
                                         purpose=_CALL, group=group, size_bytes=float(whole),
                                         dtype=spec.dtype))
        if not spec.p2p:
            continue
        for size in spec.sizes:  # ping-pong: each transfer starts after the previous
            size_bytes = float(max(1, size // element) * element)
            _transfer(ops, 0, 1, size_bytes, spec.dtype, gap)
            _transfer(ops, 1, 0, size_bytes, spec.dtype, gap)


def _interference(spec: BenchSpec, ops: dict[int, list[Op]]) -> None:
    """Per repeat, on every rank: the probe alone; then the large collective, and the small
    one INTERFERENCE_SMALL_CALLS times, each alone (the compute stream waits for it), and on
    the dp stream with a chain of probes beside it (the interpreter issues every other
    stream's ready head before it runs a compute op, so the collective is in flight); what
    follows waits for the collective."""
    assert spec.interference_gemm is not None
    m, n, k = spec.interference_gemm
    e = DTYPE_BYTES[spec.dtype]
    probe = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=INTERFERENCE_ALONE,
               purpose=Bench(BenchRole.PROBE_ALONE), gemm=(1, m, n, k), flops=2.0 * m * n * k,
               mem_bytes=float((m * k + k * n + m * n) * e), dtype=spec.dtype)
    spacer = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=INTERFERENCE_SPACER,
                purpose=Bench(BenchRole.SPACER), gemm=(1, 32, 32, 32), flops=2.0 * 32**3,
                mem_bytes=3.0 * 32 * 32 * e, dtype=spec.dtype)
    group = tuple(range(spec.world))
    large, small = (Op(kind=OpKind.ALL_REDUCE, stream=Stream.DP, name=INTERFERENCE_COLLECTIVE,
                       purpose=Bench(BenchRole.COLLECTIVE_BESIDE), group=group,
                       size_bytes=float(max(1, size // (spec.world * e)) * spec.world * e),
                       dtype=spec.dtype)
                    for size in INTERFERENCE_SIZES)
    timings = [(large, INTERFERENCE_CHAIN)] + \
        [(small, INTERFERENCE_SMALL_CHAIN)] * INTERFERENCE_SMALL_CALLS
    for rank in group:
        mine = ops[rank]
        beside: int | None = None
        for _ in range(INTERFERENCE_REPEATS):
            # The short kernel before each probe: a probe alone follows a wait for the last
            # collective, and the first kernel after a wait runs slow (measured: 80-800 us
            # against 60 us for a 128^3 GEMM); so every probe follows a kernel.
            deps = {len(mine) - 1} if mine else set()
            if beside is not None:
                deps.add(beside)
            mine.append(dataclasses.replace(spacer, deps=tuple(sorted(deps))))
            mine.append(dataclasses.replace(probe, deps=(len(mine) - 1,)))
            for collective, chain in timings:
                if beside is not None and mine[-1].purpose == _OVERLAPPED:
                    mine.append(dataclasses.replace(spacer, deps=(len(mine) - 1, beside)))
                mine.append(dataclasses.replace(collective, name=INTERFERENCE_COLLECTIVE_ALONE,
                                                purpose=Bench(BenchRole.COLLECTIVE_ALONE),
                                                deps=(len(mine) - 1,)))
                mine.append(dataclasses.replace(spacer, deps=(len(mine) - 1,)))
                issued = len(mine) - 1
                mine.append(dataclasses.replace(collective, deps=(issued,)))
                beside = len(mine) - 1
                # The spacer also makes the chain start once the collective is under way (in
                # the simulator too, where both would start at the same instant).
                mine.append(dataclasses.replace(spacer, deps=(issued,)))
                for _ in range(chain):
                    mine.append(dataclasses.replace(probe, name=INTERFERENCE_OVERLAPPED,
                                                    purpose=_OVERLAPPED, deps=(len(mine) - 1,)))
        assert beside is not None, "INTERFERENCE_REPEATS > 0"
        mine.append(dataclasses.replace(spacer, deps=(len(mine) - 1, beside)))


def _gap_op(spec: BenchSpec) -> Op | None:
    """The kernel before each call: a training step issues its communication between
    kernels, and on a CPU host that is not what a tight loop of calls measures (a member
    blocked in a call, or idle, is woken more slowly after a kernel; on this kind of host a
    64 KiB gloo all-reduce took 0.5 ms back to back and 0.9-3 ms between 1 ms kernels)."""
    if spec.gap_gemm is None:
        return None
    m, n, k = spec.gap_gemm
    e = DTYPE_BYTES[spec.dtype]
    return Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name="bench_gemm",
              purpose=Bench(BenchRole.GAP), gemm=(1, m, n, k),
              flops=2.0 * m * n * k, mem_bytes=float((m * k + k * n + m * n) * e),
              dtype=spec.dtype)


def _transfer(ops: dict[int, list[Op]], src: int, dst: int, size: float, dtype: str,
              gap: Op | None) -> None:
    """A send (after the sender's kernel, if any) and its receive, each after its rank's
    previous op."""
    if gap is not None:
        mine = ops[src]
        ops[src].append(dataclasses.replace(gap, deps=(len(mine) - 1,) if mine else ()))
    for rank, kind, stream, peer in ((src, OpKind.SEND, Stream.SEND_NEXT, dst),
                                     (dst, OpKind.RECV, Stream.RECV_PREV, src)):
        mine = ops[rank]
        after = (len(mine) - 1,) if mine else ()
        mine.append(Op(kind=kind, stream=stream, name="bench", purpose=_CALL, peer=peer,
                       tag="act", size_bytes=size, dtype=dtype, deps=after))


def _probe(probe: Probe, ops: dict[int, list[Op]]) -> None:
    plan = build(probe.model, probe.layout())
    (mine,) = plan.ops.values()
    for out in ops.values():
        shift = len(out)
        out.extend(dataclasses.replace(op, deps=tuple(d + shift for d in op.deps))
                   for op in mine)


def sections(trace: Trace) -> list[dict[str, Any]]:
    """The bench sections of a trace's meta ([] for a trace that is not a bench)."""
    bench = trace.meta.bench
    if bench is None or not isinstance(bench.get("sections"), list):
        return []
    return [s for s in bench["sections"] if isinstance(s, dict)]
