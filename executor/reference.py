"""The single-process reference: the same decoder unsharded, plain autograd, torch.optim.AdamW.

Written independently of the kernels (batch-first, materialized causal attention with the key
and value heads indexed per query head, rotary positions by complex multiplication,
F.cross_entropy), sharing with the executor only the seeded initialisation
(`params.init_full_unit`) and the synthetic data, so agreement is evidence, not tautology. An
MoE layer shares the routing too (`executor.routing`: which tokens visit which experts, the
definition of the plan's counts), and computes the rest its own way: no permutation, no
exchange, each expert on its tokens with plain indexing.

    run = train(model, global_batch, steps=2, seed=1234)  # run.losses, run.params

Data: step k uses `batch(model, global_batch, seed, k)`, [B, s + 1] random token ids; inputs
are the first s, targets the last s. Data-parallel rank d's micro-batch i is samples
[(d*m + i)*b, (d*m + i + 1)*b) of it (m micro-batches of b samples per rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from executor.kernels import LN_EPS, local_positions
from executor.optim import AdamWConfig
from executor.params import EMBED, HEAD, Unit, init_full_unit, layer_unit
from executor.routing import route
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer


def batch(model: ModelSpec, global_batch: int, seed: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    return torch.randint(0, model.vocab, (global_batch, model.seq_len + 1), generator=gen)


def microbatch(model: ModelSpec, layout: Layout, seed: int, step: int, dp_rank: int, mb: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), each [s, b] (sequence first, as the kernels take them)."""
    b, m = layout.micro_batch, layout.num_microbatches
    rows = batch(model, layout.global_batch, seed, step)[(dp_rank * m + mb) * b:
                                                         (dp_rank * m + mb + 1) * b]
    return rows[:, :-1].t().contiguous(), rows[:, 1:].t().contiguous()


