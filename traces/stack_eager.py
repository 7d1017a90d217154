"""Eager PyTorch's kernels for a block's memory-bound kernels: one device kernel per aten op,
each reading its inputs from HBM and writing its output back (`traces.stack`).

The ops are what the executor's torch functions (`executor.kernels`, eager PyTorch as torchtitan
runs Llama without torch.compile) launch on activation-sized tensors, forward and autograd's
backward, in order; a test records them on CPU with a TorchDispatchMode and compares. Bytes in
elements of e bytes (the model's dtype) unless stated; n = b·r·h elements of a norm's or a
residual's tensor (r: the rank's tokens of a sequence, s/t with SP), q = n/h its tokens:

RMSNorm, x·rsqrt(mean(x²) + ε)·w (the Llama reference and torchtitan's RMSNorm body)
    fwd  pow 2n · mean n+q · add 2q · rsqrt 2q · mul (x·r) 2n+q · mul (·w) 2n   = 7n + 6q
    bwd  mul (dy·w) 2n · mul (dy·x̂, for dw) 3n · sum (dw) n · mul (·r) 2n+q · mul (·x) 3n ·
         sum (over h) n+q · rsqrt's pow 2q, mul 2q, mul 3q · mean's div n+q · pow's pow 2n,
         mul 2n, mul 3n · add (the two paths) 3n                                = 23n + 10q
LayerNorm: aten's native_layer_norm and its backward, one kernel each, the fused bytes.
A norm whose input is also the residual adds autograd's sum of the two gradients (add, 3n).
RoPE, rotate-half (Megatron-Core's unfused _apply_rotary_pos_emb_bshd): m = b·s·(a + g)/t·d
elements of q and k, v = b·s·g/t·d of v, and the s×d cos and sin tables (c = s·d)
    fwd  neg (x2) m · cat (-x2, x1) 2m · mul (·cos) 2m+c · mul (·sin) 2m+c · add 3m ·
         cat (q, k beside v) 2(m + v)
    bwd  mul 2m+c · mul 2m+c · neg m · cat 2m · add 3m · cat (dq, dk, dv) 2(m + v)
Flash attention through F.scaled_dot_product_attention: with g < a, k and v are first repeated
to a heads (repeat_interleave: a clone each) and sdpa reads them at a heads; its backward
sums dk and dv back to g heads, copies them contiguous and concatenates dq, dk, dv.
SwiGLU, silu(gate)·up over N = b·s·f/t: fwd silu 2N, mul 3N; bwd mul 3N, mul 3N,
silu_backward 3N, cat 4N (dgate and dup into fc1's gradient); GeLU: gelu 2N, gelu_backward
3N. With biases, fc1's bias gradient is summed in fc1's backward (addmm's): not counted here.
bias-dropout-add: add (bias) 2n, dropout as torch ops (rand 4n bytes, ge 4n + n bytes, mul
(2e + 1)n bytes, div 2n), add (residual) 3n; backward: dropout's div 2n, mul (2e + 1)n bytes,
the bias gradient's sum n. Without bias and dropout autograd's add passes the gradient on:
no kernel.
The unfused core's softmax (scale, masked_fill, softmax) and attention dropout (rand, ge, mul,
div) likewise over S = b·a/t·s² scores.
"""

from __future__ import annotations

from traces.model import ModelSpec
from traces.purpose import Kernel

K = Kernel
Launch = tuple[str, float]
"""One device kernel: its aten op and the HBM bytes it moves."""
Lists = tuple[tuple[Launch, ...], tuple[Launch, ...]]
"""A kernel's launches forward and backward."""


def rmsnorm(n: float, q: float, e: int, residual: bool) -> Lists:
    fwd = (("pow", 2 * n), ("mean", n + q), ("add", 2 * q), ("rsqrt", 2 * q),
           ("mul", 2 * n + q), ("mul", 2 * n))
    bwd = (("mul", 2 * n), ("mul", 3 * n), ("sum", n), ("mul", 2 * n + q), ("mul", 3 * n),
           ("sum", n + q), ("pow", 2 * q), ("mul", 2 * q), ("mul", 3 * q), ("div", n + q),
           ("pow", 2 * n), ("mul", 2 * n), ("mul", 3 * n), ("add", 3 * n))
    return _bytes(fwd, e), _bytes(bwd + ((("add", 3 * n),) if residual else ()), e)


