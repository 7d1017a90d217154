"""The compute model: GEMMs by tile and wave count, streaming kernels by bytes, launches; and
profiles (version 2) read and checked through the typed reader."""

from __future__ import annotations

import dataclasses
import re

import pytest

from sim.models.compute import ComputeModel
from sim.profile import ComputeParams, KernelCost, Profile, default_profile, profile_from_json
from topology.presets import A100_80GB
from traces.errors import ConfigError

A100 = ComputeModel(A100_80GB, default_profile(A100_80GB))
# the roof GEMMs run against: A100's 312 TFLOP/s at the 1305 MHz it sustains of its 1410 boost
# and the default efficiency per clock: mamf-finder's best GEMM, 271.2 TFLOP/s at 1410 MHz
PEAK, UNITS, EFF = 312e12 * 1305 / 1410, 108, 271.2 / 312


def achieved(shape: tuple[int, int, int, int]) -> float:
    batch, m, n, k = shape
    return 2 * batch * m * n * k / A100.gemm_time(shape, EFF) / PEAK


def test_large_square_gemms_run_at_the_profiles_efficiency():
    assert achieved((1, 8192, 8192, 8192)) == pytest.approx(EFF, rel=0.01)
    # 16384 = 128 tiles of 128: 64 x 64 = 4096 tiles over 108 SMs = 37.9 -> 38 waves.
    assert achieved((1, 16384, 16384, 4096)) == pytest.approx(EFF * 4096 / (38 * 108), rel=0.01)


