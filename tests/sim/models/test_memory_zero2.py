"""ZeRO-2's gradient bucket in the memory model (issue 32, Llama 3 Table 4): with gradients
reduced every micro-batch, a rank holds the bucket it back-propagates whole until its
reduce-scatter; the largest bucket is the plan's largest gradient reduction, byte for byte."""

from __future__ import annotations

import pytest

from sim.models.memory import memory_by_pp_rank
from sim.models.working_memory import zero2_working_bytes
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build
from traces.purpose import GradBucket

SMALL = ModelSpec(layers=6, hidden=64, heads=4, seq_len=32, vocab=128)


def layout(zero: int, **options: object) -> Layout:
    return Layout(dp=2, pp=3, zero=zero, global_batch=8, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("fp32", [False, True])
@pytest.mark.parametrize(("bucket", "layers"), [(1, 1), (2**30, 2)])
def test_zero2_adds_its_largest_bucket_to_zero1s_peak(fp32: bool, bucket: int,
                                                      layers: int) -> None:
    """A bucket closes at `bucket_bytes` (one layer here at 1 byte) or at the chunk's end (the
    rank's 2 layers): width x layers x layer_params(t) more working memory than ZeRO 1, the
    gradients themselves sharded (4Ψ/N with fp32 main gradients)."""
    width = 4 if fp32 else 2
    options = dict(fp32_main_grads=fp32, bucket_bytes=bucket)
    for one, two in zip(memory_by_pp_rank(SMALL, layout(1, **options)),
                        memory_by_pp_rank(SMALL, layout(2, **options))):
        assert two.working_bytes - one.working_bytes == width * layers * SMALL.layer_params(1)
        assert two.grads_bytes == one.grads_bytes / 2
        assert (two.params_bytes, two.activations_bytes) == \
            (one.params_bytes, one.activations_bytes)


def test_step_sync_holds_no_bucket() -> None:
    """grad_sync = "step": the full buffer is a model state, no bucket beside it."""
    assert zero2_working_bytes(SMALL, layout(2), 1) > 0
    step, one = memory_by_pp_rank(SMALL, layout(2, grad_sync="step"))[1], \
        memory_by_pp_rank(SMALL, layout(1))[1]
    assert step == one


@pytest.mark.parametrize("bucket", [1, 2**30])
def test_the_bucket_is_the_plans_largest_gradient_reduction(bucket: int) -> None:
    """On the middle pipeline rank (layers only: no embedding or head unit), the memory
    model's bucket equals the largest GradBucket collective the plan builds."""
    lay = layout(2, fp32_main_grads=True, bucket_bytes=bucket)
    rank = lay.rank(pp=1)
    sizes = [op.size_bytes for op in build(SMALL, lay).ops[rank]
             if isinstance(op.purpose, GradBucket)]
    assert max(sizes) == zero2_working_bytes(SMALL, lay, 1)
