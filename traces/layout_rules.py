"""The rules that tie a parallel layout to a model and a cluster: TP dividing the model's
widths, whole layers per (virtual) stage, CP's sequence split, the expert grid, TP inside one
node."""

from __future__ import annotations

from traces.cpu_offload import check_with_model as check_offload
from traces.errors import ConfigError
from traces.expert_grid import check_experts
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_overlap import check_moe_overlap
from traces.recompute import check_with_model
from traces.split_rules import check_split


def check_layout(model: ModelSpec, layout: Layout, *, world: int | None = None,
                 devices_per_server: int | None = None) -> tuple[str, ...]:
    """The rules that tie a layout to a model (and to a cluster's `world` size and
    `devices_per_server`, when given): raise ConfigError naming the first broken one; return
    notes for combinations that work but are slow (TP groups straddling servers)."""
    if world is not None and layout.world != world:
        raise ConfigError(f"parallel: tp {layout.tp} x cp {layout.cp} x pp {layout.pp} x "
                          f"dp {layout.dp} = {layout.world} ranks, but the cluster has "
                          f"{world} GPUs")
    tp = layout.tp
    if model.hidden % tp:
        raise ConfigError(f"parallel.tp: {tp} does not divide model.hidden = {model.hidden}")
    if model.heads % tp:
        raise ConfigError(f"parallel.tp: {tp} does not divide model.heads = {model.heads}")
    if model.kv_heads % tp:  # Megatron-Core: each TP rank holds whole query groups
        raise ConfigError(f"parallel.tp: {tp} does not divide model.kv_heads = "
                          f"{model.kv_heads} (each TP rank holds whole key/value heads)")
    if model.ffn_hidden % tp or model.vocab % tp:
        raise ConfigError(f"parallel.tp: {tp} must divide model.ffn_hidden "
                          f"({model.ffn_hidden}) and model.vocab ({model.vocab})")
    if model.mla and layout.tp_comm_overlap and layout.tp > 1:
        raise ConfigError("parallel.tp_comm_overlap: Transformer Engine's overlap of latent "
                          "attention (model.kv_lora_rank) is not modelled; set it false")
    _check_stages(model, layout)
    _check_context(model, layout)
    check_experts(model, layout)
    check_moe_overlap(model, layout)
    check_with_model(model, layout)
    check_offload(model, layout)
    if devices_per_server is None:
        return ()
    if tp > devices_per_server:
        raise ConfigError(f"parallel.tp: {tp} is larger than a node "
                          f"({devices_per_server} GPUs); tensor parallelism must stay inside one")
    if devices_per_server % tp:
        return (f"parallel.tp: {tp} does not divide the {devices_per_server} GPUs of a node, "
                "so some TP groups cross nodes (slow); the step is simulated with every rank, "
                "unfolded",)
    return ()


def _check_stages(model: ModelSpec, layout: Layout) -> None:
    """Every virtual stage holds a whole number of layers, as Megatron-Core splits them
    (`traces.split_rules`)."""
    check_split(layout.split(model))


def _check_context(model: ModelSpec, layout: Layout) -> None:
    """CP's sequence split (2·cp chunks) and SP's split of a CP rank's tokens."""
    cp, tp = layout.cp, layout.tp
    if cp > 1 and model.seq_len % (2 * cp):
        raise ConfigError(f"parallel.cp: model.seq_len = {model.seq_len} is not divisible by "
                          f"2 x cp = {2 * cp} (the sequence is split into 2·cp chunks, two "
                          "per rank, so causal attention balances)")
    if cp > 1 and model.attention != "flash":
        raise ConfigError(f"parallel.cp: {cp} needs model.attention = \"flash\" (Transformer "
                          "Engine's context-parallel attention is a fused kernel)")
    if layout.sp and (model.seq_len // cp) % tp:
        tokens = f"model.seq_len / cp = {model.seq_len // cp}" if cp > 1 else \
            f"model.seq_len = {model.seq_len}"
        raise ConfigError(f"parallel.sp: {tokens} is not divisible by tp = {tp}")
