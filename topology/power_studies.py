"""Published throughput of a GPU under board power limits below its TDP, as the studies print it:
the source of `topology.power`'s measured points below the TDP (docs/sustained-rates.md).

A study gives a workload's rate at each board power cap. The rule of `topology.power` takes from
it only ratios to the rate at the GPU's TDP in the same study, so that what differs from study to
study (the workload, the software, the cooling, the memory of that board) cancels, and scales the
preset's own cited sustained clock at the TDP by them. A rate becomes a clock only where the
workload is bf16 tensor-core work, whose rate is proportional to the SM clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CapStudy:
    """One study's measured rate of one workload at each board power cap (W, rate), by
    increasing watts, and the cap that is the GPU's TDP there (the reference of its ratios)."""

    source: str
    tdp_W: float
    rates: tuple[tuple[float, float], ...]

    def ratio(self, watts: float) -> float:
        """The rate at the cap `watts` over the rate at the TDP, both measured in this study."""
        return dict(self.rates)[watts] / dict(self.rates)[self.tdp_W]

    def clocks(self, clock_at_tdp_MHz: float, up_to_W: float) -> tuple[tuple[float, float], ...]:
        """(W, MHz) at each measured cap up to `up_to_W`: `clock_at_tdp_MHz` times its ratio."""
        return tuple((watts, clock_at_tdp_MHz * self.ratio(watts))
                     for watts, _ in self.rates if watts <= up_to_W)


H100_LLAMA3_8B_PRETRAIN = CapStudy(
    source=("Mayr et al., \"AI Application Benchmarking: Power-Aware Performance Analysis for "
            "Vision and Language Models\", arXiv 2603.16164, Table 4, Pre-training / H100"),
    tdp_W=700.0,  # the H100 SXM's TDP: the study's uncapped row
    # LLaMA 3 8B continued pre-training with LitGPT (bf16-mixed, LitGPT's training default on a
    # bf16 GPU), tokens/s per GPU, 4 H100 SXM 94 GB HBM2e in one node, at each `nvidia-smi -pl`
    # cap. Training is GEMM-dominated bf16 tensor-core work; its memory-bound kernels and its
    # communication do not slow with the clock, so its ratio bounds the GEMM clock's from above.
    rates=((200.0, 9699.3), (300.0, 17982.3), (400.0, 24853.4), (500.0, 27705.3),
           (600.0, 29250.0), (700.0, 30271.0)),
)
"""The one published bf16 measurement below an H100's TDP: 0.915 of its 700 W rate at 500 W."""
