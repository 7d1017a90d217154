"""Parameters: units, their tensors per tensor-parallel rank, one seeded initialisation, flat
buffers.

A rank's parameters are grouped in *units*, the granularity at which ZeRO-3 gathers parameters
and the plan counts them (docs/plan-ops.md): `head` (final norm, and output weights when the
rank holds its own), the layers `L<i>`, and `embed` (word embeddings and positions). Listed in
backward order (head, last layer ... first layer, embed) they tile the rank's flat gradient
buffer, which gradient buckets cut in order.

Inside a unit, parameters lie in the reverse of their first use in forward (so the last one
used in forward, whose gradient is ready first, comes first). Every rank builds the same full
model from one seed — each unit from its own generator, so a rank only makes the units it holds
— and keeps its tensor-parallel shard:

    column-parallel  qkv (by heads: each rank's query heads, then its key and value heads),
                     fc1 (SwiGLU: each rank's rows of the gate and of the up projection),
                     word and output embeddings (rows)
    row-parallel     proj, fc2 (input columns)
    replicated       layer norms, proj and fc2 biases, positions (partial gradients under SP)

qk_norm (`traces.heads`) adds q_layernorm.weight and k_layernorm.weight (and their biases
with LayerNorm) after qkv's, replicated: each rank's gradient covers only its heads, so it is
partial over TP with or without SP (Megatron-Core's names, whose gradients it all-reduces).

Latent attention (`traces.mla`) has mla_down.weight, q_norm.weight (with q_lora_rank),
kv_norm.weight (replicated: their gradients are partial over TP, each rank back-propagating its
heads), q_up.weight and kv_up.weight (column-parallel by heads) and proj.weight of a·d_v
columns (row-parallel) in place of qkv and its bias.

An MoE layer (`traces.moe_spec.is_moe_layer`) has the router, router.weight [E, h]
(replicated: partial gradients under SP), in place of fc1 and fc2; its routed experts are drawn
with the layer (`expert_shapes`) but live apart, EP-sharded (`executor.experts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.purpose import EMBED, HEAD, Unit

__all__ = ["DTYPES", "EMBED", "HEAD", "INIT_STD", "ParamSpec", "Unit", "build_unit_params",
           "expert_shapes",
           "has_param", "holds_output_weights", "init_full_unit", "layer_unit", "tp_shard",
           "unit_layer", "unit_numel", "unit_specs", "units_of_rank"]
INIT_STD = 0.02  # GPT-2 / Megatron's init_method_std
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def layer_unit(layer: int) -> Unit:
    return Unit.of_layer(layer)


def unit_layer(unit: Unit) -> int | None:
    """The layer index of a layer's unit, None for embed / head."""
    return unit.layer


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter tensor as one tensor-parallel rank holds it."""

    name: str
    shape: tuple[int, ...]
    tp_split: bool
    """Sharded over the TP group (else replicated on every TP rank)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def sp_partial(self) -> bool:
        """Replicated parameters used on sequence shards: SP makes their gradients partial."""
        return not self.tp_split


def holds_output_weights(model: ModelSpec, layout: Layout, pp_rank: int) -> bool:
    """The head unit has its own output weights unless they are the embedding tensor itself
    (tied embeddings with the first stage on the same rank)."""
    return not (model.tied_embeddings and 0 in layout.stages_of_rank(pp_rank))


