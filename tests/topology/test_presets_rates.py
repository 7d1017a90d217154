"""The accelerator presets' rates: every figure cited, the sustained roof below the peak, and
the defaults derived from them by the one rule of `sim.models.rates`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import topology.presets as presets
from sim.models import rates
from sim.profile import DEFAULTS
from topology.cluster import Accelerator
from topology.power import at_clock

SOURCE = Path(presets.__file__)
FIGURES = ("peak_flops", "hbm_bandwidth_Bps", "peak_clock_MHz", "sustained_clock_MHz",
           "int32_ops_per_s", "exp_per_clock")
ACCELERATORS = [a for a in vars(presets).values() if isinstance(a, Accelerator)]
CHIPS = [a for a in ACCELERATORS if not a.name.startswith("CPU")]


def _calls() -> dict[str, tuple[int, dict[str, int]]]:
    """Per `NAME = Accelerator(...)` in presets.py: its line and each keyword's line."""
    out = {}
    for node in ast.parse(SOURCE.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "Accelerator":
            name = node.targets[0].id  # type: ignore[attr-defined]
            out[name] = (node.lineno, {k.arg: k.value.lineno for k in node.value.keywords
                                       if k.arg})
    return out


def _cited(lines: list[str], lineno: int) -> bool:
    """A comment on the line itself, or on the line just above it."""
    return "#" in lines[lineno - 1] or lines[lineno - 2].lstrip().startswith("#")


def test_every_rate_figure_of_a_preset_has_its_citation():
    lines = SOURCE.read_text().splitlines()
    calls = _calls()
    assert {getattr(presets, n).name for n in calls} == {a.name for a in ACCELERATORS}
    for name, (start, keywords) in calls.items():
        for figure in FIGURES:
            if figure in keywords:
                assert _cited(lines, keywords[figure]) or _cited(lines, start), (name, figure)
    for chip in CHIPS:  # a chip states both clocks; the CPU of localhost has none
        assert chip.peak_clock_MHz > 0 and chip.sustained_clock_MHz > 0, chip.name


@pytest.mark.parametrize("chip", CHIPS, ids=lambda a: a.name)
def test_the_sustained_roof_is_the_peak_at_the_sustained_clock_and_not_above_it(chip):
    assert chip.sustained_flops == pytest.approx(
        chip.peak_flops * chip.sustained_clock_MHz / chip.peak_clock_MHz, rel=1e-12)
    assert chip.sustained_flops <= chip.peak_flops
    assert chip.sustained_hbm_Bps == chip.hbm_bandwidth_Bps  # HBM's clock is not lowered
    if "TPU" not in chip.name:  # GPUs boost above what their power limit sustains
        assert chip.sustained_flops < chip.peak_flops
    # the rate a full-wave GEMM reaches by default: below the sustained roof
    assert chip.sustained_flops * DEFAULTS[chip.name].gemm_efficiency < chip.sustained_flops


@pytest.mark.parametrize("chip", CHIPS, ids=lambda a: a.name)
def test_the_integer_rate_is_64_lanes_an_sm_at_the_sustained_clock(chip):
    """Random draws run on the INT32 lanes (A100 and H100 whitepapers: 64 an SM), at the clock
    the GEMMs leave them; a TPU publishes no integer rate and draws for free."""
    if "TPU" in chip.name:
        assert chip.int32_ops_per_s == 0
        return
    lanes = chip.int32_ops_per_s / (chip.compute_units * chip.sustained_clock_MHz * 1e6)
    assert lanes == pytest.approx(64, rel=1e-12)


def test_a100_and_h100_defaults_are_their_benchmarks_per_clock():
    # A100: 271.2 TFLOP/s at 1410 MHz (its peak clock) -> 271.2/312; sustained 251 TFLOP/s
    assert rates.A100.gemm == pytest.approx(271.2 / 312, rel=1e-12)
    assert presets.A100_80GB.sustained_flops * rates.A100.gemm == pytest.approx(
        271.2e12 * 1305 / 1410, rel=1e-12)
    # H100: 698.6 TFLOP/s measured at the sustained clock itself: exactly that rate
    assert presets.H100_SXM.sustained_flops * rates.H100.gemm == pytest.approx(698.6e12,
                                                                               rel=1e-12)
    # flash attention keeps its burst ratio to the best GEMM: 0.6 / (271.2/312) on A100
    assert rates.A100.flash_attn / rates.A100.gemm == pytest.approx(0.6 / (271.2 / 312))
    assert rates.H100.flash_attn / rates.H100.gemm == pytest.approx(0.5 / (794.5 / 989.4))
    for name in ("A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB"):
        assert DEFAULTS[name].gemm_efficiency < 1.0
        assert DEFAULTS[name].kernels["flash_attn"].flops_efficiency < 1.0  # type: ignore


def test_per_clock_without_clock_figures_is_the_fraction_of_peak():
    cpu = presets.CPU_LOCALHOST
    assert cpu.sustained_flops == cpu.peak_flops
    assert rates.per_clock(25e9, 3000, cpu) == pytest.approx(0.5)


def test_blackwell_ultra_halves_the_forward_exponentials_of_b200_flash_attention():
    """Per causal score at head dim 128: B200's forward takes 512 / (8192 e) SM clocks, 1/16
    of them the exponential; Blackwell Ultra's exponential takes 1/32, its backward (2.5x the
    forward) the same time: so its efficiency is e · 3.5 F / (3.5 F - 1/32)."""
    e = rates.B200.flash_attn
    forward = 512 / (8192 * e)
    ultra = e * 3.5 * forward / (3.5 * forward - 1 / 32)
    flash = rates.BLACKWELL_ULTRA_FLASH
    assert flash == pytest.approx(ultra, rel=1e-12)
    assert forward / (forward - 1 / 32) == pytest.approx(1.386, abs=1e-3)  # the forward alone
    assert rates.with_faster_exponentials(e, 1.0) == pytest.approx(e, rel=1e-12)
    for name in ("GB300-288GB", "B300-SXM-288GB"):
        ultra_params, b200 = DEFAULTS[name], DEFAULTS["B200-SXM-180GB"]
        assert ultra_params.gemm_efficiency == b200.gemm_efficiency
        assert ultra_params.kernels["flash_attn"].flops_efficiency == pytest.approx(ultra)
    assert DEFAULTS["GB200-186GB"] is DEFAULTS["B200-SXM-180GB"]


@pytest.mark.parametrize("chip", [c for c in CHIPS if c.exp_per_clock], ids=lambda a: a.name)
def test_the_exponential_rate_is_sms_times_mufu_per_clock_at_the_sustained_clock(chip):
    """Softmax's exponentials run on the SFUs: SMs x exponentials a clock an SM x the clock the
    power limit leaves (a power cap lowers it with the GEMMs' rate)."""
    assert chip.sustained_exp_per_s == chip.compute_units * chip.exp_per_clock * \
        chip.sustained_clock_MHz * 1e6
    half = at_clock(chip, chip.sustained_clock_MHz / 2)
    assert half.sustained_exp_per_s == pytest.approx(chip.sustained_exp_per_s / 2, rel=1e-12)


def test_blackwell_ultra_doubles_the_exponentials_and_only_they_set_its_flash_apart():
    """16 a clock an SM on Hopper and Blackwell, 32 on Blackwell Ultra (presets' citations);
    the flash efficiency of a Blackwell-family chip follows from that rate alone: B200's own
    at 16, the doubled-exponential one at 32."""
    assert {c.name: c.exp_per_clock for c in CHIPS if c.exp_per_clock} == {
        "H100-SXM5-80GB": 16, "H200-SXM-141GB": 16, "H100-SXM5-96GB": 16,
        "B200-SXM-180GB": 16, "GB200-186GB": 16, "B300-SXM-288GB": 32, "GB300-288GB": 32}
    assert rates.blackwell_flash(presets.GB200) == rates.B200.flash_attn
    for ultra in (presets.B300, presets.GB300):
        assert rates.blackwell_flash(ultra) == rates.with_faster_exponentials(
            rates.B200.flash_attn, 2.0)
    assert rates.blackwell_flash(presets.B300) == rates.BLACKWELL_ULTRA_FLASH
