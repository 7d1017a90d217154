"""`model.moe_gemm_streams`: the grouped expert GEMM as Transformer Engine's cuBLAS path runs
it, one GEMM per expert round-robin on S compute streams (`sim.models.compute`), against the
one pooled grouped kernel parasim keeps by default."""

from __future__ import annotations

import pytest

from sim.config import experiment_from_dict
from sim.models.compute import ComputeModel, expert_rounds
from sim.profile import default_profile
from topology.presets import A100_80GB
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec

PROFILE = default_profile(A100_80GB)
POOLED = ComputeModel(A100_80GB, PROFILE)
TE = ComputeModel(A100_80GB, PROFILE, expert_streams=4)
EFF, OVERHEAD = PROFILE.compute.gemm_efficiency, PROFILE.compute.launch_overhead_s


def test_rounds_are_the_streams_then_the_remainder():
    assert expert_rounds(16, 4) == [4, 4, 4, 4]
    assert expert_rounds(10, 4) == [4, 4, 2]
    assert expert_rounds(3, 4) == [3]
    assert expert_rounds(16, 0) == [16]  # no streams: the one grouped kernel


def test_an_expert_gemm_runs_round_by_round_with_a_launch_each():
    gemm, flops = (16, 2048, 1536, 2048), 2.0 * 16 * 2048 * 1536 * 2048
    # no bytes: the roofline is the compute time alone
    te = TE.kernel_time("expert_fc1", flops, 0.0, gemm)
    assert te == pytest.approx(4 * TE.gemm_time((4, 2048, 1536, 2048), EFF) + 4 * OVERHEAD,
                               rel=1e-12)
    pooled = POOLED.kernel_time("expert_fc1", flops, 0.0, gemm)
    assert pooled == pytest.approx(POOLED.gemm_time(gemm, EFF) + OVERHEAD, rel=1e-12)
    assert te > pooled  # 4 rounds' last waves and launches where the pooled kernel has one


def test_a_backward_splits_both_gradient_gemms():
    gemm, flops = (10, 512, 768, 2048), 3 * 2.0 * 10 * 512 * 768 * 2048
    te = TE.kernel_time("expert_fc2", flops, 0.0, gemm, backward=True)
    rounds = (4, 4, 2)
    dgrad = sum(TE.gemm_time((c, 512, 2048, 768), EFF) for c in rounds)
    wgrad = sum(TE.gemm_time((c, 2048, 768, 512), EFF) for c in rounds)
    assert te == pytest.approx(dgrad + wgrad + 6 * OVERHEAD, rel=1e-12)


def test_other_gemms_keep_the_one_kernel():
    gemm, flops = (16, 2048, 1536, 2048), 2.0 * 16 * 2048 * 1536 * 2048
    assert TE.kernel_time("fc1", flops, 0.0, gemm) == POOLED.kernel_time("fc1", flops, 0.0, gemm)


MOE = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024,
       "experts": 8, "top_k": 2}


def _exp(model: dict[str, object]) -> dict[str, object]:
    return {"model": model, "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "global_batch": 8},
            "cluster": {"preset": "dgx-a100", "nodes": 1}}


def test_the_key_checks_itself():
    assert experiment_from_dict(_exp({**MOE, "moe_gemm_streams": 4})).model.moe_gemm_streams == 4
    for bad in (-1, 65, 1.5, True):
        with pytest.raises(ConfigError, match="moe_gemm_streams"):
            experiment_from_dict(_exp({**MOE, "moe_gemm_streams": bad}))
    dense = {k: v for k, v in MOE.items() if k not in ("experts", "top_k")}
    with pytest.raises(ConfigError, match="moe_gemm_streams"):
        experiment_from_dict(_exp({**dense, "moe_gemm_streams": 4}))
    with pytest.raises(ConfigError, match="moe_gemm_streams"):
        experiment_from_dict(_exp({**MOE, "moe_grouped_gemm": False, "moe_gemm_streams": 4}))


def test_predict_runs_the_key():
    """Through `sim.simulate.predict`: as many streams as local experts is one round, the
    pooled kernel exactly; one stream runs the experts one after another, slower."""
    from sim.simulate import predict

    def step(streams: int) -> float:
        table = _exp({**MOE, "moe_gemm_streams": streams})
        table["parallel"] = {"tp": 1, "pp": 1, "dp": 8, "ep": 1, "global_batch": 8}
        return predict(experiment_from_dict(table))[0].step_time_s

    assert step(8) == step(0)
    assert step(1) > step(0)


def _spec(**extra: object) -> tuple[ModelSpec, Layout]:
    table = _exp({**MOE, "experts": 16, **extra})
    table["cluster"] = {"preset": "dgx-h100", "nodes": 1}  # FP8 tensor cores
    exp = experiment_from_dict(table)
    return exp.model, exp.layout  # EP 8: 16 / 8 = 2 local experts


