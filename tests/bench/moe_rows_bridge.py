"""NVIDIA's MoE rows (Megatron-Bridge) and DeepSeek's own H800 figure, for
`bench_moe_recipes.py`, entered as stated.

1. Megatron-Bridge "Performance" page (docs.nvidia.com/nemo/megatron-bridge/latest/
   performance-summary.html; the same tables in NVIDIA-NeMo/Megatron-Bridge
   docs/performance-summary.md @df0289c, 26.02 and 25.11 containers, and
   docs/performance-summary-archive.md @4da7335, 25.09; read 2026-12-05): every DeepSeek-V3,
   Qwen3-30B-A3B and Qwen3-235B-A22B row on H100, B200, B300, GB200 and GB300, tokens/s/GPU as
   published, with the row's GPUs, precision, GBS, MBS, TP, PP, VP and EP ("n/a" VP: none).
   The page: "we force-balance the token distribution among experts and all benchmarks are
   token-dropless" (parasim's balanced routing, no capacity). The 25.09 rows marked
   "tokendrop" state no capacity factor and are left out; its H100 DeepSeek-V3 "dropless" row
   (the issue's 1,297) is in. Its precision column is missing: the row's figure is the FP8
   one without the parenthesized "128x128 weights, 1x128 activations" granularity, i.e. the
   recipes' default FP8 current scaling ("tensorwise").
   What the table does not state comes from the recipes (NVIDIA-NeMo/Megatron-Bridge
   scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @0426418 and
   qwen/qwen3_workload_base_configs.py @01b2977): expert TP 1; the token dispatcher
   (`moe_flex_dispatcher_backend = "hybridep"` for every DeepSeek-V3 and Qwen3-30B-A3B recipe and
   the GB200/GB300 Qwen3-235B ones; "alltoall" on B200, B300 and H100 235B) and
   `moe_a2a_overlap` (H100 235B and the FP8-MX DeepSeek-V3 Blackwell recipes): the keys parasim
   lacks (`needs`). Those are today's recipes; an older container's may have differed. Where
  HybridEP's all-to-all overlaps compute, its kernels hold Megatron-Core's default 16 SMs
  (moe_hybridep_num_sms; the DeepSeek-V3 workload presets set none: `traces.moe_overlap.comm_sms`).
   `moe_probs_in_activation` true on every row: the routing probabilities applied in the
   experts' activation, as Megatron-Core does from 0.12.1 (CHANGELOG 0.13.0; `traces.moe_probs`),
   with no option to turn it off; these containers (2025-09 on) postdate 0.13 (2025/07, the
   MoE README's "What's New"), and the recipes' hybridep dispatcher is 0.15's.
   Gradients accumulated and reduced in bf16: the scripts' common settings set
   `cfg.mixed_precision.grad_reduce_in_fp32 = False` and `cfg.ddp.grad_reduce_in_fp32 = False`
   (scripts/performance/configs/qwen/qwen3_llm_pretrain.py @05c0c90 set_qwen3_common_configs;
   deepseek/deepseek_v3_llm_pretrain.py @27dfb3d, every DeepSeek-V3 config), so Megatron's
   DDP keeps its main gradients in the parameters' bf16 (its grad buffer is fp32 only with
   grad_reduce_in_fp32), as the dense Bridge rows state (`recipes_bridge.py`). FP8 rows gather
   their FP8 weights (`fp8_param_gather`): the scripts' get_precision_config takes
   bf16_with_fp8_current_scaling_mixed (FP8-CS) or bf16_with_mxfp8_mixed (FP8-MX), both with
   fp8_param_gather = True (training/mixed_precision.py @0509780; `recipes_bridge.py`).
   Qwen3-235B's 94 layers + embedding + loss = 96 divide every published PP x VP, as Megatron's
   account_for_embedding/loss_in_pipeline_split make them. Recomputation as the recipes set it
   (`RECOMPUTE`). CUDA graphs (other than `--host`'s launch model), the fused kernels and the
   full-iteration graph's paged stash the recipes set are not modelled (`RECOMPUTE`'s note).
2. DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437 (2024): "180K H800 GPU hours
   per trillion tokens" (§1 and Table 1), so tokens/s/GPU = 1e12 / (180e3 x 3600) = 1,543.2,
   on the run §3.2 describes (sim/examples/deepseek-v3-2048-h800.toml).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from moe_rows import MoeRow, deepseek_v3, qwen3
from recipes_bridge import PRECISION, cluster

from traces.moe_spec import TE_GEMM_STREAMS as _TE_STREAMS
from traces.recompute import MODELLED

BRIDGE = "Megatron-Bridge performance summary"
PAGES = {"26.02": f"{BRIDGE}, 26.02 container (docs/performance-summary.md @df0289c)",
         "25.11": f"{BRIDGE}, 25.11 container (docs/performance-summary.md @df0289c)",
         "25.09": f"{BRIDGE}, 25.09 container (docs/performance-summary-archive.md @4da7335)"}
PRECISIONS = {**PRECISION, "BF16": {"dtype": "bf16"}}
HYBRIDEP = ("model.dispatch=hybridep",)
OVERLAP = ("parallel.overlap_moe_comm",)


def bridge(release: str, system: str, model: str, precision: str, gpus: int, gbs: int,
           mbs: int, layout: tuple[int, int, int, int], tokens: float,
           needs: tuple[str, ...] = (), **extra: Any) -> MoeRow:
    """One row: `layout` is the page's (TP, PP, VP, EP) columns, VP 1 for "n/a"; its
    recipe's CUDA graphs from `GRAPHS`."""
    tp, pp, vp, ep = layout
    par: dict[str, Any] = {
        "tp": tp, "pp": pp, "vp": vp, "dp": gpus // (tp * pp), "ep": ep, "etp": 1,
        "schedule": "interleaved" if vp > 1 else "1f1b", "sp": tp > 1, "zero": 1,
        "fp32_main_grads": False, "micro_batch": mbs, "global_batch": gbs,
        **recompute(model, system, precision),
    }
    if precision in ("FP8-CS", "FP8-MX"):
        par["fp8_param_gather"] = True  # the scripts' precision configs (module docstring)
    if model.startswith("Qwen3-235B"):
        par.update(account_for_embedding=True, account_for_loss=True)
    par.update(extra.pop("parallel", {}))
    shape = (deepseek_v3(**PRECISIONS[precision], **extra) if model.startswith("DeepSeek")
             else qwen3("235b" if "235B" in model else "30b", **PRECISIONS[precision]))
    shape["moe_probs_in_activation"] = True  # Megatron-Core >= 0.13 (module docstring)
    shape["moe_gemm_streams"] = 0 if (model, system, precision) in CUTEDSL_MLP \
        else TE_GEMM_STREAMS
    if "model.dispatch=hybridep" in needs:
        shape["dispatch"] = "hybridep"
    if "parallel.overlap_moe_comm" in needs:
        par["overlap_moe_comm"] = True
    name = f"{release} {model} {system} {precision}, {gpus} GPUs"
    hardware = ({"preset": "dgx-b300", "nodes": gpus // 8} if system == "B300"
                else cluster(system, gpus))
    return MoeRow("bridge", name, PAGES[release], shape, par, hardware, tokens, "tokens/s",
                  needs, graphs=GRAPHS.get((model, system, precision), ""),
                  host=(model, system, precision) not in FULL_ITERATION)


TE_GEMM_STREAMS = _TE_STREAMS
"""The experts' grouped GEMM as Megatron-Core's TEGroupedMLP runs it (moe_grouped_gemm, TE's
GroupedLinear): Transformer Engine's nvte_multi_tensor_gemm takes its cuBLAS path on every
row here (Blackwell; H100's FP8, the CUTLASS grouped GEMM being Hopper BF16 with
NVTE_USE_CUTLASS_GROUPED_GEMM only), one cuBLAS GEMM per local expert, expert i's on compute
stream i % 4 (`traces.moe_spec.TE_GEMM_STREAMS`, the default of kernels = "fused" with
moe_grouped_gemm since `traces.moe_spec.gemm_streams`; stated on these rows all the same):
`model.moe_gemm_streams` (`sim.models.compute`)."""
CUTEDSL_MLP = {("DeepSeek-V3", "GB300", "FP8-MX"), ("DeepSeek-V3", "GB200", "FP8-MX"),
               ("DeepSeek-V3", "B300", "FP8-MX")}
"""Recipes whose experts run cutedsl_fused_grouped_mlp (`RECOMPUTE`'s note), not TE's
per-expert GEMMs: one grouped kernel, stated (moe_gemm_streams = 0)."""


FULL_ITERATION = {("DeepSeek-V3", "GB300", "FP8-MX"), ("DeepSeek-V3", "GB200", "FP8-MX"),
                  ("DeepSeek-V3", "B300", "FP8-MX")}
"""Recipes that capture the whole step in one CUDA graph (cuda_graph_impl "full_iteration":
scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @0426418, `RECOMPUTE`'s
note): no per-op launch parasim's host model could charge, so their rows run without it (the
closer reading: a replayed graph launches nothing op by op). Every other Bridge MoE recipe
launches from Megatron's eager loop, graphs at most the `GRAPHS` scopes, and pays its host:
`MoeRow.host`."""


GRAPHS = {
    ("Qwen3-30B-A3B", "GB300", "FP8-MX"): "moe_router moe_preprocess",
    ("Qwen3-30B-A3B", "GB200", "FP8-MX"): "moe_router moe_preprocess",
    ("Qwen3-30B-A3B", "B300", "FP8-MX"): "moe_router moe_preprocess",
    ("Qwen3-30B-A3B", "B200", "FP8-MX"): "attn moe_router moe_preprocess",
}
"""The recipes' cuda_graph_scope (cuda_graph_impl "transformer_engine"), Qwen3-30B-A3B only:
scripts/performance/configs/qwen/qwen3_workload_base_configs.py @01b2977,
QWEN3_30B_A3B_PRETRAIN_CONFIG_{GB300,GB200,B300,B200}_FP8_MX_V1; the H100 FP8_CS recipe sets
none. Used by `bench_moe_recipes.py --host`; other models' rows are left without."""


RECOMPUTE = {
    ("DeepSeek-V3", "GB300", "FP8-MX"): (),
    ("DeepSeek-V3", "GB300", "BF16"): ("moe_act",),
    ("DeepSeek-V3", "GB200", "FP8-MX"): ("mla_up_proj",),
    ("DeepSeek-V3", "GB200", "BF16"): ("mla_up_proj",),
    ("DeepSeek-V3", "B300", "FP8-MX"): ("mla_up_proj",),
    ("DeepSeek-V3", "B200", "FP8-MX"): ("mla_up_proj",),
    ("DeepSeek-V3", "H100", "FP8-CS"): ("mla_up_proj", "mlp"),
}
"""The recipes' recompute_modules, DeepSeek-V3 only, under recompute_granularity "selective"
(scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.py @27dfb3d, every config:
`cfg.model.recompute_granularity = "selective"`), no recompute_method / recompute_num_layers.
The modules: scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @0426418,
DEEPSEEK_V3_PRETRAIN_CONFIG_{GB300_FP8_MX, GB300_BF16, GB200_FP8_MX, GB200_BF16, B300_FP8_MX,
B200_FP8_MX (= B200_V1/V2), H100_FP8_CS}_V1/V2. GB300 FP8-MX's `recompute_modules=[]` under
"selective" recomputes nothing (Megatron-Core recomputes the attention core only with
"core_attn" listed): `recompute = "none"`. The @0426418 GB300 BF16 recipe is PP 4 x VP 4 x EP 64
while the 25.11 page's row is PP 2 x VP 4 x EP 32: its moe_act is taken as the row's, an
assumption. H100's "mlp" checkpoints the dense layers' MLP only (Megatron-Core
transformer_layer.py: `if "mlp" in recompute_modules: if not is_moe_layer: recompute_mlp`),
DeepSeek-V3's first 3 of 61 layers (`traces.recompute`).
Qwen3 (both sizes): scripts/performance/configs/qwen/qwen3_llm_pretrain.py @05c0c90
set_qwen3_common_configs sets recompute_granularity, recompute_method and recompute_num_layers
to None, and no Qwen3 workload config (qwen3_workload_base_configs.py @01b2977) sets
recompute_modules: no recomputation, `recompute = "none"`.
Set by the recipes and not modelled: moe_router_fusion = True (every recipe), CUDA graphs
(cuda_graph_impl "transformer_engine" with the scopes above except through `--host`;
cuda_graph_impl "full_iteration" on the DeepSeek-V3 GB300 / GB200 / B300 FP8-MX recipes, with
whatever its capture requires of the MoE), cutedsl_fused_grouped_mlp (DeepSeek-V3
FP8-MX GB300 / GB200 / B300), fp8_dot_product_attention (DeepSeek-V3 FP8-MX GB300 / B300),
bias_activation_fusion (Qwen3), tp_comm_overlap (Qwen3 Blackwell; no TP there)."""


def recompute(model: str, system: str, precision: str) -> dict[str, Any]:
    """The `parallel` recompute keys of the row's recipe (`RECOMPUTE`)."""
    modules = tuple(m for m in RECOMPUTE.get((model, system, precision), ()) if m in MODELLED)
    if not modules:
        return {"recompute": "none"}
    return {"recompute": "selective", "recompute_modules": list(modules)}


DSV3_LAYOUTS = {
    8: "Et*8|(t*8|)*6t*5{tail}",
    16: "Et*4|(t*4|)*14t{tail}",
    32: "Et|(tt|)*30{tail}",
}
"""DeepSeek-V3's 61 layers over pp x vp virtual stages, as Megatron-Bridge lays them out.
8 and 16 stages: `set_deepseek_v3_pipeline_model_parallel_layout`'s layout_map
(src/megatron/bridge/recipes/deepseek/deepseek_v3.py @355cef4: (4, 2) and (8, 1) give the
8-stage list, (4, 4), (8, 2) and (16, 1) the 16-stage one; the last stage ends in
["mtp"] * mtp_num_layers + ["loss"]). 32 stages: the H100 recipe's pp_layout "Et|(tt|)*30mL"
(scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @0426418). The map has
no (2, 4) or (8, 4) key (the 25.11 GB300 and GB200 FP8-MX rows): those rows take the recipes'
layout for the same number of virtual stages (Megatron-Core's layout is a list of virtual
stages, whatever pp and vp multiply to), an assumption the source does not state."""


def dsv3_layout(pp: int, vp: int, mtp: bool) -> dict[str, str]:
    """The `parallel` entry giving DeepSeek-V3's pipeline layout on pp x vp stages."""
    return {"pipeline_layout": DSV3_LAYOUTS[pp * vp].format(tail="mL" if mtp else "L")}


DSV3 = "DeepSeek-V3"
Q235 = "Qwen3-235B-A22B"
Q30 = "Qwen3-30B-A3B"
NO_MTP = {"mtp_layers": 0}  # the 25.11 rows marked "(w/o MTP)"
MTP = {"mtp_layers": 1}

ROWS_2602: list[MoeRow] = [
    # The GB300 recipe's pp_layout "Et*4|(t*4|)*14tmL": 16 virtual stages = PP 2 x VP 8.
    bridge("26.02", "GB300", DSV3, "FP8-MX", 256, 4096, 2, (1, 2, 8, 32), 4612,
           HYBRIDEP + OVERLAP, parallel={"pipeline_layout": "Et*4|(t*4|)*14tmL"}, **MTP),
    bridge("26.02", "GB200", DSV3, "FP8-MX", 256, 4096, 1, (1, 4, 4, 64), 3955,
           HYBRIDEP + OVERLAP, parallel=dsv3_layout(4, 4, mtp=True), **MTP),
    # The page's B300 run is PP 16 without VP; Megatron-Core refuses the overlapped expert
    # all-to-all there (it needs VP when PP > 1), so that run did not use the recipe's
    # moe_a2a_overlap (the @0426418 recipe's B300 FP8-MX is PP 8 x VP 2, a later layout).
    bridge("26.02", "B300", DSV3, "FP8-MX", 256, 4096, 1, (1, 16, 1, 8), 2983, HYBRIDEP,
           parallel=dsv3_layout(16, 1, mtp=True), **MTP),
    bridge("26.02", "B200", DSV3, "FP8-MX", 256, 4096, 1, (1, 16, 1, 8), 2689, HYBRIDEP,
           parallel=dsv3_layout(16, 1, mtp=True), **MTP),
    bridge("26.02", "GB300", Q30, "FP8-MX", 8, 512, 8, (1, 1, 1, 8), 30376, HYBRIDEP),
    bridge("26.02", "GB200", Q30, "FP8-MX", 8, 512, 4, (1, 1, 1, 8), 26084, HYBRIDEP),
    bridge("26.02", "B300", Q30, "FP8-MX", 8, 512, 8, (1, 1, 1, 8), 29521, HYBRIDEP),
    bridge("26.02", "B200", Q30, "FP8-MX", 8, 512, 1, (1, 1, 1, 8), 9691, HYBRIDEP),
    bridge("26.02", "H100", Q30, "FP8-CS", 16, 1024, 1, (1, 2, 12, 8), 2557, HYBRIDEP),
    bridge("26.02", "GB300", Q235, "FP8-MX", 256, 8192, 2, (1, 4, 1, 32), 6583, HYBRIDEP),
    bridge("26.02", "GB200", Q235, "FP8-MX", 256, 8192, 1, (1, 8, 1, 32), 5448, HYBRIDEP),
    bridge("26.02", "B300", Q235, "FP8-MX", 256, 8192, 1, (1, 8, 4, 8), 2691),
    bridge("26.02", "B200", Q235, "FP8-MX", 256, 8192, 1, (1, 8, 1, 8), 3805),
    bridge("26.02", "H100", Q235, "FP8-CS", 256, 8192, 1, (2, 8, 4, 32), 1633, OVERLAP),
]

ROWS_2511: list[MoeRow] = [
    bridge("25.11", "GB300", DSV3, "BF16", 256, 4096, 1, (1, 2, 4, 32), 3848, HYBRIDEP,
           parallel=dsv3_layout(2, 4, mtp=False), **NO_MTP),
    bridge("25.11", "GB300", DSV3, "FP8-MX", 256, 4096, 1, (1, 2, 4, 32), 4357,
           HYBRIDEP + OVERLAP, parallel=dsv3_layout(2, 4, mtp=False), **NO_MTP),
    bridge("25.11", "GB200", DSV3, "BF16", 256, 4096, 1, (1, 4, 4, 64), 3139, HYBRIDEP,
           parallel=dsv3_layout(4, 4, mtp=False), **NO_MTP),
    bridge("25.11", "GB200", DSV3, "FP8-MX", 256, 4096, 1, (1, 8, 4, 32), 4018,
           HYBRIDEP + OVERLAP, parallel=dsv3_layout(8, 4, mtp=False), **NO_MTP),
    bridge("25.11", "B200", DSV3, "FP8-MX", 256, 2048, 1, (1, 16, 1, 8), 2139, HYBRIDEP,
           parallel=dsv3_layout(16, 1, mtp=True), **MTP),
    bridge("25.11", "GB300", Q30, "FP8-MX", 8, 512, 4, (1, 1, 1, 8), 28934, HYBRIDEP),
    bridge("25.11", "GB200", Q30, "FP8-MX", 8, 512, 4, (1, 1, 1, 8), 23766, HYBRIDEP),
    bridge("25.11", "B200", Q30, "FP8-MX", 8, 512, 1, (1, 1, 1, 8), 9299, HYBRIDEP),
    bridge("25.11", "H100", Q30, "FP8-CS", 16, 512, 2, (1, 2, 24, 8), 5275, HYBRIDEP),
    bridge("25.11", "GB300", Q235, "BF16", 256, 8192, 2, (1, 4, 12, 16), 6131, HYBRIDEP),
    bridge("25.11", "GB200", Q235, "BF16", 256, 8192, 1, (1, 8, 3, 32), 4916, HYBRIDEP),
    bridge("25.11", "B200", Q235, "FP8-MX", 64, 1024, 1, (1, 8, 2, 8), 3269),
    bridge("25.11", "H100", Q235, "FP8-CS", 256, 2048, 1, (2, 8, 4, 32), 1575, OVERLAP),
]

ROWS_2509: list[MoeRow] = [
    # The H100 recipe's pp_layout "Et|(tt|)*30mL": 32 virtual stages = PP 8 x VP 4.
    bridge("25.09", "H100", DSV3, "FP8-CS", 1024, 8192, 1, (2, 8, 4, 64), 1297, HYBRIDEP,
           parallel={"pipeline_layout": "Et|(tt|)*30mL"}, **MTP),
]

BRIDGE_ROWS: list[MoeRow] = ROWS_2602 + ROWS_2511 + ROWS_2509

H800_TOML = Path(__file__).parents[2] / "sim" / "examples" / "deepseek-v3-2048-h800.toml"
H800_TOKENS_PER_S = 1e12 / (180e3 * 3600)
"""180K H800 GPU-hours per trillion tokens: 1e12 tokens / 6.48e8 GPU-seconds = 1,543.2."""


def deepseek_h800() -> MoeRow:
    """DeepSeek-V3's pre-training on 2,048 H800 as the shipped example states it (its comments cite
    the report), at the report's derived 1,543.2 tokens/s/GPU."""
    with H800_TOML.open("rb") as f:
        data = tomllib.load(f)
    needs = ("parallel.schedule=dualpipe", "model.router_groups", "model.dispatch=deepep",
             "parallel.overlap_moe_comm")
    return MoeRow("deepseek", "DeepSeek-V3 2,048 H800 (DualPipe, EP64, FP8)",
                  "DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437, §1, §3.2, "
                  "Table 1", data["model"], data["parallel"], data["cluster"],
                  H800_TOKENS_PER_S, "tokens/s", needs)


DEEPSEEK_ROWS: list[MoeRow] = [deepseek_h800()]
