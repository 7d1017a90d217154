"""The host thread of a rank: it launches the rank's ops in program order, one CPU cost each,
and now and then waits for the GPU (a device-to-host copy the next launches need).

    program = HostProgram.of(costs, syncs)    # per rank, before the run
    cursor = HostCursor(program)              # per rank, during the run
    at = cursor.launch(i)                     # None: a sync before op i is not resolved yet

An op cannot start on the GPU before the host has launched it. Without syncs op i is launched
at costs[0] + ... + costs[i] (the host never waits for the GPU, it runs ahead). A sync
(position p, target s, seconds d) makes the host wait, before it launches op p, until op s has
ended on the GPU, plus d (the copy and the thread waking): from then on it launches again, one
cost after another. The cursor is cheap: a prefix sum per rank and one base time per sync, so
op i's launch is `bases[k] + prefix[i]` with k the syncs before it; no event per op.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class Sync:
    """Before launching op `position` the host waits for op `target`'s end, plus `seconds`."""

    position: int
    target: int
    seconds: float


@dataclass(frozen=True)
class HostProgram:
    """One rank's launches: `prefix[i]` the host's CPU seconds through op i's launch, the
    syncs by position, and `segment[i]` how many of them come at or before op i."""

    prefix: array[float]
    syncs: tuple[Sync, ...]
    segment: array[int]

    @staticmethod
    def of(costs: Sequence[float], syncs: Sequence[Sync] = ()) -> HostProgram:
        """The program of ops whose launches cost `costs[i]` seconds, with `syncs` (any
        order; a target must come before its position: the host cannot wait for an op it has
        not launched)."""
        ordered = tuple(sorted(syncs, key=lambda s: s.position))
        for sync in ordered:
            assert 0 <= sync.target < sync.position < len(costs), sync
        segment = array("i", [0] * len(costs))
        k = 0
        for i in range(len(costs)):
            while k < len(ordered) and ordered[k].position <= i:
                k += 1
            segment[i] = k
        return HostProgram(array("d", accumulate(costs)), ordered, segment)

    @property
    def targets(self) -> frozenset[int]:
        """The ops some sync waits for."""
        return frozenset(s.target for s in self.syncs)

    @property
    def positions(self) -> array[int]:
        """The ops a sync comes before, ascending."""
        return array("i", (s.position for s in self.syncs))


class HostCursor:
    """The host thread during the run: the base time of each segment between syncs, found
    when the sync's target has ended (`resolve`)."""

    __slots__ = ("prefix", "segment", "syncs", "bases")

    def __init__(self, program: HostProgram) -> None:
        self.prefix, self.segment, self.syncs = program.prefix, program.segment, program.syncs
        self.bases = [0.0]
        """Per resolved segment k: op i of it is launched at bases[k] + prefix[i]."""

    def launch(self, i: int) -> float | None:
        """When op i is launched; None while a sync before it is unresolved (`pending`)."""
        k = self.segment[i]
        return self.bases[k] + self.prefix[i] if k < len(self.bases) else None

    def pending(self) -> int:
        """The op the first unresolved sync waits for."""
        return self.syncs[len(self.bases) - 1].target

    def resolve(self, target_end: float) -> None:
        """Resolve the first unresolved sync, its target having ended at `target_end`: the
        host, having launched the op before the sync's position, waits until then."""
        k = len(self.bases) - 1
        sync = self.syncs[k]
        before = self.prefix[sync.position - 1]
        reached = self.bases[k] + before
        self.bases.append(max(reached, target_end + sync.seconds) - before)

    def delay(self, times: list[float], run: Sequence[int]
              ) -> tuple[list[float], list[float]]:
        """A run's times (`times[n]` op run[n]'s start back to back, `times[n + 1]` its end)
        with each op started no earlier than its launch, the same durations: the starts, and
        the times as before (the first start, then each op's end). Every op of a run lies in
        one segment (the run is cut at syncs)."""
        base = self.bases[self.segment[run[0]]]
        prefix = self.prefix
        begun: list[float] = []
        out = [times[0]]
        for n, j in enumerate(run):
            start = max(out[-1], base + prefix[j])
            begun.append(start)
            out.append(start + (times[n + 1] - times[n]))
        return begun, out


__all__ = ["HostCursor", "HostProgram", "Sync"]
