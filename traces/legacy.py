"""Purposes for the ops of a version-1 or -2 trace file, which had only names.

    purposes = legacy_purposes(ops)     # one rank's ops, as read (traces.io calls it)

`legacy_purposes` is the one function that maps an op's name (with its kind, layer, phase and
neighbours) to a purpose, and only the loader of old files calls it: the plan builder of those
versions named its ops as docs/plan-ops.md's table still labels them. A `tp` collective's site
is the one `traces.plan.tensor.tp_sites` puts after the compute op before it, else before the
compute op after it (of the collective's kind: all-reduces are the sites without SP); a `tp`
all-gather that waits for a receive gathers that message. A name no plan wrote (an import's)
gets None.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence

from traces.bench import (
    INTERFERENCE_ALONE,
    INTERFERENCE_COLLECTIVE,
    INTERFERENCE_COLLECTIVE_ALONE,
    INTERFERENCE_OVERLAPPED,
    INTERFERENCE_SPACER,
)
from traces.kernel_groups import KERNEL_NAMES
from traces.ops import Op, OpKind, Phase
from traces.plan.tensor import tp_sites
from traces.purpose import (
    EMBED,
    HEAD,
    Bench,
    BenchRole,
    CrossEntropyStat,
    EmbeddingGrads,
    GradBucket,
    GradStat,
    Kernel,
    KernelRun,
    MessageGather,
    ParamGather,
    PipeMessage,
    Purpose,
    SpGrads,
    Stat,
    StepStat,
    Tag,
    TpSite,
    Unit,
    UnitGather,
    UnitGradReduce,
)

_BENCH = {"bench": BenchRole.CALL, "bench_gemm": BenchRole.GAP,
          INTERFERENCE_ALONE: BenchRole.PROBE_ALONE,
          INTERFERENCE_OVERLAPPED: BenchRole.PROBE_OVERLAPPED,
          INTERFERENCE_SPACER: BenchRole.SPACER,
          INTERFERENCE_COLLECTIVE: BenchRole.COLLECTIVE_BESIDE,
          INTERFERENCE_COLLECTIVE_ALONE: BenchRole.COLLECTIVE_ALONE}
_UNITS = {"embed": EMBED, "head": HEAD}
_STATS = frozenset(str(s) for s in StepStat)
_SITES = {sp: tp_sites(sp) for sp in (False, True)}


def legacy_purposes(ops: Sequence[Op]) -> list[Purpose | None]:
    """The purpose of each of one rank's ops of an old trace file (module docstring)."""
    kernels = [Kernel(op.name) if op.kind is OpKind.COMPUTE and op.name in KERNEL_NAMES
               else None for op in ops]
    compute = [i for i, op in enumerate(ops) if op.kind is OpKind.COMPUTE]
    rounds: Counter[int | None] = Counter()
    gathered = 0
    out: list[Purpose | None] = []
    for i, op in enumerate(ops):
        base, _, suffix = op.name.partition(".")
        unit = _UNITS.get(suffix) if suffix else \
            Unit.of_layer(op.layer) if op.layer is not None else None
        purpose: Purpose | None = None
        if op.name in _BENCH:
            purpose = Bench(_BENCH[op.name])
        elif kernels[i] is not None:
            purpose = KernelRun(kernels[i])  # type: ignore[arg-type]
        elif op.kind.is_p2p and op.tag in ("act", "grad") and op.layer is not None:
            into = (op.kind is OpKind.RECV) == (op.tag == "act")
            purpose = PipeMessage(Tag(op.tag), op.layer if into else op.layer + 1)
        elif not op.kind.is_collective:
            pass
        elif op.name == "tp":
            recv = next((d for d in op.deps if ops[d].kind is OpKind.RECV), None)
            message = out[recv] if recv is not None else None
            if isinstance(message, PipeMessage) and op.kind is OpKind.ALL_GATHER:
                purpose = MessageGather(message.tag, message.boundary)
            else:
                purpose = _site(op, _near(kernels, compute, i, -1), _near(kernels, compute, i, 1))
        elif op.name in ("ce_max", "ce_sum"):
            purpose = CrossEntropyStat(Stat.MAX if op.name == "ce_max" else Stat.SUM)
        elif op.name == "embedding_grads":
            purpose = EmbeddingGrads()
        elif op.name in _STATS and op.phase is Phase.OPT:
            purpose = GradStat(StepStat(op.name))
        elif base == "sp_grads" and unit is not None:
            purpose = SpGrads(unit)
        elif op.name == "grads" and op.layer is None:
            purpose = GradBucket(rounds[op.microbatch], op.microbatch or 0)
            rounds[op.microbatch] += 1
        elif base == "grads" and unit is not None:
            purpose = UnitGradReduce(unit)
        elif op.name == "params" and op.layer is None and op.phase is Phase.OPT:
            purpose = ParamGather(gathered)
            gathered += 1
        elif base == "params" and unit is not None:
            purpose = UnitGather(unit)
        out.append(purpose)
    return out


def _near(kernels: list[Kernel | None], compute: list[int], i: int, step: int) -> Kernel | None:
    """The kernel of the nearest compute op before (step -1) or after (+1) op i."""
    at = bisect_left(compute, i)
    j = at - 1 if step < 0 else at
    return kernels[compute[j]] if 0 <= j < len(compute) else None


def _site(op: Op, prev: Kernel | None, following: Kernel | None) -> TpSite | None:
    """The tp site of `op` between the kernels `prev` and `following` (module docstring)."""
    sites = _SITES[op.kind is not OpKind.ALL_REDUCE]
    backward = op.phase is Phase.BWD
    after = sites.get((prev, backward), ((), ()))[1] if prev is not None else ()
    before = sites.get((following, backward), ((), ()))[0] if following is not None else ()
    return next((s for s in (*after, *before) if s.kind is op.kind), None)
