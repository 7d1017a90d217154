"""Pipeline schedules as per-rank lists of small actions, with a text form and a validator.

An `Action` is (virtual stage, F or B, micro-batch) and prints as `2F0` or `1B3`. A schedule is
`dict[pipeline rank, list[Action]]`: the order in which each rank runs its forward and backward
passes. Generators here emit compute actions only; `traces.plan` lowers them (layers,
tensor-parallel collectives, sends and receives, gradient reduction) into the plan trace.

    gpipe        all forwards, then all backwards (Huang et al., 2019)
    1f1b         pp - rank - 1 warm-up forwards, then one forward one backward (PipeDream-Flush)
    interleaved  Megatron-LM's interleaved 1F1B over vp model chunks per rank
    zb1p         zero-bubble ZB-1P, the backward split into B and W (`traces.zero_bubble`)
    dualpipev    PyTorch's ScheduleDualPipeV on zbv's V (`traces.dualpipev_order`)
    dualpipe     deepseek-ai/DualPipe's two copies (`traces.dualpipe_order`), by model stage
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from traces.dualpipe_order import dualpipe_model_order
from traces.dualpipev_order import dualpipev_order
from traces.errors import ConfigError
from traces.layout import Layout
from traces.schedule_rules import V_SHAPED, rank_stages
from traces.zero_bubble_order import zb1p_order, zbv_order

_ACTION = re.compile(r"^(\d+)([FBW])(\d+)$")


@dataclass(frozen=True, slots=True)
class Action:
    stage: int
    """Virtual stage: chunk * pp + pipeline rank."""
    kind: Literal["F", "B", "W"]
    """F forward; B backward (with a split backward, its input gradients only); W the
    weight gradients of a split backward (`traces.zero_bubble`)."""
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action:
        match = _ACTION.match(text.strip())
        if not match:
            raise ConfigError(f"schedule: {text!r} is not an action (write e.g. 2F0 or 1B3)")
        return Action(int(match[1]), match[2], int(match[3]))  # type: ignore[arg-type]


ActionSchedule = dict[int, list[Action]]
"""Per pipeline rank, its actions in run order (the schedule's *name* is `layout.Schedule`)."""
KINDS: tuple[Literal["F", "B"], ...] = ("F", "B")


def gpipe(pp: int, m: int) -> ActionSchedule:
    return {r: [Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)]
            for r in range(pp)}


def one_f_one_b(pp: int, m: int, extra: int = 0) -> ActionSchedule:
    """`extra` more warm-up forwards per rank (see `interleaved`)."""
    schedule = {}
    for r in range(pp):
        warmup = min(pp - r - 1 + extra, m)
        actions = [Action(r, "F", i) for i in range(warmup)]
        for i in range(m - warmup):
            actions += [Action(r, "F", warmup + i), Action(r, "B", i)]
        actions += [Action(r, "B", i) for i in range(m - warmup, m)]
        schedule[r] = actions
    return schedule