def test_small_skinny_and_sharded_gemms_run_further_from_peak():
    big = achieved((1, 8192, 8192, 8192))
    skinny = achieved((1, 64, 4096, 4096))  # micro-batch 1 decoding-like: 64 rows
    sharded = achieved((1, 2048, 12288 // 8, 12288))  # fc1-like under TP 8, b·s = 2048
    assert skinny < 0.7 * big
    assert sharded < big
    assert achieved((1, 128, 128, 128)) < 0.05  # one tile: 1 of 108 SMs busy


def test_wave_quantization_cliff_at_one_tile_more_than_a_full_wave():
    # With one tile shape, 108 tiles fill one wave; 109 need a second wave of one tile.
    single = ComputeModel(A100_80GB, Profile(name="t", compute=ComputeParams(
        gemm_efficiency=EFF, gemm_tiles=((128, 128),))))
    full = single.gemm_time((108, 128, 128, 4096), EFF)
    over = single.gemm_time((109, 128, 128, 4096), EFF)
    assert over == pytest.approx(2 * full, rel=1e-12)
    assert full == pytest.approx(2 * 128 * 128 * 4096 / (PEAK / UNITS * EFF), rel=1e-12)


def test_backward_runs_the_two_gradient_gemms_and_two_launches():
    shape = (1, 4096, 1024, 2048)
    forward = A100.kernel_time("fc1", 0.0, 0.0, shape)
    backward = A100.kernel_time("fc1", 0.0, 0.0, shape, backward=True)
    dgrad = A100.gemm_time((1, 4096, 2048, 1024), EFF)
    wgrad = A100.gemm_time((1, 2048, 1024, 4096), EFF)
    launch = default_profile(A100_80GB).compute.launch_overhead_s
    assert forward == pytest.approx(A100.gemm_time(shape, EFF) + launch, rel=1e-12)
    assert backward == pytest.approx(dgrad + wgrad + 2 * launch, rel=1e-12)


def test_memory_bound_kernels_cost_bytes_at_achieved_bandwidth_plus_a_launch():
    seconds = A100.kernel_time("ln1", 0.0, 1e9)
    assert seconds == pytest.approx(1e9 / (2039e9 * 0.8) + 3e-6, rel=1e-12)


def test_a_kernel_at_the_ridge_point_does_not_hide_one_roof_under_the_other():
    flops = 1e12  # 1e12 / (288.8e12 * 0.869) = 3.98 ms of compute
    compute = flops / (PEAK * EFF)
    balanced = compute * 2039e9 * 0.8  # bytes that take as long as the FLOPs
    seconds = A100.kernel_time("flash_attn", flops, balanced) - 3e-6
    flash_eff = default_profile(A100_80GB).kernel("flash_attn").flops_efficiency
    alone = flops / (PEAK * flash_eff)
    assert seconds > max(alone, compute)  # not a bare max
    memory = balanced / (2039e9 * 0.8)
    assert seconds == pytest.approx((alone**2 + memory**2) ** 0.5, rel=1e-12)


PROFILE = {"schema": "parasim.profile", "version": 2, "name": "fit", "calibrated": True,
           "compute": {"gemm_efficiency": 0.8, "memory_efficiency": 0.7,
                       "launch_overhead_s": 5e-6,
                       "kernels": {"flash_attn": {"flops_efficiency": 0.5}}},
           "links": {"loopback": {"bandwidth_Bps": 2e9, "latency_s": 3e-5}}}


def test_a_profile_round_trips_through_json():
    profile = profile_from_json(PROFILE)
    assert profile.calibrated and profile.compute.gemm_efficiency == 0.8
    assert profile.kernel("flash_attn").flops_efficiency == 0.5
    assert profile.kernel("qkv") == KernelCost()
    assert profile.links["loopback"].latency_s == 3e-5
    assert profile_from_json(profile.to_json()) == profile


def _with(path: str, value: object) -> dict:
    data = {**PROFILE, "compute": dict(PROFILE["compute"])}
    table, _, key = path.rpartition(".")
    target = data["compute"] if table == "compute" else data
    target[key] = value
    return data


@pytest.mark.parametrize(("data", "message"), [
    ({**PROFILE, "version": 1}, "a version-1 profile"),
    ({**PROFILE, "version": 3}, "has version 3; this parasim reads version 2"),
    ({**PROFILE, "colour": 1}, "profile.colour: unknown key"),
    (_with("compute.gemm_efficiency", 1.5),
     "gemm_efficiency: 1.5 must be an efficiency in [1e-06, 1]"),
    (_with("compute.gemm_efficiency", True), "gemm_efficiency: True must be an efficiency"),
    (_with("compute.launch_overhead_s", float("inf")), "launch_overhead_s: inf must be"),
    (_with("compute.gemm_tiles", [[128]]), "must be a list of [rows, columns] pairs"),
    (_with("compute.kernels", {"mlpp": {}}), "profile.compute.kernels.mlpp: unknown key"),
    (_with("compute.kernels", []), "profile.compute.kernels: [] must be a table of keys"),
    ({**PROFILE, "links": {"x": {"bandwidth_Bps": 1e30, "latency_s": 0}}},
     "bandwidth_Bps: 1e+30 must be at least"),
])
def test_bad_profiles_are_one_line(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        profile_from_json(data, "p.json")
    assert str(caught.value).startswith("p.json: ")


def test_profile_values_check_themselves():
    with pytest.raises(ConfigError, match="compute.kernels.atn: unknown kernel"):
        ComputeParams(gemm_efficiency=0.5, kernels={"atn": KernelCost()})
    with pytest.raises(ConfigError, match="flops_efficiency: 0 must be an efficiency"):
        KernelCost(flops_efficiency=0)
    assert dataclasses.replace(default_profile(A100_80GB)).compute.gemm_efficiency == \
        pytest.approx(EFF, rel=1e-12)


def test_ops_sharing_a_purpose_are_costed_by_their_own_fields():
    """`duration` answers a kernel like the last one of its purpose from that one's figures:
    any field that differs (FLOPs, bytes, shape, phase, precision, timing) must be costed anew,
    as a fresh model (no memory of the others) costs it."""
    from traces.ops import Op, OpKind, Phase
    from traces.purpose import Kernel, KernelRun

    fc1 = KernelRun(Kernel.FC1)  # one object, as the plan shares it
    base = Op(kind=OpKind.COMPUTE, stream="compute", name="fc1", purpose=fc1, phase=Phase.FWD,
              flops=2 * 4096 * 8192 * 2048, mem_bytes=1e8, gemm=(1, 4096, 8192, 2048))
    change = dataclasses.replace
    variants = [base, change(base, flops=base.flops / 2), change(base, mem_bytes=4e9),
                change(base, phase=Phase.BWD, flops=2 * base.flops),  # a backward: dA and dB
                change(base, gemm=(1, 4096, 8192, 1024)),
                change(base, dtype="fp32"), change(base, start=0.0, end=2.5),
                change(base, purpose=None), change(base, purpose=None, name="other"), base]
    shared = ComputeModel(A100_80GB, default_profile(A100_80GB))
    for op in variants:
        fresh = ComputeModel(A100_80GB, default_profile(A100_80GB))
        assert shared.duration(op) == fresh.duration(op)
    assert shared.duration(variants[3]) > 1.9 * shared.duration(base)  # two GEMMs backward
    assert shared.duration(variants[6]) == 2.5  # a measured op keeps its time
    # a zero-bubble split (`traces.zero_bubble`): B's dA alone (one product's FLOPs in phase
    # bwd) and W's dB alone (phase wgrad) are one GEMM each, of shapes (m, k, n) and (k, n, m)
    dgrad = change(base, phase=Phase.BWD, mem_bytes=0.0)
    wgrad = change(base, phase=Phase.WGRAD, mem_bytes=0.0)
    model = ComputeModel(A100_80GB, default_profile(A100_80GB))
    both = model.duration(change(variants[3], mem_bytes=0.0))  # two launches, as the pair
    assert model.duration(dgrad) + model.duration(wgrad) == pytest.approx(both, rel=1e-12)
    assert model.duration(dgrad) < 0.6 * both
