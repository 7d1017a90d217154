"""A whole step's FLOPs: the kernels' sum (`model_flops`, what MFU counts), what
recomputation adds, Megatron-LM's `num_floating_point_operations` (an independent path to the
same count) and the Megatron-LM paper's closed form. The per-layer counts are `ModelSpec`'s.

Layer norms, dropouts, residuals and GeLU add no FLOPs but move memory. So one step of global
batch B without recomputation is 72*B*s*l*h^2*(1 + s/(6h) + V/(12lh)) FLOPs, and
96*B*s*l*h^2*(1 + s/(6h) + V/(16lh)) with full recomputation (f = 4h). The per-kernel FLOPs
and HBM bytes the plan carries are in `traces.kernels`; they add up to these forms.
"""

from __future__ import annotations

from traces import mla, op_sac
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer, num_moe_layers
from traces.mtp import megatron_mtp_term, mtp_forward_flops, mtp_indices


def model_flops(model: ModelSpec, global_batch: int) -> float:
    """FLOPs of one step without recomputation: forward plus backward (twice forward)."""
    per_sample = model.layers * model.attn_flops(1) + model.mlps_flops(1) + model.head_flops(1)
    return 3 * global_batch * (per_sample + mtp_forward_flops(model, 1))


def recompute_flops(model: ModelSpec, global_batch: int, recompute: str) -> float:
    """Extra forward FLOPs re-run in backward: whole blocks (full) or attention cores
    (selective); the logits are never recomputed."""
    mtp = mtp_indices(model)  # an MTP depth's layer is recomputed as the others
    if recompute == "full":
        return global_batch * ((model.layers + len(mtp)) * model.attn_flops(1)
                               + model.mlps_flops(1)
                               + sum(model.mlp_flops(1, 1, i) for i in mtp))
    if recompute == "selective":
        return global_batch * (model.layers + len(mtp)) * model.attn_core_flops(1)
    if recompute == "selective_op":  # torchtitan's per-op rule (traces.op_sac)
        return global_batch * model.seq_len * (model.layers + len(mtp)) * \
            op_sac.recompute_flops_per_token(model)
    return 0.0


def megatron_num_flops(model: ModelSpec, global_batch: int, causal: bool = False) -> float:
    """Megatron-LM's `num_floating_point_operations` (megatron/training/training.py), written
    as it is there, with GQA (num_query_groups = kv_heads), kv_channels = head_dim and SwiGLU
    (gated multiplier 3/2):
    an independent path to `model_flops`, which sums the same GEMMs kernel by kernel. Its MLA
    branch (`traces.mla.megatron_mla_term`) counts the latent norms and a causal core.
    `causal`: the later version's standard-attention term, s/h halved for the causal mask
    (`seq_length / hidden_size / 2`, "Only half of the attention matrix is non-zero and needs
    to be multiplied with V"; in Megatron-LM by 250b794, training.py L361-362, as
    AI-Hypercomputer/maxtext issue 1972 quotes it); the MLA branch is causal either way."""
    B, s, h, V = global_batch, model.seq_len, model.hidden, model.vocab
    gated = 3 / 2 if model.ffn == "swiglu" else 1
    # Its MoE branch: dense layers at ffn_hidden, MoE layers at moe_ffn_hidden x top_k routed
    # plus the shared experts' width, each weighted by its share of the layers. With MTP: each
    # depth one more layer of the last layer's kind, one more logits, and its own addend.
    d = model.mtp_layers
    n = model.layers + d
    moe = num_moe_layers(model) + d * is_moe_layer(model, model.layers - 1)
    ffn = (model.ffn_hidden * (n - moe) + (model.top_k + model.shared_experts)
           * model.moe_ffn_hidden * moe) / n
    mlp_logits = 12 * B * s * n * h * h * (ffn / h * gated + V * (d + 1) / (2 * n * h)) \
        + megatron_mtp_term(model, global_batch)
    if model.mla:
        return 6 * B * s * n * mla.megatron_mla_term(model) + mlp_logits
    # The version with kv_channels (`traces.heads`): the attention term times
    # query_projection_to_hidden_size_ratio = kv_channels·a/h, exactly 1.0 when d = h/a.
    ratio = model.head_dim * model.heads / h
    core = s / h / 2 if causal else s / h
    return 12 * B * s * n * h * h * ((1 + model.kv_heads / model.heads + core) * ratio) \
        + mlp_logits


def megatron_step_flops(model: ModelSpec, global_batch: int, full_recompute: bool) -> float:
    """The Megatron-LM paper's closed form (Narayanan et al., 2021, eq. 3), f = 4h."""
    B, s, n, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96 * B * s * n * h * h * (1 + s / (6 * h) + V / (16 * n * h))
    return 72 * B * s * n * h * h * (1 + s / (6 * h) + V / (12 * n * h))
