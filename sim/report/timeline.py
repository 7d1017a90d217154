"""What a simulated step's timeline holds, read off the timed ops: pipeline passes, idle gaps,
per-lane busy intervals, and what overlaps what. Pure numpy; the report draws these.

    from sim.report.timeline import rank_ops, pipeline_passes, idle_intervals, lanes
    cols = rank_ops(times, rank=0)              # the rank's ops as numpy columns, read once
    passes = pipeline_passes(times, 0, cols)    # F/B per micro-batch and the optimizer step
    gaps = idle_intervals(cols, times.step_time_s)
    timed = annotate(times.timed_trace(), times, model, layout, "GPUs")  # + memory over time

A *pass* is one forward or backward of one micro-batch through one virtual stage (an action of
`traces.pipeline`), or the optimizer step, as the compute stream ran it: from its first op's
start to its last op's end. Megatron runs the tensor-parallel collectives inline on the compute
stream, so a pass holds them too (`tp_s`); a backward holds its recomputation (`recompute_s`).

A *lane* is a stream, except that the collectives on the compute stream get a lane of their own
("compute/tp"), so the compute lane holds kernels only. Ops of one lane never overlap (a stream
runs in order), so a lane's busy time is the sum of its ops' durations.

Times here are seconds; lane intervals are whole nanoseconds (int64), so that ops which touch
stay touching after rounding and sums are exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.engine.replay import StepTimes
from sim.models.memory import memory_timeline
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Stream, Trace
from traces.pipeline import Action

TP_LANE = "compute/tp"
LANE_ORDER = (str(Stream.COMPUTE), TP_LANE, *(str(s) for s in Stream if s is not Stream.COMPUTE))
"""Lanes top to bottom: kernels, inline collectives, then the plan's other streams; streams a
trace names otherwise come after these, by name."""



@dataclass(frozen=True, slots=True, kw_only=True)
class Pass:
    """One forward ("F") or backward ("B") of a micro-batch through a virtual stage, or the
    optimizer step ("O"), on one rank's compute stream."""

    rank: int
    kind: str
    stage: int | None
    """Virtual stage (chunk * pp + pipeline rank); None for the optimizer step."""
    microbatch: int | None
    start: float
    end: float
    compute_s: float
    """Kernel time, recomputation included."""
    recompute_s: float
    tp_s: float
    """Collectives run inline on the compute stream (tensor-parallel, cross-entropy)."""
    num_ops: int

    @property
    def action(self) -> Action | None:
        """The schedule action this pass ran (None for the optimizer step)."""
        if self.kind == "O" or self.stage is None or self.microbatch is None:
            return None
        return Action(self.stage, self.kind, self.microbatch)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOps:
    """One rank's timed ops as columns (read once: a 1024-GPU plan has ~50,000 ops per rank,
    and numpy over columns is ~100x faster than attribute access per op)."""

    rank: int
    starts: np.ndarray
    ends: np.ndarray
    lane: np.ndarray
    """Index into `lane_names`."""
    lane_names: tuple[str, ...]
    is_compute: np.ndarray
    on_compute_stream: np.ndarray
    phase: np.ndarray
    """-1 none, then the order of `PHASES`."""
    microbatch: np.ndarray
    """-1 for none."""
    layer: np.ndarray
    """-1 for none."""
    flops: np.ndarray


PHASES = (Phase.FWD, Phase.BWD, Phase.RECOMPUTE, Phase.OPT, Phase.WGRAD)


def rank_ops(times: StepTimes, rank: int) -> RankOps:
    ops = times.plan.ops[rank]
    classes: dict[tuple[OpKind, str, Phase | None], tuple[int, bool, bool, int]] = {}
    names: list[str] = []
    rows = []
    for op in ops:
        key = (op.kind, op.stream, op.phase)
        found = classes.get(key)
        if found is None:
            name = lane_of(op)
            if name not in names:
                names.append(name)
            found = classes[key] = (names.index(name), op.kind is OpKind.COMPUTE,
                                    op.stream == Stream.COMPUTE,
                                    -1 if op.phase is None else PHASES.index(op.phase))
        rows.append(found)
    columns = np.array(rows, dtype=np.int64).reshape(len(ops), 4)
    return RankOps(
        rank=rank, starts=np.asarray(times.starts[rank], float),
        ends=np.asarray(times.ends[rank], float), lane=columns[:, 0],
        lane_names=tuple(names), is_compute=columns[:, 1].astype(bool),
        on_compute_stream=columns[:, 2].astype(bool), phase=columns[:, 3],
        microbatch=np.array([-1 if op.microbatch is None else op.microbatch for op in ops],
                            dtype=np.int64),
        layer=np.array([-1 if op.layer is None else op.layer for op in ops], dtype=np.int64),
        flops=np.array([op.flops for op in ops], dtype=float))


