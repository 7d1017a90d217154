"""Sustained rates: the one rule that turns an accelerator's public GEMM benchmarks into the
compute model's efficiencies (docs/sustained-rates.md).

A training run keeps its GEMMs busy for hours at the power limit, where the SM clock settles
below the boost clock a short benchmark sees. So an accelerator carries two roofs
(`topology.cluster.Accelerator`): `peak_flops` at the data sheet's clock, and
`sustained_flops` = peak · sustained clock / peak clock. Every efficiency of the compute model
is relative to the sustained roof, and every default is derived the same way:

    gemm       = measured GEMM rate / (peak · clock it ran at / peak clock)     (per clock)
    flash_attn = gemm · (flash's fraction of peak / the best GEMM's fraction of peak),
                 both measured in short bursts, so their clocks cancel

Adding an accelerator is only figures: its clocks in `topology.presets`, its benchmarks here.

    python -c "from sim.models.rates import A100; print(A100.gemm, A100.flash_attn)"
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.cluster import Accelerator
from topology.presets import A100_80GB, H100_SXM
from topology.presets import B200 as B200_GPU
from topology.presets import GB300 as GB300_GPU
from traces.kernels import FLASH_BWD


def per_clock(measured_flops: float, clock_MHz: float, accelerator: Accelerator) -> float:
    """A benchmark's rate over the accelerator's roof at the clock it ran at
    (`peak_flops · clock / peak clock`; the peak itself where no clock figure exists)."""
    scale = clock_MHz / accelerator.peak_clock_MHz if accelerator.peak_clock_MHz else 1.0
    return measured_flops / (accelerator.peak_flops * scale)


@dataclass(frozen=True, slots=True, kw_only=True)
class Benchmarks:
    """The public kernel measurements of one accelerator the defaults derive from."""

    accelerator: Accelerator
    gemm_flops: float
    """The best dense bf16 GEMM rate measured ..."""
    gemm_clock_MHz: float
    """... at this SM clock."""
    burst_gemm_flops: float
    """The best GEMM in a short burst (the conditions kernel benchmarks run in)."""
    flash_attn_of_peak: float
    """Flash attention's benchmark rate as a fraction of peak (a short burst too)."""

    @property
    def gemm(self) -> float:
        """`gemm_efficiency`: of the sustained roof."""
        return per_clock(self.gemm_flops, self.gemm_clock_MHz, self.accelerator)

    @property
    def flash_attn(self) -> float:
        """Flash attention's efficiency: the same fraction of the GEMMs' as in the bursts."""
        burst = self.burst_gemm_flops / self.accelerator.peak_flops
        return self.gemm * self.flash_attn_of_peak / burst


# A100: mamf-finder's best bf16 GEMM, 271.2 TFLOP/s, a mean of 100 iterations after 50
# warm-ups (a burst of well under a second) at the 1410 MHz boost (stas00/ml-engineering,
# compute/accelerator, "Maximum Achievable Matmul FLOPS" table): 0.869 per clock, so
# 0.869 x 288.8 = 251 TFLOP/s sustained at 1305 MHz (topology.presets). FlashAttention-2 (Dao,
# 2023): 50-73% of A100 peak forward and backward, counting the FLOPs it executes: 0.6.
A100 = Benchmarks(accelerator=A100_80GB, gemm_flops=271.2e12, gemm_clock_MHz=1410,
                  burst_gemm_flops=271.2e12, flash_attn_of_peak=0.6)
# H100 / H200: mamf-finder's sustained (MSMF) run on 8 H200s at once, 698.6 TFLOP/s mean at
# the saturated ~1450 MHz (same source, benchmarks/README.md, "alone vs all-8 concurrent"; the
# H100 SXM is the same die at the same 700 W): 0.891 per clock, 698.6 sustained (0.706 of
# peak). Its bursts: 794.5 TFLOP/s (MAMF, H100 SXM). Flash attention: FlashAttention-2 ~35%
# and cuDNN / FlashAttention-3 50-75% of H100 peak (Shah et al., 2024): 0.5.
H100 = Benchmarks(accelerator=H100_SXM, gemm_flops=698.6e12, gemm_clock_MHz=1450,
                  burst_gemm_flops=794.5e12, flash_attn_of_peak=0.5)
# B200: mamf-finder's sustained (MSMF) run on 8 B200s at once, 1426 TFLOP/s at an SM clock of
# 1316-1410 MHz (same source): 0.864 per clock. Its bursts: 1745 TFLOP/s. Flash attention: no
# published fraction of Blackwell's peak, so Hopper's FlashAttention-3 class 0.5 (an assumption).
# GB200 takes B200's: the same die pair (topology.presets gives it its own clocks).
B200 = Benchmarks(accelerator=B200_GPU, gemm_flops=1426e12, gemm_clock_MHz=1365,
                  burst_gemm_flops=1745e12, flash_attn_of_peak=0.5)


# Blackwell Ultra (B300, GB300): B200's tensor cores (no published GEMM figure of its own), but
# twice Blackwell's special-function throughput for the exponential, MUFU.EX2
# (`Accelerator.exp_per_clock`, cited in topology.presets: the tensor cores idle while the SFUs
# normalise the scores). Blackwell runs `exp_per_clock` = 16 exponentials a clock an SM beside
# 8192 dense BF16 FLOP (FlashAttention-4, Zadouri, Dao et al., 2026), so at a head dim of 128
# one causal score's exponential takes as long as its 4·128 FLOP of QKᵀ and PV at full rate: the
# forward is bound by the exponential, the backward by shared-memory traffic, not by it (same
# source). So the forward's exponentials, one a score, are on its critical path and take
# B200's rate over the accelerator's of the time (half on Blackwell Ultra); the backward
# (FLASH_BWD times the forward's FLOPs at the same efficiency) keeps its time.
TENSOR_BF16_PER_CLOCK = 8192
"""Blackwell's dense BF16 tensor FLOP a clock an SM (`topology.presets`)."""
HEAD_DIM = 128
"""The head dim the efficiency is stated at (Llama 3, Qwen3, GPT-3's)."""


def with_faster_exponentials(flash: float, speedup: float, backward: float = FLASH_BWD,
                             exp_per_clock: int = B200_GPU.exp_per_clock) -> float:
    """Flash attention's efficiency (fwd and bwd together) where the forward's exponentials
    run `speedup` times faster: per causal score, the forward takes 4·d / (8192 · `flash`)
    SM clocks, 1 / `exp_per_clock` of them the exponential (Blackwell's 16), the backward
    `backward` times the forward."""
    forward = 4 * HEAD_DIM / (TENSOR_BF16_PER_CLOCK * flash)
    saved = (1 - 1 / speedup) / exp_per_clock
    step = (1 + backward) * forward
    return flash * step / (step - saved)


def blackwell_flash(accelerator: Accelerator) -> float:
    """A Blackwell-family accelerator's flash attention efficiency: B200's, its forward's
    exponentials at the accelerator's rate a clock an SM over B200's (`exp_per_clock`)."""
    speedup = accelerator.exp_per_clock / B200_GPU.exp_per_clock
    return with_faster_exponentials(B200.flash_attn, speedup)


BLACKWELL_ULTRA_FLASH = blackwell_flash(GB300_GPU)
"""Blackwell Ultra's flash attention efficiency: B200's, its forward exponentials twice as fast
(forward alone 1.39x faster: NVIDIA's softmax blog measured ~35% more FP8 forward throughput on
DeepSeek-V3's attention); fwd and bwd together 1.086x."""
