"""The power limit as an input: `[cluster] gpu_power = "500W"` sets the board power each
accelerator runs at, and with it the SM clock it sustains (docs/sustained-rates.md).

An accelerator's sustained clock is a measurement at a power limit (`topology.presets`): the
clock its GEMMs hold through hours at that limit. A lower limit lowers that clock. Each
accelerator here carries its data-sheet board power (the default, `tdp_W`) and the measured
points (board watts, sustained SM clock) its clock is known at; between two measured points the
clock is interpolated linearly, and a limit outside the measured points is refused in one line
naming the range, never extrapolated. With the key left out nothing changes (the preset's TDP,
its cited sustained clock).

What a cap changes: the SM clock, so the sustained FLOP/s of every precision and the integer
rate of dropout's draws, in proportion. What it does not: HBM bandwidth. HBM runs at its one
fixed memory clock, which a board power limit does not lower to first order (nvidia-smi cannot
even lock A100's memory clock; `Accelerator.sustained_hbm_Bps`), so memory-bound kernels keep
the data-sheet bandwidth under a cap.

A measured point below the TDP follows the one rule: the preset's cited sustained clock at the
TDP times the ratio, in one study, of a bf16 tensor-core workload's rate at that cap to its rate
at the TDP (`topology.power_studies`), so that the study's own offsets cancel. The H100 has such
points, from 200 W to 700 W (Mayr et al., arXiv 2603.16164: LLM pre-training on H100 HBM2e), and
so has torchtitan's 500 W H100-96GB up to its TDP, whose preset clock is that 500 W point. The
other GPUs have no published bf16 measurement below their TDP: each curve holds its TDP point
only, and any other `gpu_power` is refused until a measured point is added beside its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from topology import presets
from topology.cluster import Accelerator
from topology.power_studies import H100_LLAMA3_8B_PRETRAIN
from traces.errors import ConfigError, show
from traces.units import parse_power

MAX_POWER_W = 10_000.0
"""10 kW: no single accelerator draws more (GB300: 1.4 kW); beyond it a value is a typo."""


@dataclass(frozen=True, slots=True)
class PowerCurve:
    """An accelerator's data-sheet board power and its measured (W, sustained MHz) points,
    by increasing watts."""

    tdp_W: float
    points: tuple[tuple[float, float], ...]

    def clock_MHz(self, watts: float) -> float | None:
        """The sustained clock at `watts`, linear between measured points; None outside them."""
        for (w0, c0), (w1, c1) in zip(self.points, self.points[1:]):
            if w0 <= watts <= w1:
                return c0 + (c1 - c0) * (watts - w0) / (w1 - w0)
        low, high = self.points[0], self.points[-1]
        return low[1] if watts == low[0] else high[1] if watts == high[0] else None


def _at_tdp(accelerator: Accelerator, tdp_W: float) -> tuple[str, PowerCurve]:
    """A curve whose one measured point is the preset's cited sustained clock at its TDP."""
    return accelerator.name, PowerCurve(tdp_W, ((tdp_W, accelerator.sustained_clock_MHz),))


def _h100_measured(accelerator: Accelerator, tdp_W: float) -> tuple[str, PowerCurve]:
    """An H100's curve: H100 SXM's cited 1450 MHz at 700 W times the study's rate ratio at each
    measured cap up to `tdp_W` (the H100 of Mayr et al. is the HBM2e board of the 96GB one)."""
    clocks = H100_LLAMA3_8B_PRETRAIN.clocks(presets.H100_SXM.sustained_clock_MHz, tdp_W)
    return accelerator.name, PowerCurve(tdp_W, clocks)


CURVES: dict[str, PowerCurve] = dict((
    _at_tdp(presets.A100_80GB, 400.0),  # A100 SXM data sheet: 400 W
    _h100_measured(presets.H100_SXM, 700.0),  # H100 SXM data sheet: up to 700 W
    _at_tdp(presets.H200_SXM, 700.0),  # H200 SXM data sheet: up to 700 W
    # torchtitan docs/performance.md: "the default 500W power limit"
    _h100_measured(presets.H100_96GB, 500.0),
    _at_tdp(presets.B200, 1000.0),  # HGX B200: 1,000 W a GPU
    _at_tdp(presets.GB200, 1200.0),  # GB200 NVL72: 1.2 kW a GPU (topology.presets)
    _at_tdp(presets.B300, 1100.0),  # HGX B300: 1,100 W a GPU
    # GB300: nvidia-smi's default and maximum limit 1,400 W (facebookexperimental/triton#2023)
    _at_tdp(presets.GB300, 1400.0),
))
"""Per accelerator name (`topology.presets`): board power and measured clocks."""


def read_gpu_power(value: object, accelerator: Accelerator, field: str) -> Accelerator:
    """`accelerator` at the board power `value` ('500W', '500 W', '1.4kW' or watts): its
    sustained clock, FLOP/s and integer rate at that limit, HBM unchanged; one line naming the
    measured range where `value` is outside it."""
    watts = parse_power(value, field)
    if watts > MAX_POWER_W:
        raise ConfigError(f"{field}: {show(value)} is more than the {MAX_POWER_W:g} W any "
                          "accelerator draws")
    curve = CURVES.get(accelerator.name)
    if curve is None:
        raise ConfigError(f"{field}: {accelerator.name} has no published power figures; "
                          "leave gpu_power out")
    clock = curve.clock_MHz(watts)
    if clock is None:
        low, high = curve.points[0][0], curve.points[-1][0]
        measured = f"{low:g} W" if low == high else f"{low:g} W to {high:g} W"
        raise ConfigError(f"{field}: {show(value)} is outside {accelerator.name}'s measured "
                          f"range ({measured}, its TDP {curve.tdp_W:g} W): its sustained clock "
                          "is not extrapolated")
    return at_clock(accelerator, clock)


def at_clock(accelerator: Accelerator, clock_MHz: float) -> Accelerator:
    """`accelerator` sustaining `clock_MHz`: the integer lanes' rate in proportion (the same
    lanes at another clock); the accelerator itself where the clock is its own."""
    if clock_MHz == accelerator.sustained_clock_MHz:
        return accelerator
    scale = clock_MHz / accelerator.sustained_clock_MHz
    return dataclasses.replace(accelerator, sustained_clock_MHz=clock_MHz,
                               int32_ops_per_s=accelerator.int32_ops_per_s * scale)