def pipeline_passes(times: StepTimes, rank: int, cols: RankOps | None = None) -> list[Pass]:
    """The passes of `rank` in the order its compute stream ran them: a new pass begins where
    the (kind, micro-batch) of the compute stream's ops changes, or where, within one, the
    layers move to another virtual stage."""
    c = cols if cols is not None else rank_ops(times, rank)
    layout, model = times.plan.meta.layout, times.plan.meta.model
    # each layer's virtual stage (uneven stages too: pp_first_layers, pp_last_layers,
    # account_for_embedding / account_for_loss, pipeline_layout)
    of_layer = (np.array([k for k in range(layout.num_stages)
                          for _ in layout.layers_of_stage(model, k)], dtype=np.int64)
                if layout is not None and model is not None else None)
    idx = np.flatnonzero(c.on_compute_stream)
    if not len(idx):
        return []
    mb, phase, layer = c.microbatch[idx], c.phase[idx], c.layer[idx]
    # kind: 0 forward, 1 backward (recompute included), 2 the optimizer step and the rest,
    # 3 a split backward's weight gradients (zero-bubble W)
    kind = np.select([phase == 0, (phase == 1) | (phase == 2), phase == 4], [0, 1, 3], 2)
    kind[mb < 0] = 2
    mb = np.where(kind == 2, -1, mb)
    stage = (np.where(layer >= 0, of_layer[np.clip(layer, 0, len(of_layer) - 1)], -1)
             if of_layer is not None else np.full(len(idx), -1))
    new = np.ones(len(idx), dtype=bool)
    new[1:] = (kind[1:] != kind[:-1]) | (mb[1:] != mb[:-1])
    segment = np.cumsum(new)
    known = np.flatnonzero(stage >= 0)  # a known stage differing from the previous known one
    moved = known[1:][(segment[known[1:]] == segment[known[:-1]])
                      & (stage[known[1:]] != stage[known[:-1]])]
    new[moved] = True
    first = np.flatnonzero(new)
    starts, ends = c.starts[idx], c.ends[idx]
    dur = ends - starts
    compute = c.is_compute[idx]
    recompute = compute & (phase == 2)
    sums = [np.add.reduceat(np.where(m, dur, 0.0), first) for m in (compute, recompute, ~compute)]
    end = np.maximum.reduceat(ends, first)
    pass_stage = np.maximum.reduceat(stage, first)
    counts = np.diff(np.append(first, len(idx)))
    stages = layout.stages_of_rank(layout.coords(rank).pp) if layout is not None else None
    last = layout.num_stages - 1 if layout is not None else 0
    passes = []
    for j, i in enumerate(first):
        k = ("F", "B", "O", "W")[kind[i]]
        st: int | None = int(pass_stage[j]) if pass_stage[j] >= 0 else None
        if st is None and stages is not None and k != "O":
            st = _layerless_stage(stages, k, last)
        passes.append(Pass(rank=rank, kind=k, stage=None if k == "O" else st,
                           microbatch=None if k == "O" else int(mb[i]),
                           start=float(starts[i]), end=float(end[j]),
                           compute_s=float(sums[0][j]), recompute_s=float(sums[1][j]),
                           tp_s=float(sums[2][j]), num_ops=int(counts[j])))
    return passes


# --- intervals ----------------------------------------------------------------------------------

