"""Words the report uses for devices and rows, following the cluster and the folding.

A folded plan simulates one rank per pipeline stage standing for its tp * dp peers; every row
drawn for such a rank says how many devices it stands for. Devices are "chips" on a torus (TPU
pods) and "GPUs" elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import Experiment
from sim.engine.replay import StepTimes
from sim.report.timeline import stands_for
from traces.layout import Layout


@dataclass(frozen=True, slots=True, kw_only=True)
class Words:
    device: str
    """"GPU" or "chip"."""
    devices: str
    """"GPUs" or "chips"."""
    stands_for: int
    """Devices each simulated rank stands for (1 when not folded)."""
    fold: str
    """How a folded rank's devices are made: "tp 8 × dp 8"; empty when not folded."""
    layout: Layout | None
    stage_devices: int = 0
    """Devices of a pipeline stage (tp * cp * dp); more than `stands_for` where a stage's CP
    ranks are simulated apart, each standing for its share."""

    def count(self, n: int) -> str:
        """'64 GPUs', '1 chip'."""
        return f"{n:,} {self.device if n == 1 else self.devices}"

    def row(self, rank: int) -> str:
        """A row label: 'pp 3 · r192 · 64 GPUs' (folded), 'pp 3 · r192' (not folded)."""
        head = f"pp {self.layout.coords(rank).pp} · r{rank}" if self.layout else f"r{rank}"
        return f"{head} · {self.count(self.stands_for)}" if self.stands_for > 1 else head


def words_for(exp: Experiment, times: StepTimes) -> Words:
    device, devices = exp.cluster.device_words
    fold = times.plan.meta.fold
    over_cp = times.fold if times.fold is not None and times.fold.cp_step else None
    text = f"tp {fold.tp} × dp {fold.dp}" if fold is not None else ""
    if over_cp is not None:
        f = over_cp.layout
        text = f"tp {f.tp} × cp {f.cp // over_cp.cp_step} × dp {f.dp}"
    L = exp.layout
    if text and L.ep > 1:  # the experts are spread over the ranks a rank stands for
        text += f"; EP {L.ep}" + (f" × ETP {L.etp}" if L.etp > 1 else "") + " within them"
    return Words(device=device, devices=devices,
                 stands_for=stands_for(times),
                 fold=text,
                 layout=times.plan.meta.layout,
                 stage_devices=L.world // L.pp)
