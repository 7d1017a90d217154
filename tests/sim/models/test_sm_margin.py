"""Transformer Engine's set_sm_margin: a GEMM chunk of tp_comm_overlap whose collective holds
`GemmChunk.comm_sms` SMs runs on the rest for its whole length (`ComputeModel.math_units`),
NCCL's SMs beside it come off those, and its own collective then marks no rank busy
(`traces.plan.overlap.in_margin`): the SMs are counted once."""

from __future__ import annotations

from math import ceil

import pytest

from sim.engine.replay import replay
from sim.engine.transport import NetworkMode
from sim.models.compute import ComputeModel
from sim.models.sharing import gpu_interference
from sim.profile import default_profile
from topology import build_cluster
from topology.presets import H100_SXM, TPU_V4
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase
from traces.plan import build
from traces.plan.overlap import BULK_SMS, PIPELINE_SMS, in_margin
from traces.purpose import GemmChunk, GemmPart, Kernel, OverlapMethod, TpChunk

SHAPE = (1, 8192, 8192, 8192)
H100 = ComputeModel(H100_SXM, default_profile(H100_SXM))
LAUNCH = H100.profile.compute.launch_overhead_s


def chunk(comm_sms: int) -> Op:
    """An fc2 forward GEMM chunk of the pipeline method with `comm_sms` SMs held beside it."""
    purpose = GemmChunk(Kernel.FC2, GemmPart.FPROP, 1, 4, comm_sms)
    return Op(kind=OpKind.COMPUTE, stream="compute", name="fc2", purpose=purpose,
              phase=Phase.FWD, gemm=SHAPE, flops=2.0 * 8192**3)


def best(units: int, model: ComputeModel = H100) -> float:
    """The library's best tile for SHAPE on `units` SMs, by tile and wave count."""
    per_sm = model.accelerator.sustained_flops / model.accelerator.compute_units * \
        model.profile.compute.gemm_efficiency
    return min(ceil(ceil(8192 / tm) * ceil(8192 / tn) / units) * 2 * tm * tn * 8192 / per_sm
               for tm, tn in model.profile.compute.gemm_tiles)


def test_te_defaults_hold_16_sms_for_pipeline_and_bulk():
    """TE's get_default_config: num_sm 16 with set_sm_margin unless ring exchange."""
    assert (PIPELINE_SMS, BULK_SMS) == (16, 16)


def test_a_margin_chunk_runs_on_the_sms_its_collective_leaves_for_its_whole_length():
    assert H100.math_units(chunk(PIPELINE_SMS)) == 132 - 16
    assert H100.math_units(chunk(0)) is None
    assert best(116) > best(132)  # fewer SMs, more waves of the best tile
    assert H100.duration(chunk(0)) == pytest.approx(best(132) + LAUNCH, rel=1e-12)
    assert H100.duration(chunk(PIPELINE_SMS)) == pytest.approx(best(116) + LAUNCH, rel=1e-12)
    assert H100.duration(chunk(PIPELINE_SMS)) > H100.duration(chunk(0))


def test_nccl_beside_a_margin_chunk_takes_its_sms_from_those_left():
    cluster = build_cluster("dgx-h100", nodes=1)
    model = gpu_interference(cluster, H100)
    assert model is not None and model.comm_units == 24
    hbm = model.hbm_left
    assert H100.shared_duration(chunk(PIPELINE_SMS), 132 - 24, hbm) == \
        H100.shared_duration(chunk(0), 132 - 24 - 16, hbm)
    assert model.kernel_scale(chunk(PIPELINE_SMS)) == pytest.approx(
        (best(132 - 24 - 16) + LAUNCH) / (best(132 - 16) + LAUNCH), rel=1e-12)


def test_an_accelerator_with_no_more_units_than_the_margin_keeps_them_all():
    tpu = ComputeModel(TPU_V4, default_profile(TPU_V4))
    assert TPU_V4.compute_units <= PIPELINE_SMS
    assert tpu.math_units(chunk(PIPELINE_SMS)) is None
    assert tpu.duration(chunk(PIPELINE_SMS)) == tpu.duration(chunk(0))


def test_only_pipeline_and_bulk_collective_chunks_are_in_the_margin():
    def tp_chunk(method: OverlapMethod) -> Op:
        purpose = TpChunk(Kernel.FC2, "out", False, OpKind.REDUCE_SCATTER, False, 0, 4, method)
        return Op(kind=OpKind.REDUCE_SCATTER, stream="tp_comm", name="tp", purpose=purpose)

    assert {m for m in OverlapMethod if in_margin(tp_chunk(m))} == {
        OverlapMethod.PIPELINE, OverlapMethod.BULK}
    assert not in_margin(chunk(PIPELINE_SMS))


def test_with_only_tp_traffic_every_gemm_chunk_takes_its_own_duration():
    """One DGX H100, TP 8 alone: the ring exchanges move on the copy engines and the pipeline
    and bulk chunks' SMs are their GEMMs' margin, so no GEMM chunk is stretched by the
    interference model; before, each one beside a pipeline or bulk chunk took NCCL's 24 SMs
    off all 132."""
    cluster = build_cluster("dgx-h100", nodes=1)
    model = ModelSpec(layers=2, hidden=4096, heads=32, seq_len=4096, vocab=32000)
    plan = build(model, Layout(tp=8, sp=True, global_batch=1, tp_comm_overlap=True))
    interference = gpu_interference(cluster, H100)
    assert interference is not None
    times = replay(plan, cluster, H100, network=NetworkMode.ANALYTIC,
                   interference=interference)
    ops = times.plan.ops[0]
    margins = [i for i, op in enumerate(ops) if isinstance(op.purpose, GemmChunk)
               and op.purpose.comm_sms]
    # per layer: proj and fc2 forward 4 chunks each; qkv and fc1 backward a dgrad and a wgrad
    assert len(margins) == 2 * (2 * 4 + 2 * 2)
    for i in margins:
        assert times.ends[0][i] - times.starts[0][i] == pytest.approx(
            H100.duration(ops[i]), rel=1e-9)