def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [starts[i], ends[i]) as sorted, disjoint intervals (touching
    ones merged)."""
    if not len(starts):
        return np.empty(0, starts.dtype), np.empty(0, ends.dtype)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # a new piece begins where an interval starts after everything before it has ended
    new = np.concatenate(([True], s[1:] > reach[:-1]))
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:] - 1, [len(s) - 1]))
    return s[first], reach[last]


def idle_intervals(cols: RankOps, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Gaps in [0, step] where no op of the rank runs: the pipeline bubble and every other
    wait. Their total is `sim.metrics.RankTime.idle_s`."""
    s, e = union(cols.starts, cols.ends)
    edges_s = np.concatenate(([0.0], e))
    edges_e = np.concatenate((s, [step_s]))
    keep = edges_e > edges_s
    return edges_s[keep], edges_e[keep]


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two sets of sorted, disjoint intervals."""
    a_s, a_e = a
    return float(np.sum(busy_between(b[0], b[1], a_s, a_e)))


def busy_between(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray) -> np.ndarray:
    """For sorted, disjoint intervals, the busy time inside each window [lo[k], hi[k]]:
    B(hi) - B(lo), where B(t) is the busy time before t."""
    if not len(starts):
        return np.zeros(len(lo), dtype=np.result_type(lo, float))
    cum = np.concatenate(([0], np.cumsum(ends - starts)))
    last = len(starts) - 1

    def before(t: np.ndarray) -> np.ndarray:
        # the intervals ending by t, plus the part before t of the one after them (which ends
        # after t, so that part is shorter than the interval)
        i = np.searchsorted(ends, t, side="right")
        inside = np.clip(t - starts[np.minimum(i, last)], 0, None)
        return cum[i] + np.where(i <= last, inside, 0)

    return before(np.asarray(hi)) - before(np.asarray(lo))


# --- lanes --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Lane:
    """One lane of one rank: its ops' intervals in whole nanoseconds, sorted and disjoint.
    The compute lane joins kernels that touch (one interval per uninterrupted run); the other
    lanes keep one interval per op, with the op's index in the rank's list."""

    rank: int
    name: str
    starts_ns: np.ndarray
    ends_ns: np.ndarray
    ops: np.ndarray
    """Communication lanes: each interval's op index; the compute lane: its first op's."""
    num_ops: int

    @property
    def busy_s(self) -> float:
        return float(np.sum(self.ends_ns - self.starts_ns)) / 1e9


def lane_of(op: Op) -> str:
    return TP_LANE if op.inline else str(op.stream)


def lanes(cols: RankOps) -> list[Lane]:
    """The lanes of the rank in LANE_ORDER (then other streams by name)."""
    s_ns = np.rint(cols.starts * 1e9).astype(np.int64)
    e_ns = np.rint(cols.ends * 1e9).astype(np.int64)
    out = []
    for code, name in sorted(enumerate(cols.lane_names), key=lambda c: lane_key(c[1])):
        idx = np.flatnonzero(cols.lane == code)
        starts, ends, members = s_ns[idx], e_ns[idx], idx
        if name == Stream.COMPUTE:
            # join kernels that touch: a new run starts where a kernel starts after the last end
            new = np.concatenate(([True], starts[1:] > ends[:-1]))
            first = np.flatnonzero(new)
            last = np.concatenate((first[1:] - 1, [len(idx) - 1]))
            starts, ends, members = starts[first], ends[last], idx[first]
        out.append(Lane(rank=cols.rank, name=name, starts_ns=starts, ends_ns=ends,
                        ops=members, num_ops=len(idx)))
    return out


def lane_key(name: str) -> tuple[int, str]:
    return (LANE_ORDER.index(name), "") if name in LANE_ORDER else (len(LANE_ORDER), name)


# --- per stream: busy, overlapped with compute, exposed -----------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class LaneUsage:
    """Seconds a lane is busy on one rank, and how much of that overlaps the kernels."""

    name: str
    busy_s: float
    overlapped_s: float
    """Busy while some kernel runs on the rank (hidden behind compute)."""

    @property
    def exposed_s(self) -> float:
        return self.busy_s - self.overlapped_s


def lane_usage(rank_lanes: Sequence[Lane]) -> list[LaneUsage]:
    """Per lane of one rank: busy, overlapped with the compute lane, exposed."""
    compute = next((lane for lane in rank_lanes if lane.name == Stream.COMPUTE), None)
    kernels = (compute.starts_ns.astype(float), compute.ends_ns.astype(float)) if compute \
        else (np.empty(0), np.empty(0))
    out = []
    for lane in rank_lanes:
        mine = (lane.starts_ns.astype(float), lane.ends_ns.astype(float))
        shared = lane.busy_s if lane is compute else overlap(mine, kernels) / 1e9
        out.append(LaneUsage(name=lane.name, busy_s=lane.busy_s, overlapped_s=shared))
    return out


def present_pp_ranks(times: StepTimes) -> dict[int, int]:
    """Pipeline rank -> the plan rank shown for it: every rank of a folded plan, else the
    lowest rank present of each pipeline rank (rank 0 alone without a layout)."""
    layout = times.plan.meta.layout
    if layout is None:
        return {0: times.plan.ranks[0]}
    lowest: dict[int, int] = {}
    for rank in times.plan.ranks:  # ascending: the first seen per stage is the lowest
        lowest.setdefault(layout.coords(rank).pp, rank)
    return dict(sorted(lowest.items()))


def stands_for(times: StepTimes) -> int:
    """Devices each rank of the plan stands for: tp * dp when folded, tp * dp * cp / step
    folded over CP too (`traces.cp_fold`), else 1."""
    fold = times.plan.meta.fold
    if times.fold is not None and times.fold.cp_step:
        f = times.fold.layout
        return f.tp * f.dp * (f.cp // times.fold.cp_step)
    return fold.tp * fold.dp if fold is not None else 1


def timed_actions(passes: Iterable[Pass]) -> list[tuple[Action, float, float]]:
    """(action, start, end) of the F and B passes, for `sim.models.memory.memory_timeline`;
    an action run in pieces (overlap_moe_comm merges a forward with a backward) once, from
    its first piece's start to its last's end, in the order the actions began; but of a
    backward and a forward that overlap, the forward first and the backward at the pair's
    end, so the curve holds both micro-batches' activations until the pair ends."""
    spans: dict[Action, tuple[float, float]] = {}
    for p in passes:
        if (a := p.action) is not None:
            start, end = spans.get(a, (p.start, p.end))
            spans[a] = (min(start, p.start), max(end, p.end))
    out = sorted(((a, start, end) for a, (start, end) in spans.items()), key=lambda t: t[1])
    for i in range(1, len(out)):
        (b, _, b_end), (f, f_start, f_end) = out[i - 1], out[i]
        if b.kind == "B" and f.kind == "F" and f_start < b_end:
            last = max(b_end, f_end)
            out[i - 1], out[i] = (f, f_start, f_end), (b, last, last)
    return out


