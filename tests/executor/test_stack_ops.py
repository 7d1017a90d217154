"""`kernels = "eager"` is what the executor runs: the aten ops each of its torch kernels
(`executor.kernels`) launches on activation-sized tensors, forward and through autograd's
backward, recorded on CPU with a TorchDispatchMode, are the eager stack's list
(`traces.stack_eager`) op for op."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from executor.kernels import KernelContext, table_of  # noqa: E402
from traces.kernels import layer_kernels  # noqa: E402
from traces.model import ModelSpec  # noqa: E402
from traces.purpose import Kernel  # noqa: E402
from traces.stack import stack_lists  # noqa: E402

S, B, A, D, F = 32, 3, 4, 16, 40
H = A * D
TOKENS = S * B  # b = 3 keeps the s×d rotary tables (512) off the activations' multiples
NOT_WORK = {"_unsafe_view", "new_empty_strided", "empty", "empty_like", "zeros", "zeros_like"}


class Record(TorchDispatchMode):
    """The non-view aten ops that read or write an activation-sized tensor, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        name = schema.name.removeprefix("aten::")
        view = any(r.alias_info is not None and not r.alias_info.is_write
                   for r in schema.returns)
        tensors = [*(out if isinstance(out, tuple | list) else (out,)), *args]
        if not view and name not in NOT_WORK and any(_activation(t) for t in tensors):
            self.ops.append(_named(name))
        return out


def _activation(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.numel() >= TOKENS and t.numel() % TOKENS == 0


def _named(op: str) -> str:
    """CPU's aten names as the stack writes them (sdpa's CPU flash kernel, softmax's)."""
    if op.startswith("_scaled_dot_product"):
        return "sdpa_backward" if op.endswith("backward") else "sdpa"
    return {"_softmax": "softmax", "_safe_softmax": "softmax",
            "_softmax_backward_data": "softmax_backward"}.get(op, op)


def recorded(model: ModelSpec, kernel: Kernel, *inputs) -> tuple[list[str], list[str]]:
    """The executor's `kernel` of `model`, run forward and backward on leaf `inputs`."""
    ctx = KernelContext(heads=model.heads, head_dim=model.head_dim, kv_heads=model.kv_heads,
                        rmsnorm=model.norm == "rmsnorm", tp=1, tp_rank=0, sp=False,
                        vocab_shard=model.vocab, dropout=model.dropout)
    with Record() as forward:
        out = table_of(model)[kernel].fn(ctx, *inputs)[0]
    grad = torch.randn_like(out)
    with Record() as backward:
        torch.autograd.grad(out, inputs, grad)
    return forward.ops, backward.ops


def planned(model: ModelSpec, kernel: Kernel) -> tuple[list[str], list[str]]:
    """The eager stack's ops for `kernel` of `model` (its norm without the residual's sum,
    which autograd runs where the two gradients meet, outside the kernel)."""
    work = next(w for w in layer_kernels(model, B, 1, False) if w.name is kernel)
    fwd, bwd = stack_lists(model, work, B, 1, False)  # type: ignore[misc]
    ops = [op for op, _ in bwd]
    if kernel in (Kernel.LN1, Kernel.LN2):
        assert ops[-1] == "add"
        ops = ops[:-1]
    return [op for op, _ in fwd], ops


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


LLAMA = ModelSpec(layers=1, hidden=H, heads=A, kv_heads=2, seq_len=S, vocab=64, ffn="swiglu",
                  ffn_hidden=F, norm="rmsnorm", position="rope", bias=False, dropout=0.0,
                  kernels="eager")
GPT = ModelSpec(layers=1, hidden=H, heads=A, seq_len=S, vocab=64, ffn_hidden=F,
                attention="unfused", kernels="eager")
WIDTH = (A + 2 * 2) * D
CASES = [
    (LLAMA, Kernel.LN1, lambda: (leaf(S, B, H), leaf(H))),
    (LLAMA, Kernel.ROPE, lambda: (leaf(S, B, WIDTH),)),
    (LLAMA, Kernel.FLASH_ATTN, lambda: (leaf(S, B, WIDTH),)),
    (dataclasses.replace(LLAMA, kv_heads=A), Kernel.FLASH_ATTN, lambda: (leaf(S, B, 3 * H),)),
    (LLAMA, Kernel.BDA1, lambda: (leaf(S, B, H), leaf(S, B, H))),
    (LLAMA, Kernel.SWIGLU, lambda: (leaf(S, B, 2 * F),)),
    (GPT, Kernel.LN2, lambda: (leaf(S, B, H), leaf(H), leaf(H))),
    (GPT, Kernel.GELU, lambda: (leaf(S, B, F),)),
    (GPT, Kernel.BDA2, lambda: (leaf(S, B, H), leaf(S, B, H), leaf(H))),
    (GPT, Kernel.SOFTMAX, lambda: (leaf(B, A, S, S),)),
    (GPT, Kernel.ATTN_DROPOUT, lambda: (leaf(B, A, S, S),)),
]


@pytest.mark.parametrize(("model", "kernel", "inputs"), CASES,
                         ids=[f"{m.norm}-{m.kv_heads}-{k}" for m, k, _ in CASES])
def test_the_eager_stack_is_what_the_executor_launches(model, kernel, inputs):
    assert recorded(model, kernel, *inputs()) == planned(model, kernel)


def test_the_llama_blocks_eager_forward_in_full():
    """The whole block's memory-bound kernels, forward, as one list (GEMMs are mm each)."""
    ops = [op for k in (Kernel.LN1, Kernel.ROPE, Kernel.FLASH_ATTN, Kernel.BDA1, Kernel.LN2,
                        Kernel.SWIGLU, Kernel.BDA2) for op in planned(LLAMA, k)[0]]
    assert ops == ["pow", "mean", "add", "rsqrt", "mul", "mul",
                   "neg", "cat", "mul", "mul", "add", "cat",
                   "clone", "clone", "sdpa", "add",
                   "pow", "mean", "add", "rsqrt", "mul", "mul",
                   "silu", "mul", "add"]
