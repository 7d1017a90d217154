"""The rules a layout must meet for its pipeline schedule, and where the schedule puts each
virtual stage: stage k on pipeline rank k % pp as its chunk k // pp, but under zbv (two chunks
in a V, PyTorch's generate_stage_to_rank_mapping style "v") rank r runs stages r and
2 pp - 1 - r (so too under dualpipev: `V_SHAPED`); under dualpipe rank r holds model stage r
of the first copy and pp - 1 - r of the second (`traces.dualpipe_order`), a micro-batch's
copy naming the rank that runs a stage (`dualpipe_rank`). Apart from `traces.layout` so that it
stays within its size; it reads a layout through `_Parallel` (no import of it)."""

from __future__ import annotations

from typing import Protocol

from traces.errors import ConfigError

V_SHAPED = frozenset({"zbv", "dualpipev"})
"""Schedules with two chunks per rank in a V (PyTorch's stage-to-rank style "v")."""


class _Parallel(Protocol):
    @property
    def num_microbatches(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def pp(self) -> int: ...
    @property
    def vp(self) -> int: ...
    @property
    def zero(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def tp_comm_overlap(self) -> bool: ...
    @property
    def pp_first_layers(self) -> int: ...
    @property
    def pp_last_layers(self) -> int: ...
    @property
    def account_for_embedding(self) -> bool: ...
    @property
    def account_for_loss(self) -> bool: ...
    @property
    def pipeline_layout(self) -> str: ...


def rank_stages(schedule: str, pp: int, vp: int, pp_rank: int) -> list[int]:
    """Virtual stages of pipeline rank `pp_rank`, chunk by chunk."""
    if schedule in V_SHAPED:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    if schedule == "dualpipe":  # by phase: the pair (r, pp - 1 - r) in one order
        return sorted((pp_rank, pp - 1 - pp_rank))
    return [chunk * pp + pp_rank for chunk in range(vp)]


def stage_rank(schedule: str, pp: int, stage: int) -> int:
    """The pipeline rank that runs virtual stage `stage` (dualpipe: of the first copy)."""
    if schedule in V_SHAPED and stage >= pp:
        return 2 * pp - 1 - stage
    return stage % pp


def model_copies(schedule: str) -> int:
    """Copies of the model a pipeline holds: DualPipe's two (deepseek-ai/DualPipe), else one."""
    return 2 if schedule == "dualpipe" else 1


def holders(schedule: str, pp: int, pp_rank: int) -> tuple[int, ...]:
    """The pipeline ranks holding the parameters of `pp_rank`'s stages: DualPipe's pair
    (r, pp - 1 - r), whose gradients are summed (deepseek-ai/DualPipe's
    examples/example_dualpipe.py adds rank pp - 1 - r's gradient of the other copy to rank
    r's, commit 7cb1e5e6); else the rank alone."""
    if schedule != "dualpipe":
        return (pp_rank,)
    return tuple(sorted({pp_rank, pp - 1 - pp_rank}))


def dualpipe_rank(pp: int, m: int, stage: int, microbatch: int) -> int:
    """Under dualpipe, the pipeline rank running model stage `stage` for `microbatch`:
    the first copy's (direction 0, micro-batches 0 .. m/2 - 1) on rank `stage`, the
    second's on rank pp - 1 - stage."""
    return stage if microbatch < m // 2 else pp - 1 - stage


def check_schedule(layout: _Parallel) -> None:
    """The schedule's own rules (`vp`, micro-batch counts), one line each."""
    m, schedule = layout.num_microbatches, str(layout.schedule)
    if schedule == "interleaved":
        if layout.vp < 2:
            raise ConfigError(f"parallel.vp: {layout.vp}; the interleaved schedule needs "
                              "vp >= 2 virtual stages per rank")
        if layout.pp < 2:
            raise ConfigError(f"parallel.pp: {layout.pp}; the interleaved schedule needs "
                              "pp >= 2 pipeline ranks")
        if m < layout.pp:
            raise ConfigError(f"parallel: {m} micro-batches are fewer than pp = {layout.pp}; "
                              "interleaved 1F1B needs at least one per stage")
        if m % layout.pp:
            raise ConfigError(f"parallel: {m} micro-batches are not divisible by "
                              f"pp = {layout.pp}, as Megatron-LM's interleaved schedule needs")
    elif schedule in ("zb1p", "zbv", "dualpipev"):
        check_zero_bubble(layout)
    elif schedule == "dualpipe":
        check_dualpipe(layout)
    elif layout.vp != 1:
        raise ConfigError(f"parallel.vp: {layout.vp} > 1 needs schedule = \"interleaved\", "
                          f"not {schedule!r}")


def check_zero_bubble(layout: _Parallel) -> None:
    """zb1p: the micro-batch count PyTorch's ScheduleInterleavedZeroBubble accepts (a multiple
    of max(1, m // pp) rounds); zbv: exactly two chunks per rank (ScheduleZBVZeroBubble) and
    an even split (the uneven ones place layers by rank, not by V); dualpipev: the same, and at
    least 2 pp micro-batches (ScheduleDualPipeV); all: no ZeRO-3 (it frees
    a unit's parameters after its backward, which the deferred W still needs), no
    tp_comm_overlap (its chunked GEMMs run both gradients as one)."""
    m, pp, schedule = layout.num_microbatches, layout.pp, str(layout.schedule)
    rounds = max(1, m // pp)
    if schedule == "zb1p" and m % rounds:
        raise ConfigError(f"parallel: {m} micro-batches are not a multiple of max(1, m // pp) "
                          f"= {rounds} rounds, as zb1p (PyTorch's ScheduleInterleavedZeroBubble) "
                          "needs")
    if schedule in V_SHAPED and layout.vp != 2:
        source = "ScheduleZBVZeroBubble" if schedule == "zbv" else "ScheduleDualPipeV"
        raise ConfigError(f"parallel.vp: {layout.vp}; {schedule} (PyTorch's {source}) "
                          "needs exactly vp = 2 chunks per rank")
    if schedule == "dualpipev" and m < 2 * pp:
        raise ConfigError(f"parallel: {m} micro-batches are fewer than 2 pp = {2 * pp}, as "
                          "dualpipev (PyTorch's ScheduleDualPipeV) needs")
    if schedule in V_SHAPED and (layout.pp_first_layers or layout.pp_last_layers
                              or layout.account_for_embedding or layout.account_for_loss
                              or (layout.pipeline_layout and schedule == "zbv")):
        also = "" if schedule == "dualpipev" else " or pipeline_layout"
        raise ConfigError(f"parallel.schedule: \"{schedule}\" places its stages in a V; it "
                          f"needs an even split (no pp_first_layers, pp_last_layers, "
                          f"account_for_*{also}; dualpipev takes a pipeline_layout, its "
                          "virtual stages in order)")
    if layout.zero == 3 and layout.dp * layout.cp > 1:
        raise ConfigError(f"parallel.zero: 3 with schedule = \"{schedule}\"; ZeRO-3 frees a "
                          "unit's parameters after its backward, and the deferred W needs them")
    if layout.tp_comm_overlap:
        raise ConfigError(f"parallel.tp_comm_overlap: true with schedule = \"{schedule}\"; the "
                          "overlapped GEMM chunks run both gradients as one")


def check_dualpipe(layout: _Parallel) -> None:
    """DeepSeek's two-copy DualPipe (`traces.dualpipe_order`): deepseek-ai/DualPipe's asserts
    (pp even, an even number of micro-batches, at least 2 pp), one chunk per rank as written
    (the second copy is the schedule's own), no ZeRO-3 and no tp_comm_overlap (its W
    deferred, as the zero-bubble schedules)."""
    m, pp = layout.num_microbatches, layout.pp
    if pp % 2:
        raise ConfigError(f"parallel.pp: {pp}; dualpipe (deepseek-ai/DualPipe) needs an even "
                          "number of pipeline ranks")
    if m % 2 or m < 2 * pp:
        raise ConfigError(f"parallel: {m} micro-batches; dualpipe (deepseek-ai/DualPipe) "
                          f"needs an even number, at least 2 pp = {2 * pp}")
    if layout.vp != 1:
        raise ConfigError(f"parallel.vp: {layout.vp}; dualpipe holds two copies of one "
                          "stage per rank by itself: write vp = 1")
    if layout.pp_first_layers or layout.pp_last_layers or layout.account_for_embedding \
            or layout.account_for_loss:
        raise ConfigError("parallel.schedule: \"dualpipe\" needs an even split or a "
                          "pipeline_layout (no pp_first_layers, pp_last_layers or "
                          "account_for_*)")
    if layout.zero == 3:  # the pair's two copies hold each stage's parameters (`holders`)
        raise ConfigError("parallel.zero: 3 with schedule = \"dualpipe\"; ZeRO-3 frees a "
                          "unit's parameters after its backward, and the deferred W needs them")
    if layout.tp_comm_overlap:
        raise ConfigError("parallel.tp_comm_overlap: true with schedule = \"dualpipe\"; the "
                          "overlapped GEMM chunks run both gradients as one")