def annotate(trace: Trace, times: StepTimes, model: ModelSpec, layout: Layout,
             devices: str, nvlink_domain: int | None = None, non_tn: bool = False) -> Trace:
    """`trace` (the timed trace of `times`) with what its Chrome export shows beyond the ops:
    meta `memory`, each rank's bytes over the step from `sim.models.memory.memory_timeline` at the
    simulated pass times (`nvlink_domain`: GPUs per NVLink domain, for HybridEP's buffers;
    `non_tn`: Blackwell's FP8 GEMM layouts, for TE's cached FP8 weights), and
    meta `devices`, the word for the devices ("GPUs", "chips")."""
    memory = {}
    for rank in times.plan.ranks:
        passes = pipeline_passes(times, rank)
        points = memory_timeline(model, layout, layout.coords(rank).pp, timed_actions(passes),
                                 nvlink_domain, non_tn)
        # a later point at the same time supersedes an earlier one on a step curve
        memory[rank] = tuple((t, b) for (t, b), nxt in zip(points, [*points[1:], None])
                             if nxt is None or nxt[0] != t)
    return Trace(trace.ops, replace(trace.meta, memory=memory, devices=devices))


def _layerless_stage(stages: list[int], kind: str, last: int) -> int:
    """The stage of a pass without layers: the embedding's (stage 0) or the output layer's
    (the last stage) where the rank holds it, that one; else the rank's first stage forward
    and its last backward (where their layers' ops would have placed them)."""
    ends = [k for k in (0, last) if k in stages]
    if len(ends) == 1:
        return ends[0]
    return stages[0] if kind == "F" else stages[-1]
