"""torch.optim's foreach AdamW step (`[parallel] optimizer = "foreach"`, traces.torch_optim):
the bytes of `_multi_tensor_adamw`'s eight kernels, the plan's step ops for a ZeRO-3 shard, and
the key's checks."""

from __future__ import annotations

import pytest

from traces.errors import ConfigError
from traces.kernels import step_kernel_bytes
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase
from traces.plan import build
from traces.purpose import Kernel
from traces.torch_optim import foreach_adamw_bytes

# (read, write) fp32 tensors of each _multi_tensor_adamw kernel, gradients counted apart:
# mul_(p), lerp_(m, g), mul_(v), addcmul_(v, g, g), sqrt(v), div_(s), add_(s), addcdiv_(p, m, s)
FOREACH_KERNELS = ((1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (3, 1))
GRAD_READS = 2  # lerp_ and addcmul_ read the gradients


@pytest.mark.parametrize("grad_bytes", [4, 2])
def test_foreach_adamw_moves_each_kernels_tensors(grad_bytes: int) -> None:
    tensors = sum(r + w for r, w in FOREACH_KERNELS)
    assert foreach_adamw_bytes(grad_bytes) == 4 * tensors + GRAD_READS * grad_bytes
    assert foreach_adamw_bytes(4) == 80


def test_foreach_step_is_norm_clip_and_adamw_without_copies() -> None:
    assert step_kernel_bytes("bf16", 4, "foreach") == (
        (Kernel.GRAD_NORM, 4.0), (Kernel.GRAD_CLIP, 8.0), (Kernel.OPTIMIZER, 80.0))
    # the fused default keeps Megatron's step: Adam 28 + the bf16 copy 6 + zeroing 4
    assert dict(step_kernel_bytes("bf16", 4))[Kernel.OPTIMIZER] == 38.0


def test_the_plans_foreach_step_moves_those_bytes_for_its_zero3_shard() -> None:
    model = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, dtype="bf16",
                      kernels="eager")
    layout = Layout(dp=2, zero=3, global_batch=2, fp32_main_grads=True, optimizer="foreach")
    ops = build(model, layout).ops[0]
    steps = [op for op in ops if op.phase is Phase.OPT and op.kind is OpKind.COMPUTE]
    assert [op.name for op in steps] == ["grad_norm", "grad_clip", "optimizer"]
    shard = model.params_on_stages(layout.stages_of_rank(0), layout.num_stages, layout.tp) / 2
    assert [op.mem_bytes for op in steps] == [shard * 4, shard * 8, shard * 80]


@pytest.mark.parametrize("options", [{"optimizer": "adam"},
                                     {"optimizer": "foreach", "exp_avg_dtype": "bf16"}])
def test_optimizer_key_is_checked(options: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="parallel.optimizer"):
        Layout(dp=2, global_batch=2, **options)  # type: ignore[arg-type]


def test_the_default_is_left_out_of_the_layouts_table() -> None:
    assert "optimizer" not in Layout(dp=2, global_batch=2).to_dict()
    assert Layout(dp=2, global_batch=2, optimizer="foreach").to_dict()["optimizer"] == "foreach"
