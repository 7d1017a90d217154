"""Context parallelism in the plan: Transformer Engine's ring (and all-gather) per rank and
layer, the attention core divided by cp, the rest on s/cp tokens, gradients over DP x CP."""

import dataclasses

import pytest

from traces.kernels import attention_kernels
from traces.layout import Axis, Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase, Stream
from traces.plan import build
from traces.plan.context import merge_bytes_at
from traces.plan.nodes import RankContext
from traces.purpose import CpGather, CpRing, GradBucket, Kernel, KernelRun

MODEL = ModelSpec(layers=2, hidden=64, heads=4, seq_len=96, vocab=128)
E = 2  # bf16


def _plan(**options):
    layout = Layout(**{"global_batch": 1, **options})
    check_layout(MODEL, layout)
    return layout, build(MODEL, layout)


def _of_layer(ops, phase, layer=0, mb=0):
    return [op for op in ops if op.layer == layer and op.microbatch == mb and op.phase is phase]


def _kv_block(b, cp, t):
    """One K/V block by hand: b·(s/cp) tokens x (K and V: 2h/t) x 2 bytes."""
    return b * (MODEL.seq_len // cp) * 2 * MODEL.hidden // t * E


@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_ring_sends_cp_minus_1_blocks_forward_and_cp_messages_backward(cp, tp):
    if MODEL.seq_len % (2 * cp):
        pytest.skip("seq_len must split into 2·cp chunks")
    layout, plan = _plan(cp=cp, tp=tp)
    kv = _kv_block(1, cp, tp)
    for rank, ops in plan.ops.items():
        group = layout.group(rank, Axis.CP)
        me = group.index(rank)
        nxt, prev = group[(me + 1) % cp], group[(me - 1) % cp]
        fwd = [op for op in _of_layer(ops, Phase.FWD) if isinstance(op.purpose, CpRing)]
        sends = [op for op in fwd if op.kind is OpKind.SEND]
        recvs = [op for op in fwd if op.kind is OpKind.RECV]
        assert [op.size_bytes for op in sends] == [kv] * (cp - 1)
        assert [op.size_bytes for op in recvs] == [kv] * (cp - 1)
        assert {op.peer for op in sends} == {nxt} and {op.peer for op in recvs} == {prev}
        assert {op.stream for op in sends} == {Stream.CP_SEND}
        bwd = [op for op in _of_layer(ops, Phase.BWD) if isinstance(op.purpose, CpRing)]
        sends = [op for op in bwd if op.kind is OpKind.SEND]
        # cp messages: K/V, then K/V + dK/dV, ..., then dK/dV: (cp-1)·K/V + (cp-1)·dK/dV
        assert len(sends) == cp
        assert [op.size_bytes for op in sends] == [kv] + [2 * kv] * (cp - 2) + [kv]
        assert sum(op.size_bytes for op in sends) == 2 * (cp - 1) * kv
        assert {op.peer for op in sends} == {prev}  # backward runs the ring the other way
        assert [op.purpose.step for op in sends] == list(range(cp))


def test_each_ring_step_waits_for_the_block_before_it_and_qkv_backward_for_the_last():
    layout, plan = _plan(cp=3)
    ops = plan.ops[0]
    index = {id(op): i for i, op in enumerate(ops)}
    for phase in (Phase.FWD, Phase.BWD):
        layer = _of_layer(ops, phase)
        steps = [op for op in layer if op.purpose == KernelRun(Kernel.FLASH_ATTN)]
        recvs = [op for op in layer if isinstance(op.purpose, CpRing)
                 and op.kind is OpKind.RECV]
        assert len(steps) == 3
        for step, recv in zip(steps[1:], recvs):
            assert index[id(recv)] in step.deps
    qkv_backward = next(op for op in _of_layer(ops, Phase.BWD)
                        if op.purpose == KernelRun(Kernel.QKV))
    last_recv = [op for op in _of_layer(ops, Phase.BWD) if op.kind is OpKind.RECV][-1]
    assert index[id(last_recv)] in qkv_backward.deps  # its own dK/dV came round


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_the_attention_core_is_divided_by_cp_and_every_other_kernel_sees_s_over_cp(comm):
    b, cp, t = 1, 2, 2
    _, plan = _plan(cp=cp, tp=t, cp_comm=comm)
    _, whole = _plan(tp=t)
    ops, alone = plan.ops[0], whole.ops[0]
    d, a, s = MODEL.hidden // MODEL.heads, MODEL.heads // t, MODEL.seq_len
    core = sum(op.flops for op in _of_layer(ops, Phase.FWD)
               if op.purpose == KernelRun(Kernel.FLASH_ATTN))
    assert core == 4 * b * a * s * s * d / 2 / cp  # the causal half, over cp
    for kernel in (Kernel.QKV, Kernel.FC1, Kernel.LN1, Kernel.BDA2):
        mine = next(op for op in _of_layer(ops, Phase.FWD) if op.purpose == KernelRun(kernel))
        ref = next(op for op in _of_layer(alone, Phase.FWD) if op.purpose == KernelRun(kernel))
        assert mine.flops == ref.flops / cp
        if mine.gemm:  # M (tokens) divides, the weight operand does not
            assert mine.gemm[1] == ref.gemm[1] // cp and mine.gemm[2:] == ref.gemm[2:]
        else:
            assert mine.mem_bytes == ref.mem_bytes / cp
    # a ring step is the flash kernel of s/cp queries on s/cp keys
    local = dataclasses.replace(MODEL, seq_len=s // cp)
    if comm == "p2p":
        step = next(op for op in _of_layer(ops, Phase.FWD)
                    if op.purpose == KernelRun(Kernel.FLASH_ATTN))
        assert step.flops == attention_kernels(local, b, t)[0].flops


def test_all_gather_mode_gathers_forward_and_again_backward_and_reduce_scatters_dkv():
    cp, t = 2, 2
    layout, plan = _plan(cp=cp, tp=t, cp_comm="all_gather")
    kv = _kv_block(1, cp, t)
    for rank, ops in plan.ops.items():
        group = layout.group(rank, Axis.CP)
        fwd = [op for op in _of_layer(ops, Phase.FWD) if isinstance(op.purpose, CpGather)]
        bwd = [op for op in _of_layer(ops, Phase.BWD) if isinstance(op.purpose, CpGather)]
        assert [(op.kind, op.size_bytes, op.group) for op in fwd] == \
            [(OpKind.ALL_GATHER, cp * kv, group)]
        assert [(op.kind, op.purpose.grad) for op in bwd] == \
            [(OpKind.ALL_GATHER, False), (OpKind.REDUCE_SCATTER, True)]
        assert all(op.size_bytes == cp * kv and op.stream == Stream.COMPUTE for op in bwd)
        assert not any(op.kind.is_p2p for op in ops)


def test_gradients_are_reduced_over_dp_times_cp():
    layout, plan = _plan(tp=2, cp=2, dp=2, global_batch=2)
    for rank, ops in plan.ops.items():
        c = layout.coords(rank)
        expected = tuple(sorted(layout.rank(tp=c.tp, cp=k, dp=d, pp=c.pp)
                                for k in range(2) for d in range(2)))
        groups = {op.group for op in ops if isinstance(op.purpose, GradBucket)}
        assert groups == {expected}
        assert layout.data_group(rank) == expected


def test_cp_rules_are_one_line_naming_the_field():
    from traces.errors import ConfigError
    with pytest.raises(ConfigError, match=r"parallel.cp: model.seq_len = 96 is not divisible "
                                          r"by 2 x cp = 10"):
        check_layout(MODEL, Layout(cp=5))
    with pytest.raises(ConfigError, match=r"parallel.cp: 2 needs model.attention = \"flash\""):
        check_layout(dataclasses.replace(MODEL, attention="unfused"), Layout(cp=2))
    with pytest.raises(ConfigError, match=r"parallel.sp: model.seq_len / cp = 48 is not "
                                          r"divisible by tp = 32"):
        check_layout(ModelSpec(layers=2, hidden=64, heads=32, seq_len=96, vocab=128),
                     Layout(cp=2, tp=32, sp=True))


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_an_overlapped_proj_waits_for_the_last_op_of_the_cp_attention(comm):
    """tp_comm_overlap's proj chunks waited for the attention core the CP pass replaces (a
    dangling wait deadlocked the step): they wait for the last op of its CP form."""
    _, plan = _plan(tp=2, cp=2, sp=True, tp_comm_overlap=True, cp_comm=comm)
    ops = plan.ops[0]
    assert all(0 <= d < i for i, op in enumerate(ops) for d in op.deps)
    fwd = [i for i, op in enumerate(ops) if op.layer == 0 and op.microbatch == 0
           and op.phase is Phase.FWD]
    last_core = max(i for i in fwd if ops[i].purpose in (KernelRun(Kernel.FLASH_ATTN),
                                                          KernelRun(Kernel.CP_MERGE)))
    proj_scatter = next(i for i in fwd if i > last_core and ops[i].stream == Stream.TP_COMM)
    assert ops[proj_scatter].kind is OpKind.REDUCE_SCATTER
    assert last_core in ops[proj_scatter].deps


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_a_ranks_flash_draws_are_its_share_of_the_causal_scores(comm):
    """Dropout in the CP core: each ring step draws the causal count of an s/cp block (the
    all-gather core, cp of them at once), one rank's forward cp·(s/cp)(s/cp + 1)/2 a head."""
    cp, s, a = 2, MODEL.seq_len, MODEL.heads
    _, plan = _plan(cp=cp, cp_comm=comm)
    cores = [op for op in _of_layer(plan.ops[0], Phase.FWD) if op.name == "flash_attn"]
    block = a * (s // cp) * (s // cp + 1) / 2
    assert sum(op.draws for op in cores) == cp * block
    assert len(cores) == (cp if comm == "p2p" else 1)



GQA = ModelSpec(layers=2, hidden=128, heads=8, kv_heads=2, seq_len=96, vocab=128)
"""Eight query heads of 16 over two K/V heads: at TP 2, four query heads and one K/V head a
rank, so a stack that repeats K/V to the query heads moves four times the K/V."""
D, TP = 16, 2


def _gqa_plan(kernels, **options):
    model = dataclasses.replace(GQA, kernels=kernels)
    layout = Layout(**{"global_batch": 1, "tp": TP, **options})
    check_layout(model, layout)
    return build(model, layout)


def _cp_sends(plan, phase):
    return [op.size_bytes for op in _of_layer(plan.ops[0], phase)
            if isinstance(op.purpose, CpRing) and op.kind is OpKind.SEND]


@pytest.mark.parametrize("kernels", ["eager", "compiled"])
def test_torch_stacks_ring_kv_at_the_query_heads_and_dkv_in_fp32(kernels):
    """torchtitan repeats K/V to a/t heads before sdpa, which PyTorch's context parallelism
    takes over: K/V blocks of 2·(a/t)·d, dK/dV sent in fp32; the fused stack keeps 2·(g/t)·d."""
    cp = 3
    tokens = GQA.seq_len // cp
    grouped = tokens * 2 * (GQA.kv_heads // TP) * D * E
    repeated = tokens * 2 * (GQA.heads // TP) * D * E
    assert repeated == 4 * grouped
    fused = _gqa_plan("fused", cp=cp)
    assert _cp_sends(fused, Phase.FWD) == [grouped] * (cp - 1)
    assert _cp_sends(fused, Phase.BWD) == [grouped, 2 * grouped, grouped]
    torch = _gqa_plan(kernels, cp=cp)
    fp32 = repeated * 4 // E
    assert _cp_sends(torch, Phase.FWD) == [repeated] * (cp - 1)
    assert _cp_sends(torch, Phase.BWD) == [repeated, repeated + fp32, fp32]


def test_torch_stacks_all_gather_kv_at_the_query_heads_and_reduce_scatter_fp32_dkv():
    cp = 2
    repeated = GQA.seq_len // cp * 2 * (GQA.heads // TP) * D * E
    plan = _gqa_plan("compiled", cp=cp, cp_comm="all_gather")
    ops = [op for op in plan.ops[0] if isinstance(op.purpose, CpGather) and op.layer == 0
           and op.microbatch == 0]
    assert [(op.kind, op.size_bytes, op.dtype) for op in ops] == [
        (OpKind.ALL_GATHER, cp * repeated, "bf16"), (OpKind.ALL_GATHER, cp * repeated, "bf16"),
        (OpKind.REDUCE_SCATTER, cp * repeated * 2, "fp32")]


def _merges(plan, rank, phase):
    return [op.mem_bytes for op in _of_layer(plan.ops[rank], phase)
            if op.purpose == KernelRun(Kernel.CP_MERGE)]


def test_transformer_engines_merges_correct_the_output_and_accumulate_dq_dkv():
    """A merge after every ring step: forward out.add_(out_step · exp(Δlse)) over the queries
    the step computed (3e an element) and the fp32 lse correction (20 bytes a query row);
    backward dq.add_ (3e a query element) and dkv.add_ over the block's K/V (3e). Each CP rank
    is charged, step by step, the most any CP rank moves there."""
    cp = 3
    plan = _gqa_plan("fused", cp=cp)
    tokens = GQA.seq_len // cp
    q = tokens * (GQA.heads // TP) * D  # query (and output) elements of the rank
    kv = tokens * 2 * (GQA.kv_heads // TP) * D
    rows = tokens * GQA.heads // TP
    full = 3 * E * q + 20 * rows

    def fwd(i, me):  # forward block i: all queries at i <= me, the late half after
        return full if i <= me else full / 2

    def bwd(i, me):  # at 0 < i <= me only the early K/V half
        return 3 * E * ((q if i <= me else q / 2) + (kv / 2 if 0 < i <= me else kv))

    layout = Layout(global_batch=1, tp=TP, cp=cp)
    ctx = RankContext(model=dataclasses.replace(GQA, kernels="fused"), layout=layout, rank=0)
    for i in range(cp):
        for me in range(cp):
            assert merge_bytes_at(ctx, me, i, backward=False) == fwd(i, me)
            assert merge_bytes_at(ctx, me, i, backward=True) == bwd(i, me)
    for rank, me in ((0, 0), (TP * 2, 2)):  # CP rank 0 and CP rank 2 (ranks tp-major)
        assert layout.group(rank, Axis.CP).index(rank) == me
        assert _merges(plan, rank, Phase.FWD) == [full] * cp  # CP rank 2's, all queries
        # backward runs the blocks in reverse
        assert _merges(plan, rank, Phase.BWD) == [max(bwd(i, m) for m in range(cp))
                                                  for i in reversed(range(cp))]
    assert bwd(1, 0) < bwd(1, 2)  # grouped K/V: the rank merging all queries is the busiest


def test_torch_merges_are_fp32_and_the_all_gather_core_merges_every_block():
    cp = 2
    p2p = _gqa_plan("compiled", cp=cp)
    gathered = _gqa_plan("compiled", cp=cp, cp_comm="all_gather")
    for phase in (Phase.FWD, Phase.BWD):
        steps = _merges(p2p, 0, phase)
        assert len(steps) == cp
        assert _merges(gathered, 0, phase) == [sum(steps)]
        assert _merges(p2p, TP, phase) == steps  # CP rank 1: the same
    tokens = GQA.seq_len // cp
    q = tokens * (GQA.heads // TP) * D
    kv = tokens * 2 * (GQA.heads // TP) * D  # repeated to the query heads
    # block 0 the fp32 cast (e + 4); block 1 on CP rank 1 (the busier: at or before it, all
    # queries) through cast, out - block_out, the product, the difference (6 + 12 + 8 + 12),
    # the K/V cat (2e), and the final cast back (4 + e) of all queries; CP rank 0 the late
    # half of the queries only
    ctx = RankContext(model=dataclasses.replace(GQA, kernels="compiled"),
                      layout=Layout(global_batch=1, tp=TP, cp=cp), rank=0)
    assert merge_bytes_at(ctx, 0, 1, backward=False, last=True) == 38 * q / 2 + 2 * E * kv + 6 * q
    assert _merges(p2p, 0, Phase.FWD) == [6 * q, 38 * q + 2 * E * kv + 6 * q]
    assert _merges(gathered, 0, Phase.FWD) == [6 * q + 38 * q + 2 * E * kv + 6 * q]
    assert not _merges(_gqa_plan("fused", cp=cp, cp_comm="all_gather"), 0, Phase.FWD)


def test_torch_all_gather_runs_beside_the_ranks_own_step():
    """PyTorch's _AllGatherRotater gathers K/V asynchronously at step 0 and waits at step 1:
    the diagonal step (one ring step's FLOPs) does not wait for the gather, the other cp − 1
    blocks' kernel waits for both; the fused stack's gather stays inline before its kernel."""
    cp = 4
    plan = _gqa_plan("compiled", cp=cp, cp_comm="all_gather")
    ring = _gqa_plan("compiled", cp=cp)
    ops = plan.ops[0]
    index = {id(op): i for i, op in enumerate(ops)}
    for phase in (Phase.FWD, Phase.BWD):
        layer = _of_layer(ops, phase)
        gather = next(op for op in layer if op.purpose == CpGather(False))
        own, rest = [op for op in layer if op.purpose == KernelRun(Kernel.FLASH_ATTN)]
        step = next(op for op in _of_layer(ring.ops[0], phase)
                    if op.purpose == KernelRun(Kernel.FLASH_ATTN))
        assert gather.stream == Stream.CP_RECV
        assert own.flops == step.flops and rest.flops == (cp - 1) * step.flops
        assert index[id(gather)] not in own.deps
        assert {index[id(gather)], index[id(own)]} <= set(rest.deps)
    fused = _gqa_plan("fused", cp=cp, cp_comm="all_gather").ops[0]
    assert {op.stream for op in fused if isinstance(op.purpose, CpGather)} == {Stream.COMPUTE}


@pytest.mark.parametrize("comm", ["all_gather", "p2p"])
def test_a_ranks_attention_at_fixed_local_tokens_grows_as_cp(comm):
    """Under load balancing every step of a rank's ring is one SDPA call of the same size at
    every CP degree (torch's _templated_ring_attention: step 0 causal on the rank's two
    chunks, each other step s/cp queries on s/(2·cp) keys or s/(2·cp) queries on s/cp keys,
    non-causal), so with s/cp tokens a rank (Table 2 of torchtitan: 32,768 at every CP) its
    attention FLOPs are cp times CP 1's: exactly cp · 2·b·a·(s/cp)²·d a layer forward."""
    local, b = 48, 1
    d, a = GQA.hidden // GQA.heads, GQA.heads // TP
    for phase in (Phase.FWD, Phase.BWD):
        one = None
        for cp in (1, 2, 4):
            model = dataclasses.replace(GQA, kernels="compiled", seq_len=local * cp)
            layout = Layout(global_batch=1, tp=TP, cp=cp, cp_comm=comm)
            check_layout(model, layout)
            flops = sum(op.flops for op in _of_layer(build(model, layout).ops[0], phase)
                        if op.purpose == KernelRun(Kernel.FLASH_ATTN))
            one = flops if cp == 1 else one
            assert flops == cp * one
        if phase is Phase.FWD:
            assert one == 4 * b * a * local * local * d / 2


@pytest.mark.parametrize("cp_comm", ["p2p", "all_gather"])
def test_every_op_of_a_cp_plan_is_an_object_of_its_own(cp_comm):
    """The ring's ops are stamped from rows shared per message and merge size
    (`traces.plan.context._Ring`): each is still its own op (`finalize` sets its deps in
    place), and each step's core equals the core it replaced."""
    layout, plan = _plan(cp=4, tp=2, cp_comm=cp_comm)
    for ops in plan.ops.values():
        assert len({id(op) for op in ops}) == len(ops)
        cores = [op for op in ops if op.purpose == KernelRun(Kernel.FLASH_ATTN)]
        if cp_comm == "p2p":  # cp steps per core, each the core's op
            per_core = {(op.layer, op.microbatch, op.phase) for op in cores}
            assert len(cores) == 4 * len(per_core)
            for key in per_core:
                alike = [op for op in cores if (op.layer, op.microbatch, op.phase) == key]
                assert all(dataclasses.replace(op, deps=()) ==
                           dataclasses.replace(alike[0], deps=()) for op in alike)
