"""The single-process reference: the same GPT unsharded, plain autograd, torch.optim.AdamW.

Written independently of the kernels (batch-first, materialized causal attention,
F.cross_entropy), sharing with the executor only the seeded initialisation
(`params.init_full_unit`) and the synthetic data, so agreement is evidence, not tautology.

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

from executor.kernels import LN_EPS
from executor.optim import AdamWConfig
from executor.params import EMBED, HEAD, Unit, init_full_unit, layer_unit
from traces.layout import Layout
from traces.model import ModelSpec


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
    """Full parameters by (unit, name); the output layer is the word embedding when tied."""

    def __init__(self, model: ModelSpec, seed: int) -> None:
        self.model = model
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
        x = F.embedding(tokens, self.p(EMBED, "word")) + self.p(EMBED, "pos")[:m.seq_len]
        for i in range(m.layers):
            x = self._block(x, layer_unit(i))
        x = F.layer_norm(x, (m.hidden,), self.p(HEAD, "final_ln.weight"),
                         self.p(HEAD, "final_ln.bias"), LN_EPS)
        out = self.p(EMBED, "word") if m.tied_embeddings else self.p(HEAD, "output")
        logits = x @ out.t()
        return F.cross_entropy(logits.reshape(-1, m.vocab), targets.reshape(-1))

    def _block(self, x: torch.Tensor, u: Unit) -> torch.Tensor:
        m = self.model
        B, s, h = x.shape
        a, d = m.heads, m.hidden // m.heads
        y = F.layer_norm(x, (h,), self.p(u, "ln1.weight"), self.p(u, "ln1.bias"), LN_EPS)
        q, k, v = (y @ self.p(u, "qkv.weight").t() + self.p(u, "qkv.bias")).split(h, dim=-1)
        q, k, v = (t.reshape(B, s, a, d).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, s, h)
        x = x + ctx @ self.p(u, "proj.weight").t() + self.p(u, "proj.bias")
        y = F.layer_norm(x, (h,), self.p(u, "ln2.weight"), self.p(u, "ln2.bias"), LN_EPS)
        y = F.gelu(y @ self.p(u, "fc1.weight").t() + self.p(u, "fc1.bias"))
        return x + y @ self.p(u, "fc2.weight").t() + self.p(u, "fc2.bias")


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
          adamw: AdamWConfig | None = None, clip_grad: float | None = 1.0) -> ReferenceRun:
    """Train the reference for `steps` AdamW steps (fp32), the gradients clipped to a global
    norm of `clip_grad` by torch.nn.utils.clip_grad_norm_ (None: not clipped)."""
    assert model.dtype == "fp32", "the reference runs in fp32"
    c = adamw or AdamWConfig()
    ref = ReferenceGPT(model, seed)
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