def layernorm(n: float, e: int, residual: bool) -> Lists:
    fwd = (("native_layer_norm", 2 * n),)
    bwd = (("native_layer_norm_backward", 3 * n), *((("add", 3 * n),) if residual else ()))
    return _bytes(fwd, e), _bytes(bwd, e)


def rope(m: float, v: float, c: float, e: int) -> Lists:
    fwd = (("neg", m), ("cat", 2 * m), ("mul", 2 * m + c), ("mul", 2 * m + c), ("add", 3 * m),
           ("cat", 2 * (m + v)))
    bwd = (("mul", 2 * m + c), ("mul", 2 * m + c), ("neg", m), ("cat", 2 * m), ("add", 3 * m),
           ("cat", 2 * (m + v)))
    return _bytes(fwd, e), _bytes(bwd, e)


def flash(model: ModelSpec, heads: int, kv: int, s: int, fused: tuple[float, float]) -> Lists:
    """`heads` = b·a/t query heads and `kv` = b·g/t key/value heads of s·d each; `fused`: the
    fused kernel's bytes (forward, backward), which sdpa moves without grouped queries."""
    e, d = model.dtype_bytes, model.head_dim
    qd, kd = heads * s * d, kv * s * d
    concat = ("cat", 2 * (qd + 2 * kd) * e)  # split_with_sizes' backward: dq, dk, dv to dqkv
    if kv == heads:
        return (("sdpa", fused[0]),), (("sdpa_backward", fused[1]), concat)
    lse = 4 * heads * s
    fwd = (("clone", (kd + qd) * e), ("clone", (kd + qd) * e), ("sdpa", 4 * qd * e + lse))
    bwd = (("sdpa_backward", 8 * qd * e + lse), ("sum", (qd + kd) * e), ("sum", (qd + kd) * e),
           ("clone", 2 * kd * e), ("clone", 2 * kd * e), concat)
    return fwd, bwd


def swiglu(big_n: float, e: int) -> Lists:
    bwd = (("mul", 3 * big_n), ("mul", 3 * big_n), ("silu_backward", 3 * big_n),
           ("cat", 4 * big_n))
    return _bytes((("silu", 2 * big_n), ("mul", 3 * big_n)), e), _bytes(bwd, e)


def gelu(big_n: float, e: int) -> Lists:
    """(fc1's bias gradient is summed in fc1's own backward, addmm's, in eager PyTorch.)"""
    return _bytes((("gelu", 2 * big_n),), e), _bytes((("gelu_backward", 3 * big_n),), e)


def dropout(n: float, e: int) -> Lists:
    """Torch-op dropout (`executor.kernels.dropout`) over n elements: a uniform fp32 draw, the
    keep mask (bool), the masked product and the rescale; backward the product and rescale."""
    fwd = (("rand", 4 * n), ("ge", 5 * n), ("mul", (2 * e + 1) * n), ("div", 2 * n * e))
    return fwd, (("div", 2 * n * e), ("mul", (2 * e + 1) * n))


def bda(n: float, e: int, bias: bool, drop: bool) -> Lists:
    fwd_drop, bwd_drop = dropout(n, e) if drop else ((), ())
    fwd = (*((("add", 2 * n * e),) if bias else ()), *fwd_drop, ("add", 3 * n * e))
    return fwd, (*bwd_drop, *((("sum", n * e),) if bias else ()))


def softmax(scores: float, e: int) -> Lists:
    """The executor's scale, causal masked_fill (a 1-byte mask) and softmax, and their
    backward."""
    fwd = (("mul", 2 * scores * e), ("masked_fill", (2 * e + 1) * scores),
           ("softmax", 2 * scores * e))
    bwd = (("softmax_backward", 3 * scores * e), ("masked_fill", (2 * e + 1) * scores),
           ("mul", 2 * scores * e))
    return fwd, bwd


def _bytes(launches: tuple[tuple[str, float], ...], e: int) -> tuple[Launch, ...]:
    """Element counts to bytes of e each."""
    return tuple((op, elements * e) for op, elements in launches)