def unit_specs(model: ModelSpec, layout: Layout, unit: Unit, pp_rank: int) -> list[ParamSpec]:
    """The unit's parameters on one TP rank, in flat order (reverse of first forward use)."""
    h, f, t, V = model.hidden, model.ffn_hidden, layout.tp, model.vocab
    if unit == EMBED:
        forward = [ParamSpec("word", (V // t, h), True),
                   ParamSpec("pos", (model.seq_len, h), False)]
    elif unit == HEAD:
        forward = [ParamSpec("final_ln.weight", (h,), False),
                   ParamSpec("final_ln.bias", (h,), False)]
        if holds_output_weights(model, layout, pp_rank):
            forward.append(ParamSpec("output", (V // t, h), True))
    else:
        qkv, f1 = model.q_width + 2 * model.kv_width, model.fc1_width
        attention = [ParamSpec(name, (shape[0] // t if split else shape[0], *shape[1:]), split)
                     for name, shape, split in _mla_shapes(model)] if model.mla else [
            ParamSpec("qkv.weight", (qkv // t, h), True),
            ParamSpec("qkv.bias", (qkv // t,), True),
            *(ParamSpec(name, shape, False) for name, (shape, _) in _qk_norms(model).items())]
        forward = [
            ParamSpec("ln1.weight", (h,), False), ParamSpec("ln1.bias", (h,), False),
            *attention,
            ParamSpec("proj.weight", (h, model.heads * _v_dim(model) // t), True),
            ParamSpec("proj.bias", (h,), False),
            ParamSpec("ln2.weight", (h,), False), ParamSpec("ln2.bias", (h,), False),
            *([ParamSpec("router.weight", (model.experts, h), False)] if _moe(model, unit) else [
                ParamSpec("fc1.weight", (f1 // t, h), True),
                ParamSpec("fc1.bias", (f1 // t,), True),
                ParamSpec("fc2.weight", (h, f // t), True), ParamSpec("fc2.bias", (h,), False)]),
        ]
    return [spec for spec in forward[::-1] if has_param(model, spec.name)]


def _moe(model: ModelSpec, unit: Unit) -> bool:
    return unit.layer is not None and is_moe_layer(model, unit.layer)


def expert_shapes(model: ModelSpec, experts: int) -> dict[str, tuple[int, ...]]:
    """An MoE layer's routed experts, `experts` of them stacked (`executor.experts`): fc1
    [n, f1, h] (SwiGLU: [gate | up], f1 = 2f) and fc2 [n, h, f], f = moe_ffn_hidden."""
    h, f = model.hidden, model.moe_ffn_hidden
    f1 = 2 * f if model.ffn == "swiglu" else f
    return {"experts.fc1.weight": (experts, f1, h), "experts.fc2.weight": (experts, h, f)}


def _mla_shapes(model: ModelSpec) -> list[tuple[str, tuple[int, ...], bool]]:
    """Latent attention's tensors before proj, in forward order: (name, full shape, split
    over TP by rows)."""
    h, a, qr, kr = model.hidden, model.heads, model.q_lora_rank, model.kv_lora_rank
    d, r = model.head_dim, model.qk_rope_head_dim
    norm_q = [("q_norm.weight", (qr,), False)] if qr else []
    return [("mla_down.weight", (qr + kr + r, h), False), *norm_q,
            ("kv_norm.weight", (kr,), False), ("q_up.weight", (a * (d + r), qr or h), True),
            ("kv_up.weight", (a * (d + model.v_head_dim), kr), True)]


def _qk_norms(model: ModelSpec) -> dict[str, tuple[tuple[int, ...], float]]:
    """qk_norm's tensors (`traces.heads`), forward order: (shape, initial mean); weights of d
    shared by the heads, so every TP rank holds them whole."""
    d = (model.head_dim,)
    return {"q_layernorm.weight": (d, 1.0), "q_layernorm.bias": (d, 0.0),
            "k_layernorm.weight": (d, 1.0), "k_layernorm.bias": (d, 0.0)}


def _v_dim(model: ModelSpec) -> int:
    return model.v_head_dim if model.mla else model.head_dim


def has_param(model: ModelSpec, name: str) -> bool:
    """Whether the model has parameter `name`: no linear biases without `bias`, no norm
    biases with RMSNorm, no position table with rotary positions."""
    if name in ("qkv.bias", "proj.bias", "fc1.bias", "fc2.bias"):
        return model.bias
    if name.startswith(("q_layernorm.", "k_layernorm.")):
        return model.qk_norm and (name.endswith("weight") or model.norm == "layernorm")
    if name.endswith("ln.bias") or name in ("ln1.bias", "ln2.bias"):
        return model.norm == "layernorm"
    return name != "pos" or model.position == "learned"


def units_of_rank(model: ModelSpec, layout: Layout, pp_rank: int) -> list[Unit]:
    """The rank's units in backward order: head, its layers from last to first, embed."""
    stages = layout.stages_of_rank(pp_rank)
    layers = sorted((i for s in stages for i in layout.layers_of_stage(model, s)), reverse=True)
    units = [HEAD] if layout.num_stages - 1 in stages else []
    units += [layer_unit(i) for i in layers]
    if 0 in stages:
        units.append(EMBED)
    return units


def unit_numel(model: ModelSpec, layout: Layout, unit: Unit, pp_rank: int) -> int:
    return sum(p.numel for p in unit_specs(model, layout, unit, pp_rank))


# --- one seeded full model -------------------------------------------------------------------

def _generator(seed: int, index: int) -> torch.Generator:
    # One stream per unit: a rank builds only its units, and they equal the reference's.
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


def _normal(shape: tuple[int, ...], gen: torch.Generator, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * INIT_STD + mean


def init_full_unit(model: ModelSpec, unit: Unit, seed: int) -> dict[str, torch.Tensor]:
    """The unit's unsharded fp32 tensors. Biases and norms get noise too, so a bug that drops
    or misplaces one changes the numbers. `head` always includes `output`: the untied output
    weights, or with tied embeddings a copy of the word embeddings."""
    h, f, V = model.hidden, model.ffn_hidden, model.vocab
    if unit == EMBED:
        gen = _generator(seed, 0)
        return _drawn(model, gen, {"word": ((V, h), 0.0), "pos": ((model.seq_len, h), 0.0)})
    if unit == HEAD:
        gen = _generator(seed, model.layers + 1)
        out = _drawn(model, gen, {"final_ln.weight": ((h,), 1.0), "final_ln.bias": ((h,), 0.0)})
        out["output"] = (_normal((V, h), gen) if not model.tied_embeddings
                         else init_full_unit(model, EMBED, seed)["word"])
        return out
    layer = unit_layer(unit)
    assert layer is not None and 0 <= layer < model.layers, unit
    gen = _generator(seed, layer + 1)
    qkv, f1 = model.q_width + 2 * model.kv_width, model.fc1_width
    attention = {name: (shape, 1.0 if name.endswith("norm.weight") else 0.0)
                 for name, shape, _ in _mla_shapes(model)} if model.mla else {
        "qkv.weight": ((qkv, h), 0.0), "qkv.bias": ((qkv,), 0.0), **_qk_norms(model)}
    mlp = {"router.weight": ((model.experts, h), 0.0),
           **{name: (shape, 0.0) for name, shape in expert_shapes(model, model.experts).items()}
           } if _moe(model, unit) else {
        "fc1.weight": ((f1, h), 0.0), "fc1.bias": ((f1,), 0.0),
        "fc2.weight": ((h, f), 0.0), "fc2.bias": ((h,), 0.0)}
    return _drawn(model, gen, {
        "ln1.weight": ((h,), 1.0), "ln1.bias": ((h,), 0.0), **attention,
        "proj.weight": ((h, model.heads * _v_dim(model)), 0.0), "proj.bias": ((h,), 0.0),
        "ln2.weight": ((h,), 1.0), "ln2.bias": ((h,), 0.0), **mlp,
    })


def _drawn(model: ModelSpec, gen: torch.Generator,
           shapes: dict[str, tuple[tuple[int, ...], float]]) -> dict[str, torch.Tensor]:
    """The model's parameters among `shapes` (name: shape, mean), drawn in order."""
    return {name: _normal(shape, gen, mean) for name, (shape, mean) in shapes.items()
            if has_param(model, name)}


def tp_shard(model: ModelSpec, name: str, full: torch.Tensor, tp: int, tp_rank: int
             ) -> torch.Tensor:
    """One TP rank's piece of a full tensor (a copy); replicated tensors come back whole."""
    a, g = model.heads, model.kv_heads
    if tp == 1:
        return full.clone()
    if name in ("qkv.weight", "qkv.bias"):
        # [(a + 2g)d, ...] as q (a heads), k, v (g heads each): each rank its heads of each.
        d, rest = model.head_dim, full.shape[1:]
        parts = full.split([a * d, g * d, g * d])
        return torch.cat([part.reshape(n, d, *rest).chunk(tp)[tp_rank].reshape(-1, *rest)
                          for part, n in zip(parts, (a, g, g))]).clone()
    if name in ("fc1.weight", "fc1.bias") and model.ffn == "swiglu":
        # [gate | up] of f rows each: each rank its rows of both.
        return torch.cat([half.chunk(tp)[tp_rank] for half in full.chunk(2)]).clone()
    if name in ("fc1.weight", "fc1.bias", "word", "output", "q_up.weight", "kv_up.weight"):
        # (q_up and kv_up: rows grouped by head, so each rank its a/t heads' rows)
        return full.chunk(tp, dim=0)[tp_rank].clone()
    if name in ("proj.weight", "fc2.weight"):
        return full.chunk(tp, dim=1)[tp_rank].clone()
    return full.clone()


# --- flat storage ----------------------------------------------------------------------------

class FlatUnit:
    """A unit's parameters (or gradients) as views into one flat tensor, in flat order.

    Parameter views are detached leaves that require grad: the kernels use them, autograd
    returns their gradients, and in-place updates of `flat` show through them.
    """

    __slots__ = ("specs", "flat", "views", "offsets")

    def __init__(self, specs: list[ParamSpec], flat: torch.Tensor, leaves: bool) -> None:
        assert flat.numel() == sum(s.numel for s in specs), "flat size matches the specs"
        self.specs, self.flat = specs, flat
        self.views: dict[str, torch.Tensor] = {}
        self.offsets: dict[str, int] = {}
        offset = 0
        for spec in specs:
            view = flat[offset:offset + spec.numel].view(spec.shape)
            self.views[spec.name] = view.detach().requires_grad_() if leaves else view
            self.offsets[spec.name] = offset
            offset += spec.numel


def build_unit_params(model: ModelSpec, layout: Layout, unit: Unit, pp_rank: int, tp_rank: int,
                      seed: int) -> torch.Tensor:
    """The unit's flat parameter tensor on one TP rank, in the model dtype."""
    specs = unit_specs(model, layout, unit, pp_rank)
    full = init_full_unit(model, unit, seed)
    parts = [tp_shard(model, s.name, full[s.name], layout.tp, tp_rank).reshape(-1) for s in specs]
    for spec, part in zip(specs, parts):
        assert part.numel() == spec.numel, f"{unit}.{spec.name}: shard size"
    return torch.cat(parts).to(DTYPES[model.dtype])
