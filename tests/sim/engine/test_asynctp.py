"""torch's AsyncTP (tp_comm_overlap with `kernels = "compiled"`, `traces.plan.overlap`): which
GEMMs it overlaps, the produce-and-copy region's chain on the engine, and its cost against
Transformer Engine's overlap and against no overlap."""

from __future__ import annotations

import dataclasses

import pytest

from sim.engine.replay import replay
from sim.engine.transport import NetworkMode
from sim.models.compute import ComputeModel
from sim.models.sharing import interference_for
from sim.profile import default_profile
from tests.sim.engine.test_overlaps import MODEL, OVERLAP, _regions, _replay
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase
from traces.plan import build
from traces.plan.overlap import own_wait, peer_copy, region_seconds
from traces.purpose import GemmChunk, Kernel, KernelRun, OverlapMethod, TpChunk, TpSite

COMPILED = dataclasses.replace(MODEL, kernels="compiled")


def _methods(model: ModelSpec) -> dict[tuple[str, Phase], set[tuple[OverlapMethod, int]]]:
    """(kernel, phase) -> the (method, chunk count) of its overlapped regions, rank 0."""
    ops = build(model, Layout(**OVERLAP, recompute="full")).ops[0]
    out: dict[tuple[str, Phase], set[tuple[OverlapMethod, int]]] = {}
    for op in ops:
        if isinstance(op.purpose, TpChunk):
            key = (str(op.purpose.kernel), op.phase)
            out.setdefault(key, set()).add((op.purpose.method, op.purpose.count))
    return out


def test_asynctp_overlaps_the_forward_and_the_row_parallel_dgrad_only():
    """qkv/fc1 gathers as a ring of t; proj/fc2 forward as t - 1 produce copies; proj/fc2 dgrad
    ring; qkv/fc1 backward inline (their input gradient is a sum of GEMMs). Transformer
    Engine's overlap, on the same layout, also overlaps qkv/fc1 backward (bulk) and splits
    the reduce-scatters in 4."""
    t = OVERLAP["tp"]
    ring, produce = {(OverlapMethod.RING, t)}, {(OverlapMethod.PRODUCE, t - 1)}
    fwd = {(k, p): ring if k in ("qkv", "fc1") else produce
           for k in ("qkv", "proj", "fc1", "fc2") for p in (Phase.FWD, Phase.RECOMPUTE)}
    assert _methods(COMPILED) == {**fwd, ("proj", Phase.BWD): ring, ("fc2", Phase.BWD): ring}
    te = _methods(MODEL)
    assert te[("proj", Phase.FWD)] == {(OverlapMethod.PIPELINE, 4)}
    assert te[("qkv", Phase.BWD)] == {(OverlapMethod.BULK, 1)}
    # the inline collectives of qkv's and fc1's backward: the input gradient's reduce-scatter
    # alone, each layer (DTensor keeps the gathered input: no all-gather again,
    # `traces.stack.regathers`)
    ops = build(COMPILED, Layout(**OVERLAP, recompute="full")).ops[0]
    inline = [op.kind for op in ops if isinstance(op.purpose, TpSite) and op.phase is Phase.BWD
              and op.purpose.kernel in ("qkv", "fc1")]
    assert inline == [OpKind.REDUCE_SCATTER] * 2 * MODEL.layers * OVERLAP["global_batch"]


def test_produce_chunks_hold_no_sms_and_wait_for_the_copy_two_before():
    """t GEMM chunks and t - 1 copies (the rank's own partial, last, is copied nowhere:
    torch's _pipelined_produce_and_all2all); GEMM chunk k waits for copy k - 2, the last too
    at even t (`own_wait`); each copy delivers one partial, size / t, to each rank."""
    ops = build(COMPILED, Layout(**OVERLAP)).ops[0]
    region = next(r for r in _regions(ops) if ops[r[0]].purpose.kernel == "proj"
                  and ops[r[0]].phase is Phase.FWD)
    gemms = [i for i in region if isinstance(ops[i].purpose, GemmChunk)]
    copies = [i for i in region if isinstance(ops[i].purpose, TpChunk)]
    t = OVERLAP["tp"]
    assert len(gemms) == t and len(copies) == t - 1
    assert {ops[i].purpose.comm_sms for i in gemms} == {0}
    for k, i in enumerate(gemms):
        assert (copies[k - 2] in ops[i].deps) is (k >= 2), k
        assert len(ops[i].deps) == (k >= 2)
    for k, i in enumerate(copies):
        assert gemms[k] in ops[i].deps
    plain = build(COMPILED, Layout(**{**OVERLAP, "tp_comm_overlap": False})).ops[0]
    whole = next(op for op in plain if op.phase is Phase.FWD and op.layer == 0
                 and op.microbatch == 0 and getattr(op.purpose, "kernel", None) == "proj"
                 and not isinstance(op.purpose, TpSite))
    scatter = next(op for op in plain if op.phase is Phase.FWD and op.layer == 0
                   and op.microbatch == 0 and isinstance(op.purpose, TpSite)
                   and op.purpose.kernel == "proj")
    assert sum(ops[i].flops for i in gemms) == pytest.approx(whole.flops, rel=1e-12)
    assert sum(ops[i].size_bytes for i in copies) == pytest.approx(scatter.size_bytes,
                                                                   rel=1e-12)
    # a reduce-scatter of B moves (t - 1)/t·B to each rank: here one partial, size / t
    assert [ops[i].size_bytes * (t - 1) / t for i in copies] == \
        pytest.approx([scatter.size_bytes / t] * (t - 1), rel=1e-12)
    # then the sum of the t partial sums: after the last copy, t shards read, one written
    total = ops[region[-1] + 1]
    assert total.purpose == KernelRun(Kernel.TP_PARTIAL_SUM)
    assert total.deps == (copies[-1],) and total.flops == 0
    assert total.mem_bytes == scatter.size_bytes * (t + 1) / t
    sums = [op for op in ops if op.purpose == KernelRun(Kernel.TP_PARTIAL_SUM)]
    assert len(sums) == 2 * MODEL.layers * OVERLAP["global_batch"]  # proj, fc2; fwd only


