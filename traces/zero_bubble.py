"""Zero-bubble pipeline schedules: the backward split into B (input gradients) and W (weight
gradients), W deferred to fill the bubbles (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024).

    zb1p  ZB-1P as PyTorch's torch.distributed.pipelining orders it: ScheduleInterleavedZeroBubble
          (torch/distributed/pipelining/schedules.py, `_get_1f1b_rank_ops` with
          enable_zero_bubble, torch 2.13.0, git cf30153c4c131c8164ee7798e5022d810682e2cb),
          over vp >= 1 chunks per rank.
    zbv   ZB-V as ScheduleZBVZeroBubble orders it (same file and version): two chunks per
          rank in a V, rank r running stages r and 2 pp - 1 - r (`traces.schedule_rules`).
    dualpipev  DualPipeV as ScheduleDualPipeV orders it (same file and version): zbv's V, its
          full backwards as a B and its W at once, its overlapped pairs one after the other
          (`traces.dualpipev_order`).

The orders themselves, as rules, are `traces.zero_bubble_order`'s.

A W op carries the weight-gradient GEMMs (dB = Aᵀ·dC) of its stage's layers and the embedding's
weight gradient; B the input-gradient GEMMs and every other backward kernel (`split_backward`).
A micro-batch's stored activations stay alive until its W (PyTorch's stage_backward_input
keeps the stage's graph for stage_backward_weight): `frees_at`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from traces.errors import ConfigError
from traces.kernel_work import KernelWork
from traces.ops import Phase
from traces.pipeline import Action, ActionSchedule
from traces.purpose import Kernel
from traces.zero_bubble_order import zb1p_order

K = Kernel
WEIGHT_GEMMS = frozenset({K.QKV, K.MLA_DOWN, K.Q_UP, K.KV_UP, K.PROJ, K.FC1, K.FC2, K.ROUTER,
                          K.EXPERT_FC1, K.EXPERT_FC2, K.LOGITS})
"""Kernels whose backward is two GEMMs, dA = dC·Bᵀ (in B) and dB = Aᵀ·dC (in W)."""
WEIGHT_ONLY = frozenset({K.EMBED, K.POS_EMBED})
"""Kernels whose backward is a weight gradient only (the lookup's scatter-add): all in W."""
SPLIT_SCHEDULES = frozenset({"zb1p", "zbv", "dualpipev", "dualpipe"})


def zb1p(pp: int, m: int, vp: int = 1) -> ActionSchedule:
    """ZB-1P in the order of PyTorch's ScheduleInterleavedZeroBubble (see the module
    docstring and `traces.zero_bubble_order`); m must be a multiple of max(1, m // pp)."""
    return {r: [Action(*step) for step in steps] for r, steps in zb1p_order(pp, m, vp).items()}


def splits_backward(schedule: str) -> bool:
    """Whether the named schedule runs B and W apart."""
    return str(schedule) in SPLIT_SCHEDULES


def frees_at(actions: Sequence[Action]) -> str:
    """The action kind that frees a micro-batch's stored activations: W where the list has
    W's (the graph stays for the weight gradients), else B."""
    return "W" if any(a.kind == "W" for a in actions) else "B"


def makespan(schedule: ActionSchedule, times: dict[str, float],
             ends: tuple[frozenset[int], frozenset[int]] | None = None,
             groups: dict[int, list[tuple[int, ...]]] | None = None) -> float:
    """The step's length when each action of kind k takes times[k], a forward waits for the
    previous stage's forward, a B for the next stage's B (and its own forward), a W for its
    B, and communication is free: the ideal pipeline the bubble formulas describe. `ends`:
    the stages micro-batches enter and leave at (default: the first and the last; DualPipe's
    two directions: `traces.dualpipe_order`); `groups`: per rank, indices of actions that run
    as one overlapped step taking times["FB"] (DualPipe's F&B), once all their inputs exist."""
    return max(idle_and_end(schedule, times, ends, groups)[1].values())


def idle_and_end(schedule: ActionSchedule, times: dict[str, float],
                 ends: tuple[frozenset[int], frozenset[int]] | None = None,
                 groups: dict[int, list[tuple[int, ...]]] | None = None
                 ) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank, its busy time and its end under `makespan`'s rules."""
    num_stages = 1 + max(a.stage for actions in schedule.values() for a in actions)
    first, last = ends or (frozenset({0}), frozenset({num_stages - 1}))
    steps = {r: _steps(actions, (groups or {}).get(r, [])) for r, actions in schedule.items()}
    end: dict[tuple[int, str, int], float] = {}
    clock = dict.fromkeys(schedule, 0.0)
    busy = dict.fromkeys(schedule, 0.0)
    cursor = dict.fromkeys(schedule, 0)
    while any(cursor[r] < len(steps[r]) for r in schedule):
        moved = False
        for r, rank_steps in steps.items():
            while cursor[r] < len(rank_steps):
                step = rank_steps[cursor[r]]
                made = {(a.stage, a.kind, a.microbatch) for a in step}
                need = [n for a in step for n in _needs(a, first, last) if n not in made]
                if not all(n in end for n in need):
                    break
                took = times["FB"] if len(step) > 1 else times[step[0].kind]
                clock[r] = max([clock[r], *(end[n] for n in need)]) + took
                busy[r] += took
                end.update(dict.fromkeys(made, clock[r]))
                cursor[r] += 1
                moved = True
        if not moved:
            raise ConfigError("schedule: deadlock, no rank can run its next action")
    return busy, clock


def _steps(actions: Sequence[Action], groups: list[tuple[int, ...]]) -> list[list[Action]]:
    """The actions as the steps a rank runs: a group, or one action alone."""
    at = {g[0]: g for g in groups}
    out: list[list[Action]] = []
    i = 0
    while i < len(actions):
        g = at.get(i, (i,))
        out.append([actions[j] for j in g])
        i = g[-1] + 1
    return out


def _needs(a: Action, first: frozenset[int], last: frozenset[int]
           ) -> list[tuple[int, str, int]]:
    """What action `a` waits for (the rule `traces.pipeline.validate` checks)."""
    if a.kind == "F":
        return [(a.stage - 1, "F", a.microbatch)] if a.stage not in first else []
    if a.kind == "W":
        return [(a.stage, "B", a.microbatch)]
    need = [(a.stage, "F", a.microbatch)]
    if a.stage not in last:
        need.append((a.stage + 1, "B", a.microbatch))
    return need


def split_backward(run: Sequence[tuple[KernelWork, Phase]]
                   ) -> tuple[list[tuple[KernelWork, Phase]], list[tuple[KernelWork, Phase]]]:
    """A backward run (kernels in backward order) as B's and W's kernels: a weight GEMM's
    dA = dC·Bᵀ stays in B (the forward's FLOPs, and its bytes: it reads dC and B and writes
    dA, the element counts of the forward's A, B, C), its dB = Aᵀ·dC (the rest of the
    backward's FLOPs and bytes) goes to W in phase wgrad; a weight-only backward (the
    embedding's scatter-add) goes to W whole; every other kernel stays in B."""
    b: list[tuple[KernelWork, Phase]] = []
    w: list[tuple[KernelWork, Phase]] = []
    for k, phase in run:
        if phase is not Phase.BWD or k.name not in WEIGHT_GEMMS | WEIGHT_ONLY:
            b.append((k, phase))
        elif k.name in WEIGHT_ONLY:
            w.append((k, Phase.WGRAD))
        else:
            b.append((replace(k, bwd_flops=k.flops, bwd_bytes=k.mem_bytes), phase))
            w.append((replace(k, bwd_flops=k.bwd_flops - k.flops,
                              bwd_bytes=k.bwd_bytes - k.mem_bytes, bwd_draws=0.0), Phase.WGRAD))
    return b, w