def test_te_expert_casts_launch_a_kernel_per_local_expert_on_the_device():
    from sim.models.host import device_launches, expert_cast_launches

    model, layout = _spec(dtype="fp8", fp8_recipe="tensorwise", moe_gemm_streams=4)
    n = expert_cast_launches(model, layout)
    assert n == 16 // 8 * 2  # 2 local experts, current scaling's amax pass and cast each
    counts = device_launches(model, layout)
    assert counts is not None
    assert counts["expert_cast", False] == counts["expert_cast_grad", True] == n
    # the compute model charges each its launch: a memory kernel's bytes plus n overheads
    te = ComputeModel(A100_80GB, PROFILE, counts, expert_streams=4)
    one = ComputeModel(A100_80GB, PROFILE)
    assert te.kernel_time("expert_cast", 0.0, 1e6) == pytest.approx(
        one.kernel_time("expert_cast", 0.0, 1e6) + (n - 1) * OVERHEAD, rel=1e-12)
    # without TE's GroupedLinear (the pooled kernel) nothing is added to the stack's counts
    plain, layout = _spec(dtype="fp8", fp8_recipe="tensorwise", moe_gemm_streams=0)
    assert ("expert_cast", False) not in (device_launches(plain, layout) or {})


def test_the_stack_sets_the_default_and_a_stated_value_wins():
    """Unset, `gemm_streams` is the stack's: Megatron-Core + TE's TEGroupedMLP (fused with
    moe_grouped_gemm) runs TE's 4 streams; torchtitan's stacks, a GEMM per expert and a dense
    model have no streams. A stated value is kept as stated, whatever the stack."""
    from traces.moe_spec import TE_GEMM_STREAMS, gemm_streams

    assert TE_GEMM_STREAMS == 4
    assert ModelSpec(**MOE).moe_gemm_streams is None  # unset stays unset (headers unchanged)
    assert gemm_streams(ModelSpec(**MOE)) == 4
    for kernels in ("compiled", "eager"):
        assert gemm_streams(ModelSpec(**MOE, kernels=kernels)) == 0
        assert gemm_streams(ModelSpec(**MOE, kernels=kernels, moe_gemm_streams=2)) == 2
    assert gemm_streams(ModelSpec(**MOE, moe_grouped_gemm=False)) == 0
    dense = {k: v for k, v in MOE.items() if k not in ("experts", "top_k")}
    assert gemm_streams(ModelSpec(**dense)) == 0
    assert gemm_streams(ModelSpec(**MOE, moe_gemm_streams=0)) == 0
    assert gemm_streams(ModelSpec(**MOE, moe_gemm_streams=8)) == 8


def test_the_default_simulates_as_the_stated_streams():
    """Through `sim.simulate.predict` (EP 1: 8 local experts, two rounds of 4): unset under
    fused is exactly a stated 4; unset under compiled exactly a stated 0."""
    from sim.simulate import predict

    def step(**extra: object) -> float:
        table = _exp({**MOE, **extra})
        table["parallel"] = {"tp": 1, "pp": 1, "dp": 8, "ep": 1, "global_batch": 8}
        return predict(experiment_from_dict(table))[0].step_time_s

    assert step() == step(moe_gemm_streams=4) != step(moe_gemm_streams=0)
    assert step(kernels="compiled") == step(kernels="compiled", moe_gemm_streams=0)


def test_deepseeks_own_run_states_one_grouped_kernel():
    """The H800 example runs DeepGEMM's contiguous grouped GEMM: stated 0, over the default."""
    from sim.config import example_path, load_experiment
    from traces.moe_spec import gemm_streams

    model = load_experiment(example_path("deepseek-v3-2048-h800.toml")).model
    assert model.moe_gemm_streams == 0 and gemm_streams(model) == 0


def test_the_analytic_tier_charges_the_expert_casts_launches_as_the_simulator():
    """`sim.search.analytic` times a layout's ops with the launches the simulator's compute
    model gets (`device_launches`): under TE's streams an FP8 expert cast op launches a
    quantize per local expert (and its amax pass), so EP 8 and EP 2 differ."""
    from sim.models.host import device_launches
    from sim.search.analytic import Analytic

    model, layout = _spec(dtype="fp8", fp8_recipe="tensorwise")  # the default: TE's 4 streams
    exp = experiment_from_dict({**_exp({**MOE, "experts": 16, "dtype": "fp8",
                                         "fp8_recipe": "tensorwise"}),
                                "cluster": {"preset": "dgx-h100", "nodes": 1}})
    analytic = Analytic(exp.model, exp.cluster, exp.profile)
    for ep in (8, 2):
        at = Layout(tp=1, pp=1, dp=8, ep=ep, global_batch=8)
        compute = analytic._of(at)[0]
        assert compute.launches == device_launches(exp.model, at)
        n = compute.launches["expert_cast", False]
        assert n == 16 // ep * 2
        assert compute.kernel_time("expert_cast", 0.0, 1e6, backward=False) == pytest.approx(
            analytic.compute.kernel_time("expert_cast", 0.0, 1e6, backward=False)
            + (n - 1) * exp.profile.compute.launch_overhead_s, rel=1e-12)
    stated = Analytic(ModelSpec(**{**MOE, "experts": 16, "dtype": "fp8",
                                   "fp8_recipe": "tensorwise", "moe_gemm_streams": 0}),
                      exp.cluster, exp.profile)
    assert stated._of(layout)[0] is stated.compute  # one grouped kernel: no per-expert casts