def test_each_produce_region_ends_where_its_chain_says(h100):
    """On the contention-free network, every AsyncTP region's length from its launch equals
    `region_seconds` of its chunks' own times: GEMM k ends at max(GEMM k-1, copy k-2) + g,
    copy k (k < t - 1) at max(copy k-1, GEMM k) + c, the last GEMM after `own_wait`'s copy."""
    times = _replay(h100, COMPILED, Layout(**OVERLAP))
    ops = times.plan.ops[0]
    seen = set()
    for region in _regions(ops):
        method = next(ops[i].purpose.method for i in region
                      if isinstance(ops[i].purpose, TpChunk))
        seen.add(method)
        start = times.ends[0][region[0] - 1]
        end = max(times.ends[0][i] for i in region)
        if method is OverlapMethod.PRODUCE:
            gemms = [times.ends[0][i] - times.starts[0][i] for i in region
                     if isinstance(ops[i].purpose, GemmChunk)]
            copies = [times.ends[0][i] - times.starts[0][i] for i in region
                      if isinstance(ops[i].purpose, TpChunk)]
            gemm_end = copy_end = 0.0
            ends: list[float] = []
            for k, g in enumerate(gemms):  # t = 8: the last waits for copy k - 2 too
                gemm_end = max(gemm_end, ends[k - 2] if k >= 2 else 0.0) + g
                if k < len(copies):
                    copy_end = max(copy_end, gemm_end) + copies[k]
                    ends.append(copy_end)
            assert end - start == pytest.approx(max(gemm_end, copy_end), rel=1e-9, abs=1e-12)
        searched = region_seconds([ops[i] for i in region],
                                  lambda op: times.ends[0][ops.index(op)]
                                  - times.starts[0][ops.index(op)])
        assert end - start == pytest.approx(searched, rel=1e-9, abs=1e-12)
    assert seen == {OverlapMethod.RING, OverlapMethod.PRODUCE}


def test_own_partial_waits_for_the_last_copy_of_the_current_stream():
    """torch runs step s on the current stream when s is even, the own partial after the
    loop on that stream: t = 2 waits for nothing, even t for copy t - 3, odd t for t - 2."""
    assert [own_wait(t) for t in (2, 3, 4, 5, 8, 16)] == [None, 1, 1, 3, 5, 13]


def test_produce_copies_are_lowered_as_peer_copies():
    """AsyncTP's produce copies, like its gathers' steps, are one copy from one peer each
    (`peer_copy`), not NCCL's reduce-scatter; Transformer Engine's pipeline chunks are."""
    compiled = build(COMPILED, Layout(**OVERLAP)).ops[0]
    te = build(MODEL, Layout(**OVERLAP)).ops[0]
    methods = {op.purpose.method for op in compiled if peer_copy(op)}
    assert methods == {OverlapMethod.RING, OverlapMethod.PRODUCE}
    assert {op.purpose.method for op in te if peer_copy(op)} == {OverlapMethod.RING}


def test_asynctp_hides_less_than_transformer_engine_and_never_lengthens_the_step(h100):
    """At 8192 x 4096, tp 8, AsyncTP's step is shorter than the same step without overlap."""
    big = ModelSpec(layers=2, hidden=8192, heads=64, seq_len=4096, vocab=32000,
                    kernels="compiled")
    inline = _replay(h100, big, Layout(**{**OVERLAP, "tp_comm_overlap": False})).step_time_s
    asynctp = _replay(h100, big, Layout(**OVERLAP)).step_time_s
    assert asynctp < inline


def test_copy_engine_copies_leave_the_gemm_chunks_their_sms(h100):
    """With NCCL's interference on (`sim.models.interference.GpuInterference`): an AsyncTP
    GEMM chunk beside copy-engine copies runs as long as alone; a Transformer Engine pipeline
    chunk runs on the 16 SMs fewer its reduce-scatter leaves it (set_sm_margin), the first
    too, and no longer: that reduce-scatter holds no more SMs than the margin."""
    def chunks(model: ModelSpec, method: OverlapMethod) -> list[tuple[float, float, float]]:
        plan = build(model, Layout(**OVERLAP))
        compute = ComputeModel(h100.accelerator, default_profile(h100.accelerator))
        times = replay(plan, h100, compute, network=NetworkMode.ANALYTIC,
                       interference=interference_for(h100, default_profile(h100.accelerator),
                                                     compute))
        ops = plan.ops[0]
        region = next(r for r in _regions(ops) if ops[r[0]].purpose.kernel == "proj"
                      and ops[r[0]].phase is Phase.FWD)
        assert ops[region[1]].purpose.method is method
        return [(times.ends[0][i] - times.starts[0][i], compute.duration(ops[i]),
                 compute.duration(dataclasses.replace(
                     ops[i], purpose=dataclasses.replace(ops[i].purpose, comm_sms=0))))
                for i in region if isinstance(ops[i].purpose, GemmChunk)]

    produce = chunks(COMPILED, OverlapMethod.PRODUCE)
    assert all(took == pytest.approx(alone, rel=1e-9) == every for took, alone, every in produce)
    pipeline = chunks(MODEL, OverlapMethod.PIPELINE)
    assert all(took == pytest.approx(alone, rel=1e-9) for took, alone, _ in pipeline)
    assert all(alone > 1.01 * every for _, alone, every in pipeline)  # on 116 of 132 SMs
