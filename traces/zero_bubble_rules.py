"""The rules a layout must meet for a zero-bubble schedule (`traces.zero_bubble`), apart from
the schedule itself so that `traces.layout` can check them without building it."""

from __future__ import annotations

from typing import Protocol

from traces.errors import ConfigError


class _Parallel(Protocol):
    @property
    def num_microbatches(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def zero(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def tp_comm_overlap(self) -> bool: ...


def check_zero_bubble(layout: _Parallel) -> None:
    """zb1p: the micro-batch count PyTorch's ScheduleInterleavedZeroBubble accepts (a multiple
    of max(1, m // pp) rounds); no ZeRO-3 (it frees a unit's parameters after its backward,
    which the deferred W still needs); no tp_comm_overlap (its chunked GEMMs run dA and dB
    as one)."""
    m, pp = layout.num_microbatches, layout.pp
    rounds = max(1, m // pp)
    if m % rounds:
        raise ConfigError(f"parallel: {m} micro-batches are not a multiple of max(1, m // pp) "
                          f"= {rounds} rounds, as zb1p (PyTorch's ScheduleInterleavedZeroBubble) "
                          "needs")
    if layout.zero == 3 and layout.dp * layout.cp > 1:
        raise ConfigError("parallel.zero: 3 with schedule = \"zb1p\"; ZeRO-3 frees a unit's "
                          "parameters after its backward, and the deferred W needs them")
    if layout.tp_comm_overlap:
        raise ConfigError("parallel.tp_comm_overlap: true with schedule = \"zb1p\"; the "
                          "overlapped GEMM chunks run both gradients as one")
