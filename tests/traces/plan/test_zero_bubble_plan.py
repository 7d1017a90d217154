"""zb1p in the plan and the simulator: W ops carry the weight-gradient GEMMs (dB) only, B the
rest, adding up to 1F1B's backward; gradients are reduced after W; activations are held until
W; the step shrinks by what the ZB-H1 bubble predicts."""

import math
from collections import defaultdict

import pytest

from sim.models.memory import peak_in_flight
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase
from traces.pipeline import layout_schedule
from traces.plan import build
from traces.purpose import Kernel
from traces.zero_bubble import WEIGHT_GEMMS, WEIGHT_ONLY

MODEL = ModelSpec(layers=8, hidden=256, heads=8, seq_len=128, vocab=1024)


def layout(schedule, **keys):
    base = {"pp": 4, "dp": 2, "tp": 2, "global_batch": 16}
    return Layout(schedule=schedule, **{**base, **keys})


def backward_work(plan, rank):
    """(kernel, layer, micro-batch) -> [FLOPs, bytes] of its backward ops, W's included."""
    out = defaultdict(lambda: [0.0, 0.0])
    for op in plan.ops[rank]:
        if op.kind is OpKind.COMPUTE and op.phase in (Phase.BWD, Phase.WGRAD):
            key = (op.name, op.layer, op.microbatch)
            out[key][0] += op.flops
            out[key][1] += op.mem_bytes
    return {key: (round(f), round(b)) for key, (f, b) in out.items()}


@pytest.mark.parametrize("rank", [0, 6, 15])
def test_b_plus_w_is_the_whole_backward(rank):
    zb, flush = build(MODEL, layout("zb1p")), build(MODEL, layout("1f1b"))
    assert backward_work(zb, rank) == backward_work(flush, rank)
    wgrad = [op for op in zb.ops[rank] if op.phase is Phase.WGRAD]
    assert wgrad and {Kernel(op.name) for op in wgrad} <= WEIGHT_GEMMS | WEIGHT_ONLY
    for op in wgrad:  # dB = Aᵀ·dC: one product of the forward's shape
        if op.gemm:
            b, m, n, k = op.gemm
            assert op.flops == 2.0 * b * m * n * k
    dgrad = [op for op in zb.ops[rank] if op.phase is Phase.BWD and op.gemm
             and Kernel(op.name) in WEIGHT_GEMMS]
    assert dgrad and all(op.flops == 2.0 * math.prod(op.gemm) for op in dgrad)
    # no W op sends or receives: the messages are 1F1B's, in number and bytes
    p2p = [sorted((op.kind, op.size_bytes) for op in plan.ops[rank] if op.kind.is_p2p)
           for plan in (zb, flush)]
    assert p2p[0] == p2p[1]


def test_gradients_are_reduced_after_the_last_w():
    plan = build(MODEL, layout("zb1p"))
    ops = plan.ops[0]
    reduce = next(i for i, op in enumerate(ops) if op.kind is OpKind.ALL_REDUCE
                  and op.stream == "dp")
    last_w = max(i for i, op in enumerate(ops) if op.phase is Phase.WGRAD)
    assert reduce > last_w  # m = 8 per DP replica: the last W is 0W7
    assert ops[last_w].microbatch == 7


def test_activations_held_until_w():
    chosen = layout("zb1p")
    schedule = layout_schedule(chosen)
    assert [peak_in_flight(schedule[r]) for r in range(4)] == [4, 4, 4, 4]
    flush = layout_schedule(layout("1f1b"))
    assert [peak_in_flight(flush[r]) for r in range(4)] == [4, 3, 2, 1]