class ReferenceGPT:
    """Full parameters by (unit, name); the output layer is the word embedding when tied.
    An MoE model needs the `layout`: routing is per rank's tokens (`executor.routing`)."""

    def __init__(self, model: ModelSpec, seed: int, layout: Layout | None = None) -> None:
        self.model, self.layout = model, layout
        self.params: dict[tuple[Unit, str], torch.Tensor] = {}
        units = [EMBED, *(layer_unit(i) for i in range(model.layers)), HEAD]
        for unit in units:
            for name, tensor in init_full_unit(model, unit, seed).items():
                if unit == HEAD and name == "output" and model.tied_embeddings:
                    continue
                self.params[(unit, name)] = tensor.clone().requires_grad_()

    def p(self, unit: Unit, name: str) -> torch.Tensor:
        return self.params[(unit, name)]

    def loss(self, rows: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of [B, s + 1] token rows."""
        m = self.model
        tokens, targets = rows[:, :-1], rows[:, 1:]
        x = F.embedding(tokens, self.p(EMBED, "word"))
        if m.position == "learned":
            x = x + self.p(EMBED, "pos")[:m.seq_len]
        for i in range(m.layers):
            x = self._block(x, layer_unit(i)) if not is_moe_layer(m, i) else \
                self._moe(self._attention(x, layer_unit(i)), i)
        x = self._norm(x, HEAD, "final_ln")
        out = self.p(EMBED, "word") if m.tied_embeddings else self.p(HEAD, "output")
        logits = x @ out.t()
        return F.cross_entropy(logits.reshape(-1, m.vocab), targets.reshape(-1))

    def _bias(self, u: Unit, name: str) -> torch.Tensor | float:
        return self.p(u, f"{name}.bias") if self.model.bias else 0.0

    def _norm(self, x: torch.Tensor, u: Unit, name: str) -> torch.Tensor:
        w = self.p(u, f"{name}.weight")
        if self.model.norm == "rmsnorm":
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + LN_EPS) * w
        return F.layer_norm(x, (x.shape[-1],), w, self.p(u, f"{name}.bias"), LN_EPS)

    def _mla(self, y: torch.Tensor, u: Unit) -> torch.Tensor:
        """Latent attention (`traces.mla`), batch-first and unsharded: [B, s, a·d_v]."""
        m = self.model
        B, s, _ = y.shape
        a, d, r, dv = m.heads, m.head_dim, m.qk_rope_head_dim, m.v_head_dim
        qr, kr = m.q_lora_rank, m.kv_lora_rank
        down = y @ self.p(u, "mla_down.weight").t()
        c_q, c_kv, k_pe = down[..., :qr], down[..., qr:qr + kr], down[..., qr + kr:]
        q_in = self._rms(c_q, self.p(u, "q_norm.weight")) if qr else y
        q = (q_in @ self.p(u, "q_up.weight").t()).reshape(B, s, a, d + r)
        kv = (self._rms(c_kv, self.p(u, "kv_norm.weight")) @ self.p(u, "kv_up.weight").t())
        kv = kv.reshape(B, s, a, d + dv)
        q = torch.cat([q[..., :d], _rotary(q[..., d:])], dim=-1)
        k_rot = _rotary(k_pe.reshape(B, s, 1, r)).expand(B, s, a, r)
        k = torch.cat([kv[..., :d], k_rot], dim=-1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), kv[..., d:].transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d + r)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return (probs @ v).transpose(1, 2).reshape(B, s, a * dv)

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + LN_EPS) * w

    def _block(self, x: torch.Tensor, u: Unit) -> torch.Tensor:
        return self._mlp(self._attention(x, u), u)

    def _attention(self, x: torch.Tensor, u: Unit) -> torch.Tensor:
        """x plus the layer's attention (before ln2)."""
        m = self.model
        B, s, _ = x.shape
        a, g, d = m.heads, m.kv_heads, m.head_dim
        y = self._norm(x, u, "ln1")
        if m.mla:
            return x + self._mla(y, u) @ self.p(u, "proj.weight").t()
        qkv = y @ self.p(u, "qkv.weight").t() + self._bias(u, "qkv")
        q, k, v = qkv.split([a * d, g * d, g * d], dim=-1)
        q, k, v = q.reshape(B, s, a, d), k.reshape(B, s, g, d), v.reshape(B, s, g, d)
        if m.qk_norm:  # per head over its d channels, before rotation (`traces.heads`)
            q, k = self._norm(q, u, "q_layernorm"), self._norm(k, u, "k_layernorm")
        if m.position == "rope":
            q, k = _rotary(q), _rotary(k)
        group = torch.arange(a) // (a // g)  # the key/value head of each query head
        q, k, v = q.transpose(1, 2), k[:, :, group].transpose(1, 2), v[:, :, group].transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, s, a * d)
        return x + ctx @ self.p(u, "proj.weight").t() + self._bias(u, "proj")

    def _mlp(self, x: torch.Tensor, u: Unit) -> torch.Tensor:
        m = self.model
        y = self._norm(x, u, "ln2")
        y = y @ self.p(u, "fc1.weight").t() + self._bias(u, "fc1")
        if m.ffn == "swiglu":
            gate, up = y[..., :m.ffn_hidden], y[..., m.ffn_hidden:]
            y = gate * torch.sigmoid(gate) * up
        else:
            y = F.gelu(y)
        return x + y @ self.p(u, "fc2.weight").t() + self._bias(u, "fc2")

    def _moe(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x plus the routed experts' outputs: each token's kept choices, each expert's MLP
        on its tokens times the gate, summed per token; routed per rank's tokens."""
        m, u = self.model, layer_unit(layer)
        B, s, h = x.shape
        y = self._norm(x, u, "ln2").reshape(B * s, h)
        logits = y @ self.p(u, "router.weight").t()
        w1, w2 = self.p(u, "experts.fc1.weight"), self.p(u, "experts.fc2.weight")
        out = torch.zeros_like(y)
        assert self.layout is not None, "an MoE reference routes by the layout's ranks"
        for rows in routing_groups(self.layout, s):
            r = route(m, layer, len(rows))
            chosen = logits[rows].gather(1, r.experts)
            if m.moe_router_score_function == "sigmoid":  # DeepSeek-V3 eq. 13: normalised
                gate = torch.sigmoid(chosen)
                gate = gate / (gate.sum(dim=-1, keepdim=True) + 1e-20)
            else:
                gate = torch.softmax(chosen, dim=-1)
            mine = torch.zeros(len(rows), h)
            for e in range(m.experts):
                token, choice = ((r.experts == e) & r.kept).nonzero(as_tuple=True)
                z = y[rows][token] @ w1[e].t()
                if m.ffn == "swiglu":
                    z = F.silu(z[:, :m.moe_ffn_hidden]) * z[:, m.moe_ffn_hidden:]
                else:
                    z = F.gelu(z)
                mine = mine.index_add(0, token, gate[token, choice, None] * (z @ w2[e].t()))
            out = out.index_add(0, rows, mine)
        return x + out.reshape(B, s, h)


def routing_groups(layout: Layout, seq_len: int) -> list[torch.Tensor]:
    """Each rank's routed tokens as indices into the flattened [B, s] batch, in the rank's
    order (sequence first, [s/(cp·t), b]): DP rank d, micro-batch i, CP rank c, TP rank r
    hold rows (d·m + i)·b + [0, b) at the positions of CP rank c's two chunks
    (`kernels.local_positions`), of which SP's shard r."""
    b, m, t, cp = layout.micro_batch, layout.num_microbatches, layout.tp, layout.cp
    n = seq_len // (cp * t)
    out = []
    for d in range(layout.dp):
        for i in range(m):
            for c in range(cp):
                for r in range(t):
                    pos = local_positions(seq_len, cp, c)[r * n:(r + 1) * n]
                    row = (d * m + i) * b + torch.arange(b)
                    out.append((row[None, :] * seq_len + pos[:, None]).reshape(-1))
    return out


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """[B, s, heads, d] rotated by position: the pairs (x_i, x_{i+d/2}) as complex numbers
    times e^{i·p·θ_i}, θ_i = 10000^(-2i/d) (RoFormer; the rotate-half pairing)."""
    B, s, n, d = x.shape
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones(s, d // 2, dtype=torch.float64),
                       torch.arange(s, dtype=torch.float64)[:, None] * theta[None, :])
    pairs = torch.complex(x[..., :d // 2].double(), x[..., d // 2:].double())
    rotated = pairs * turn[None, :, None, :]
    return torch.cat([rotated.real, rotated.imag], dim=-1).to(x.dtype)


@dataclass(frozen=True, slots=True)
class ReferenceRun:
    losses: list[float]
    """Loss of each step (before its update)."""
    params: dict[tuple[Unit, str], torch.Tensor]
    """After the last step."""
    first_grads: dict[tuple[Unit, str], torch.Tensor]
    """Gradients of the first step (before clipping)."""
    grad_norms: list[float]
    """Each step's global gradient norm before clipping (empty when not clipped)."""


def train(model: ModelSpec, global_batch: int, steps: int, seed: int,
          adamw: AdamWConfig | None = None, clip_grad: float | None = 1.0,
          layout: Layout | None = None) -> ReferenceRun:
    """Train the reference for `steps` AdamW steps (fp32), the gradients clipped to a global
    norm of `clip_grad` by torch.nn.utils.clip_grad_norm_ (None: not clipped); an MoE model
    routes by `layout`'s ranks."""
    assert model.dtype == "fp32", "the reference runs in fp32"
    c = adamw or AdamWConfig()
    ref = ReferenceGPT(model, seed, layout)
    opt = torch.optim.AdamW(list(ref.params.values()), lr=c.lr, betas=(c.beta1, c.beta2),
                            eps=c.eps, weight_decay=c.weight_decay, foreach=False)
    losses, first, norms = [], {}, []
    for step in range(steps):
        opt.zero_grad()
        loss = ref.loss(batch(model, global_batch, seed, step))
        loss.backward()
        if step == 0:
            first = {k: v.grad.clone() for k, v in ref.params.items() if v.grad is not None}
        if clip_grad is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(
                [p for p in ref.params.values() if p.grad is not None], clip_grad,
                foreach=False)))
        opt.step()
        losses.append(float(loss.detach()))
    return ReferenceRun(losses, {k: v.detach().clone() for k, v in ref.params.items()}, first,
                        norms)
