"""A rank's streams as the replay walks them: its ops cut into steps before the run.

    streams, kept = rank_steps(ops, duration, gaps, comm, calls, plain, shared)

The replay (`sim.engine.replay`) resumes a stream once per step, not once per op, and decides
nothing per op that it could decide before the run. A step is one of

  - `KERNEL`: one compute op (`extra` is its duration: `Durations.duration`, asked once here);
  - `RUN`: compute ops back to back that one timeout covers (`extra` their number where their
    indices follow each other, else their indices; `more` their durations, one tuple shared
    by equal runs): from the first, the ops that follow it on the stream, are compute, wait
    for nothing, have no host gap before them, and are not waited for before the last of them
    ends (nobody observes the instants in between);
  - `COMM`: one communication op (`extra` its `CommOp`, `more` its call number).

Every step is the tuple (kind, index, op, deps, gap, extra, more, flag) — one shape, so the
replay's loop unpacks it in one instruction: `index` and `op` are the step's first op,
`deps` what it waits for, `gap` the host time before it (`host_gaps`; 0 without). `flag` is,
for a kernel, whether it keeps its trace's duration (`kept`); for a run, whether it is `PLAIN`
(keeps no duration: every kernel takes the rank's one stretch) and `CONTIGUOUS` (its indices
follow each other in the rank's op list); for communication, whether the interference model
leaves it alone (`Occupancy.plain`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sim.engine.host import HostProgram
from sim.engine.lowering import CommOp
from traces.ops import Op, OpKind

KERNEL, RUN, COMM = 0, 1, 2
"""The kinds of step."""
PLAIN, CONTIGUOUS = 1, 2
"""A run's flags."""

Step = tuple[int, int, Op, tuple[int, ...], float, Any, Any, int]


def rank_steps(ops: Sequence[Op], duration: Callable[[Op], float],
               gaps: Sequence[float] | None, comm: Mapping[int, CommOp], calls: array[int],
               plain: Callable[[Op], bool], shared: dict[tuple[float, ...], tuple[float, ...]],
               host: HostProgram | None = None) -> tuple[list[list[Step]], list[bool] | None]:
    """The steps of each stream of a rank whose ops are `ops`, the streams in the order they
    first appear: `duration(op)` a kernel's seconds (asked once per kernel, in op order),
    `gaps[i]` the host gaps (None: none), `comm`/`calls` the lowering's `CommOp` and call
    number per communication op, and `plain(op)` whether a communication op's transfer needs
    no interference bookkeeping; `shared` keeps one tuple of durations per distinct run (a
    1024-GPU step's 111,168 runs have a few hundred). Also `kept[i]`: the kernels that keep
    their trace's duration, the timed ones (`op.end` set; None where none is), found in the
    same pass. One pass over the ops (~850,000 for GPT-3 on 1024 GPUs). With a `host`
    program (`sim.engine.host`), a run also ends at an op the host waits for and never spans
    a sync: its ops share one launch segment."""
    waited = {d for op in ops for d in op.deps}  # the ops some op depends on
    segment = None
    if host is not None and host.syncs:
        waited |= host.targets
        segment = host.segment
    kept: list[bool] | None = None
    streams: dict[str, list[list[Any]]] = {}  # per stream: its steps, and the run gathered
    compute = OpKind.COMPUTE
    stream: str | None = None
    steps: list[Any] = []
    run: list[int] = []  # the compute ops of the run being gathered
    seconds: list[float] = []  # their durations
    for i, op in enumerate(ops):
        if op.stream is not stream:  # (plan streams are `Stream` members: one object each)
            stream = op.stream
            state = streams.get(stream)
            if state is None:
                state = streams[stream] = [[], [], []]
            steps, run, seconds = state
        if op.kind is compute:
            if run and (op.deps or run[-1] in waited or (gaps and gaps[i]) or
                        (segment is not None and segment[i] != segment[run[0]])):
                steps.append(_close(ops, run, seconds, gaps, kept, shared))
                run.clear()
                seconds.clear()
            run.append(i)
            seconds.append(duration(op))
            if op.end is not None:  # timed: it keeps its duration
                if kept is None:
                    kept = [False] * len(ops)
                kept[i] = True
            continue
        if run:
            steps.append(_close(ops, run, seconds, gaps, kept, shared))
            run.clear()
            seconds.clear()
        steps.append((COMM, i, op, op.deps, gaps[i] if gaps else 0.0, comm[i], calls[i],
                      plain(op)))
    for steps, run, seconds in streams.values():
        if run:
            steps.append(_close(ops, run, seconds, gaps, kept, shared))
    return [state[0] for state in streams.values()], kept


def _close(ops: Sequence[Op], run: list[int], seconds: list[float],
           gaps: Sequence[float] | None, kept: Sequence[bool] | None,
           shared: dict[tuple[float, ...], tuple[float, ...]]) -> Step:
    """The step of a gathered run of compute ops (`seconds` their durations): a `KERNEL`
    when it is one op."""
    first = run[0]
    op = ops[first]
    gap = gaps[first] if gaps else 0.0
    if len(run) == 1:
        return (KERNEL, first, op, op.deps, gap, seconds[0], None, bool(kept and kept[first]))
    more = tuple(seconds)
    more = shared.setdefault(more, more)
    flag = 0 if kept and any(kept[j] for j in run) else PLAIN
    if run[-1] - first == len(run) - 1:
        return (RUN, first, op, op.deps, gap, len(run), more, flag | CONTIGUOUS)
    return (RUN, first, op, op.deps, gap, tuple(run), more, flag)
