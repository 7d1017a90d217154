"""`executor.probe.probe_links`: the link probe's calls, in order. Each timed all-reduce
follows a burst of compute, not a barrier, as a TP step issues its all-reduces between
kernels: on a time-shared host a call after compute waits for a scheduler tick far more
often than one after a barrier (docs/whatif.md, "Communication")."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from executor import probe  # noqa: E402


class _Dist:
    """Records the collectives `probe_links` calls, in order."""

    def __init__(self, calls: list[tuple[str, object]]) -> None:
        self.calls = calls

    def all_reduce(self, buffer: torch.Tensor) -> None:
        self.calls.append(("all_reduce", buffer.numel() * buffer.element_size()))

    def barrier(self) -> None:
        self.calls.append(("barrier", None))


def test_each_timed_call_follows_a_burst_of_compute(monkeypatch):
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(probe, "dist", _Dist(calls))
    monkeypatch.setattr(probe, "burst", lambda work, seconds: calls.append(("burst", seconds))
                        or work)
    out = probe.probe_links(torch.device("cpu"))
    per_size = [("burst", probe.BURST_SECONDS), None] * probe.PROBE_CALLS
    expected = []
    for size in probe.PROBE_BYTES:
        timed = [("all_reduce", size) if c is None else c for c in per_size]
        expected += [("all_reduce", size), ("barrier", None), *timed]
    assert calls == expected
    assert [size for size, _ in out] == [s for s in probe.PROBE_BYTES
                                         for _ in range(probe.PROBE_CALLS)]


def test_the_table_keeps_each_call_as_its_fastest_rank_saw_it():
    ranks = [{"links": [(4, 1e-3), (4, 4e-3)], "cpu_share": 0.5},
             {"links": [(4, 2e-3), (4, 3e-3)], "cpu_share": 1.0}]
    table = probe.probe_table(ranks, 2)
    assert table["samples"] == [[4, 1e-3], [4, 3e-3]]
    assert table["cpu_share"] == 0.75
