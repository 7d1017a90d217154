"""CP's step time and an uneven pipeline's bubble on a contention-free network, against their
closed forms (kernels of fixed, chosen durations; communication timed alone)."""

import dataclasses

import pytest

from sim.engine.replay import replay
from sim.engine.transport import NetworkMode
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase, Trace
from traces.plan import build
from traces.purpose import CpGather, GradBucket, Kernel, KernelRun

MS = 1e-3
CORE = KernelRun(Kernel.FLASH_ATTN)
MERGE = KernelRun(Kernel.CP_MERGE)


class Kernels:
    """Every kernel 1 ms, but the attention core's ring steps: `fwd` and `bwd` seconds, and
    their merges (`Kernel.CP_MERGE`) nothing, so that the ring's closed form stays max(, )."""

    def __init__(self, fwd: float, bwd: float) -> None:
        self.fwd, self.bwd = fwd, bwd

    def duration(self, op):
        if op.purpose == CORE:
            return self.bwd if op.phase is Phase.BWD else self.fwd
        if op.purpose == MERGE:
            return 0.0
        return MS


def _alone(op, ranks, cluster):
    """Seconds of one communication op of the plan alone on the network."""
    if op.kind.is_p2p:
        src, dst = ranks
        send = _copy(op, OpKind.SEND, dst)
        recv = _copy(op, OpKind.RECV, src)
        plan = Trace({src: (send,), dst: (recv,)})
    else:
        plan = Trace({r: (_copy(op, op.kind, None),) for r in op.group})
    return replay(plan, cluster, Kernels(0, 0), network=NetworkMode.ANALYTIC).step_time_s


def _copy(op, kind, peer):
    """`op` alone: without its dependencies."""
    return dataclasses.replace(op, kind=kind, peer=peer, deps=())


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
@pytest.mark.parametrize("dominant", ["transfer", "kernel"])
def test_cp_step_time_equals_its_closed_form(h100, comm, dominant):
    model = ModelSpec(layers=2, hidden=1024, heads=8, seq_len=4096, vocab=1024)
    layout = Layout(cp=2, global_batch=2, overlap_grad_reduce=False, cp_comm=comm)
    check_layout(model, layout, world=2)
    plan = build(model, layout)
    cluster = h100
    ops = plan.ops[0]
    msg = next(op for op in ops if op.kind is OpKind.SEND) if comm == "p2p" else None
    t = _alone(msg, (0, 1), cluster) if msg is not None else 0.0
    fwd, bwd = (t / 2, t / 3) if dominant == "transfer" else (3 * t + MS, 2 * t + MS)
    if comm == "all_gather":
        fwd, bwd = 2 * MS, 3 * MS
    times = replay(plan, cluster, Kernels(fwd, bwd), network=NetworkMode.ANALYTIC)
    kernels = sum(MS for op in ops if op.kind is OpKind.COMPUTE and op.purpose not in
                  (CORE, MERGE))
    cores = layout.num_microbatches * model.layers  # layer passes forward and backward
    if comm == "p2p":
        # forward: step 0 beside the block's transfer, step 1 once it is in;
        # backward: step 1 once K/V is in, the last message (dK/dV) once step 0 is done,
        # qkv's backward once it is in
        per_layer = (max(fwd, t) + fwd) + (max(bwd, t) + max(bwd, t))
    else:
        ag = _alone(next(op for op in ops if isinstance(op.purpose, CpGather)), (), cluster)
        rs = _alone(next(op for op in ops if op.purpose == CpGather(True)), (), cluster)
        per_layer = ag + fwd + ag + bwd + rs
    buckets = sum(_alone(op, (), cluster) for op in ops if isinstance(op.purpose, GradBucket))
    assert buckets > 0  # gradients are reduced over the CP group (dp = 1)
    expected = kernels + cores * per_layer + buckets
    assert times.step_time_s == pytest.approx(expected, rel=1e-9)


class Layers:
    """A layer's forward 1 ms and backward 2 ms (in its qkv op); all else free."""

    def duration(self, op):
        if op.purpose == KernelRun(Kernel.QKV):
            return 2 * MS if op.phase is Phase.BWD else MS
        return 0.0


@pytest.mark.parametrize(("pp", "first", "middle", "last", "m"),
                         [(4, 1, 4, 1, 8), (4, 2, 4, 1, 8), (6, 1, 4, 1, 12), (5, 2, 6, 2, 10)])
def test_1f1b_bubble_with_lighter_first_and_last_stages_equals_its_closed_form(
        h100, pp, first, middle, last, m):
    model = ModelSpec(layers=first + middle * (pp - 2) + last, hidden=256, heads=4,
                      seq_len=64, vocab=512)
    layout = Layout(pp=pp, global_batch=m, pp_first_layers=first, pp_last_layers=last)
    check_layout(model, layout)
    assert [layout.layers_of_rank(model, r) for r in range(pp)] == \
        [first] + [middle] * (pp - 2) + [last]
    times = replay(build(model, layout), h100, Layers(), network=NetworkMode.IDEAL)
    f = [MS * n for n in (first, *[middle] * (pp - 2), last)]
    b = [2 * x for x in f]
    # With the middle stages the slowest and the last one's round trip f + b within a
    # middle forward, the last middle stage (pp - 2) runs without a gap once its first input
    # is in: the forwards of the stages before it, its m passes, their backwards after.
    assert f[-1] + b[-1] <= f[1]
    expected = sum(f[:pp - 2]) + m * (f[1] + b[1]) + sum(b[:pp - 2])
    assert times.step_time_s == pytest.approx(expected, rel=1e-12)
    # The bubble of a busiest stage: (f + b) of the first stage and of pp - 3 middle ones,
    # against (pp - 1)(f + b) with even stages: the last stage's work is hidden.
    bubble = expected - m * (f[1] + b[1])
    assert bubble == pytest.approx((f[0] + b[0]) + (pp - 3) * (f[1] + b[1]), rel=1e-12)