def interleaved(pp: int, vp: int, m: int, extra: int = 0) -> ActionSchedule:
    """Megatron-LM's interleaved 1F1B; m must be a multiple of pp; `extra` more warm-up
    forwards per rank (1 with overlap_moe_comm: `traces.moe_overlap`).

    Micro-batches go through the chunks in groups of pp: forward k runs chunk (k // pp) % vp on
    micro-batch (k // (pp * vp)) * pp + k % pp; backward k the same with chunks in reverse.
    Rank r warms up with 2(pp - r - 1) + (vp - 1) pp forwards, all of them only where that
    reaches m·vp: Megatron-Core's forward_backward_pipelining_with_interleaving as it stands
    (schedules.py, NVIDIA/Megatron-LM main of 2025, with microbatch_group_size_per_vp_stage at
    its default pp; older releases ran every forward first whenever m == pp), and PyTorch's
    ScheduleInterleaved1F1B warms up the same way.
    """
    assert m % pp == 0, "interleaved 1F1B needs m divisible by pp"
    total = m * vp

    def order(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // pp) % vp
        return (vp - 1 - chunk if backward else chunk), (k // (pp * vp)) * pp + k % pp

    schedule = {}
    for r in range(pp):
        warmup = min(2 * (pp - r - 1) + (vp - 1) * pp + extra, total)

        def act(k: int, kind: Literal["F", "B"], r: int = r) -> Action:
            chunk, mb = order(k, kind == "B")
            return Action(chunk * pp + r, kind, mb)

        actions = [act(k, "F") for k in range(warmup)]
        for i in range(total - warmup):
            actions += [act(warmup + i, "F"), act(i, "B")]
        actions += [act(k, "B") for k in range(total - warmup, total)]
        schedule[r] = actions
    return schedule


def build_schedule(name: str, pp: int, m: int, vp: int = 1, extra: int = 0) -> ActionSchedule:
    """The named schedule, validated (`extra`: 1F1B's and `interleaved`'s)."""
    if name == "gpipe":
        schedule = gpipe(pp, m)
    elif name == "1f1b":
        schedule = one_f_one_b(pp, m, extra)
    elif name == "interleaved":
        schedule = interleaved(pp, vp, m, extra)
    elif name in ("zb1p", "zbv", "dualpipev"):
        order = (zb1p_order(pp, m, vp) if name == "zb1p" else zbv_order(pp, m)
                 if name == "zbv" else dualpipev_order(pp, m))
        schedule = {r: [Action(*step) for step in steps] for r, steps in order.items()}
    elif name == "dualpipe":  # model stages, the micro-batch naming the copy
        schedule = {r: [Action(*step) for step in steps]
                    for r, steps in dualpipe_model_order(pp, m).items()}
        validate(schedule, pp, m, dualpipe=True)
        return schedule
    else:
        raise ConfigError(f"parallel.schedule: {name!r} is not gpipe, 1f1b, interleaved, zb1p, "
                          "zbv, dualpipev or dualpipe")
    validate(schedule, pp, m, vp, v_shape=name in V_SHAPED)
    return schedule


def layout_schedule(layout: Layout) -> ActionSchedule:
    """The layout's own schedule, validated: what the plan builder and the memory model run."""
    return build_schedule(layout.schedule, layout.pp, layout.num_microbatches, layout.vp,
                          int(layout.overlap_moe_comm))


def format_schedule(schedule: ActionSchedule, mark: tuple[int, int] | None = None) -> str:
    """One line per rank; `mark` = (rank, step) is shown in brackets."""
    lines = []
    for r in sorted(schedule):
        cells = [f"[{a}]" if mark == (r, i) else str(a) for i, a in enumerate(schedule[r])]
        lines.append(f"rank {r}: " + " ".join(cells))
    return "\n".join(lines)


def validate(schedule: ActionSchedule, pp: int, m: int, vp: int = 1, v_shape: bool = False,
             dualpipe: bool = False) -> None:
    """Every (stage, micro-batch) forward and backward exactly once, on the stage's rank, and
    the whole schedule runs to the end when every pass waits for its inputs (no deadlock).
    `dualpipe`: model stages r (the first m/2 micro-batches) and pp - 1 - r (the rest) on
    rank r (`traces.dualpipe_order.dualpipe_model_order`)."""
    for r in range(pp):
        actions = schedule.get(r, [])
        kinds: tuple[Literal["F", "B", "W"], ...] = \
            (*KINDS, "W") if any(a.kind == "W" for a in actions) else KINDS
        stages = rank_stages("zbv" if v_shape else "", pp, vp, r)  # zbv, dualpipev: a V
        halves = [range(m // 2), range(m // 2, m)] if dualpipe else [range(m)] * len(stages)
        if dualpipe:
            stages = [r, pp - 1 - r]
        expected = {Action(s, k, i) for s, mbs in zip(stages, halves, strict=True)
                    for k in kinds for i in mbs}
        if sorted(map(str, actions)) != sorted(map(str, expected)):
            missing = sorted(map(str, expected - set(actions)))[:4]
            raise ConfigError(f"schedule: rank {r} must run each of its stages' F and B "
                              f"(and W) once per micro-batch (missing e.g. {missing})\n"
                              + format_schedule(schedule))
    _check_runs_to_completion(schedule, pp * vp)


def _check_runs_to_completion(schedule: ActionSchedule, num_stages: int) -> None:
    """Step the ranks in lock-step rounds; each runs its next action once its inputs exist."""
    done: set[tuple[int, str, int]] = set()
    cursor = {r: 0 for r in schedule}
    while any(cursor[r] < len(schedule[r]) for r in schedule):
        ready = []
        for r, actions in schedule.items():
            if cursor[r] == len(actions):
                continue
            a = actions[cursor[r]]
            if a.kind == "F":
                need = [(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
            elif a.kind == "W":
                need = [(a.stage, "B", a.microbatch)]
            else:
                need = [(a.stage, "F", a.microbatch)]
                if a.stage < num_stages - 1:
                    need.append((a.stage + 1, "B", a.microbatch))
            if all(n in done for n in need):
                ready.append((r, a))
        if not ready:
            r = min(r for r in schedule if cursor[r] < len(schedule[r]))
            raise ConfigError("schedule: deadlock, no rank can run its next action\n"
                              + format_schedule(schedule, mark=(r, cursor[r])))
        for r, a in ready:
            done.add((a.stage, a.kind, a.microbatch))
            cursor[r] += 1
