"""Qwen3-30B-A3B rows outside the Megatron-Bridge performance page (`bench_moe_recipes.py`).

1. Megatron-Bridge's Qwen3-30B-A3B model card (NVIDIA-NeMo/Megatron-Bridge
   docs/models/qwen/qwen3-30b-a3b.md @411ee45, "Verified configurations"; the GB300 figure is
   PR #5720, 2026-08-20, "docs(model-card): verify Qwen3 30B-A3B GB300 performance", run on
   Megatron Bridge commit 0480586879f2513958fd8634fc529693ae13e536). Each entry states its
   GPUs, recipe, step time ("Step time · last 10 avg"), model TFLOP/s and tokens/s/GPU; the
   tokens/s are entered as published. Rows:
   - "Benchmark · GB300", FP8 MX: "On exactly 8 GB300s ... at TP1/PP1/CP1/EP8/ETP1, GBS/MBS
     512/8, and sequence length 4096 ... 5854.910 ms ... 44773.361 tokens/s/GPU"
     (512 x 4096 / 8 / 5.85491 s = 44,773.4: the units agree).
   - "Pretrain · Weak scaling · GB300" at 8, 32, 128 and 256 GPUs: "TP1/PP1/CP1/EP8/ETP1, MBS8,
     sequence length 4096, and GBS proportional to GPU count" (the commands' --global_batch_size
     512, 2048, 8192, 16384): 44,511.004, 45,086.158, 44,951.404, 45,052.607 tokens/s/GPU.
   - "Benchmark · H100", BF16, 16 H100 (`--nodes 2 --gpus-per-node 8`, recipe
     qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config): 20,147.290 ms, 13,011.378 tokens/s/GPU
     (1024 x 4096 / 16 / 20.14729 s = 13,011.4). Its card: "HybridEP permute fusion uses 32 SMs
     ..., expert-parallel communication overlap is active with delayed weight-gradient compute
     disabled, and Transformer Engine CUDA graph capture completes for all 48 graphable layers
     with moe_router and moe_preprocess scopes", and of its memory "peak allocated memory
     remains below 65 GiB/GPU" (checked: test_moe_recipes.py).
   The recipes (src/megatron/bridge/perf_recipes/qwen/gb300/qwen3_moe.py and h100/qwen3_moe.py,
   src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py, stored versions; the card's run commit's
   own copies are not in the corpus, an assumption that they are the same):
   - GB300 FP8-MX: TP 1, PP 1, EP 8, GBS 512, MBS 8, HybridEP, router fusion, forced balance,
     no recomputation, then `_enable_hybridep_full_iteration_mxfp8`
     (perf_recipes/qwen/common.py): cuda_graph_impl "full_iteration", moe_paged_stash,
     overlap_moe_expert_parallel_comm with delay_wgrad_compute, use_transformer_engine_op_fuser,
     fp8_dot_product_attention. A replayed full-iteration graph launches nothing op by op: no
     host model (as `moe_rows_bridge.FULL_ITERATION`). The paged stash, the op fuser, the
     delayed wgrad and FP8 attention are not modelled.
   - H100 BF16: TP 1, PP 1, EP 16, GBS 1024, MBS 1, HybridEP (32 SMs), router fusion,
     grad_reduce_in_fp32 False, no recomputation, CUDA graphs "transformer_engine" with scopes
     moe_router and moe_preprocess (the host pays the rest), overlap_moe_expert_parallel_comm;
     its moe_hybridep_num_sms = 32 is `parallel.comm_sms` (the SMs HybridEP's kernels hold
     beside the overlapped compute: `traces.moe_overlap.comm_sms`). The GB300 recipe sets none
     (`_enable_hybridep_full_iteration_mxfp8` sets moe_hybridep_num_sms_preprocessing only; the
     base recipe qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config sets 16, Megatron-Core's
     default): parasim's default 16.
   Not entered: "Benchmark · GB200" (8 GB200, FP8 MX, full-iteration graphs, 6,501.120 ms,
   40,322.898 tokens/s/GPU): its recipe (qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config) is not
   in the corpus, so its micro-batch is not stated.
   These are the 26.08-era recipes: the same layouts as the performance page's 26.02 GB300 row
   (MBS 8) but a later software stack, so the two figures are different runs, not a conflict.

2. alibaba/Pai-Megatron-Patch issue #643 (2025-08-08, "训练Qwen3-30B-A3B MoE模型速度偏慢"): on
   H800 (Alibaba DLC; commit 2b201af, image pai-megatron-patch:25.04), sequence 8192, 16 GPUs:
   "tp=1, pp=2, ep=8 | 8192 | 128 | 16 | 10.361 | 6325" and "tp=1, pp=4, ep=4 | 8192 | 256 | 16
   | 20.992 | 6244" (TimePerIter s, Tokens/GPU/Second; 128 x 8192 / 16 / 10.361 = 6,325.3 and
   256 x 8192 / 16 / 20.992 = 6,243.9); "expert tp=1, MicroBatchSize=1", no recomputation,
   "--moe-expert-capacity-factor 1.0", no CUDA graph. The rest from the example script it runs
   (examples/qwen3/run_mcore_qwen3.sh, stored version @0f5c122; the issue's 2b201af is assumed
   the same for these flags): the "A3B" branch's `--moe-grouped-gemm --moe-token-dispatcher-type
   alltoall` and aux-loss routing, no `--moe-permute-fusion` and no router fusion (neither
   flag), `--overlap-grad-reduce --overlap-param-gather`, CUDA_DEVICE_MAX_CONNECTIONS=1,
   its Megatron-LM-250624 backend (a main snapshot of 2025-06-24): the routing probabilities
   weighed in the experts' activation (`moe_probs_in_activation`), which Megatron-Core first
   shipped in 0.12.1 on 2025-05-23 (`traces.moe_probs`: PyPI's 0.12.0 wheel still weighs in
   the unpermute, 0.12.1's in the activation), a month before the snapshot (a backport to
   the release branch, so main had it by then too); the issue's own "去掉
   --recompute-granularity selective --recompute-modules moe" rules out anything older than
   0.12.0 (its wheel has `recompute_modules`, 0.12.0rc3's of 2025-04-15 not). The
   probabilities are bf16 there (no --moe-router-dtype: moe_utils.py's softmax
   `.type_as(logits)`), 2 bytes each, counted at `traces.moe_probs`' 4: 128 KiB a layer.
   Not stated by the issue, assumed: BF16 (the script's `bf16`
   precision; its `fp8` is blockwise), the distributed optimizer (ZeRO-1), gradients
   accumulated in fp32 (Megatron-LM's bf16 default). Nodes of 8 H800 (the dgx-h800 preset:
   NVLink at 200 GB/s a way, 400 Gb/s InfiniBand per GPU). The host is modelled (eager launch,
   no CUDA graph): `MoeRow.host`.

3. NVIDIA-NeMo/Megatron-Bridge issue #4439 (2026-06-22, "Qwen3-30B-A3B DGX-B200 MXFP8: 562
   TFLOP/s achieved vs documented 619 TFLOP/s"): a DGX B200 (8 GPUs), container nemo:26.04.01
   (Megatron-Bridge v0.4.2), recipe QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_FP8_MX_V1 with "Key
   settings confirmed in log": micro_batch_size 4, global_batch_size 512, expert parallel 8,
   HybridEP on 32 SMs, cuda_graph_impl "transformer_engine" over attn, moe_router and
   moe_preprocess, moe_a2a_overlap False; "100 iterations, stable": MXFP8 ~562 TFLOP/s/GPU.
   Megatron-Bridge's TFLOP/s is Megatron's causal count (the card's GB300 1,030.070 TFLOP/s at
   44,773.361 tokens/s is 23.006 GFLOP a token, `megatron_num_flops(causal=True)` to five
   digits), so the row is 562e12 / 23.006e9 = 24,428 tokens/s/GPU, derived as the DeepSeek row
   is; the issue's "~" makes it about three digits. Sequence 4,096 and TP 1 / PP 1 are the
   recipe's (the page's B200 rows). Its BF16 run (~552) states no recipe and is not entered,
   nor the "documented" 619 (its page is not in the corpus).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moe_rows import MoeRow, qwen3
from moe_rows_bridge import HYBRIDEP, OVERLAP, Q30, TE_GEMM_STREAMS, bridge

CARD = ("Megatron-Bridge Qwen3-30B-A3B model card (docs/models/qwen/qwen3-30b-a3b.md @411ee45; "
        "PR #5720)")
PAI = "alibaba/Pai-Megatron-Patch issue #643 (2025-08-08)"
ISSUE_4439 = "NVIDIA-NeMo/Megatron-Bridge issue #4439 (2026-06-22)"
QWEN3_30B_CAUSAL_FLOPS = 23.006281728e9
"""Megatron's causal FLOP count per token of Qwen3-30B-A3B at sequence 4,096
(`traces.step_flops.megatron_num_flops(causal=True)`; the module docstring, item 3)."""


def card(system: str, precision: str, gpus: int, gbs: int, mbs: int, ep: int, tokens: float,
         label: str, graphs: str, host: bool, sms: int = 0) -> MoeRow:
    """One model-card row on TP 1, PP 1 (the card's recipes), `graphs` the recipe's TE CUDA
    graph scopes, `host` whether its kernels launch from the eager loop (no full-iteration
    graph) and `sms` the recipe's moe_hybridep_num_sms where it sets one (`parallel.comm_sms`;
    else Megatron-Core's default, `traces.moe_overlap.DISPATCHER_SMS`)."""
    row = bridge("26.02", system, Q30, precision, gpus, gbs, mbs, (1, 1, 1, ep), tokens,
                 HYBRIDEP + OVERLAP, parallel={"comm_sms": sms} if sms else {})
    return dataclasses.replace(row, table="bridge-card", source=CARD, graphs=graphs, host=host,
                               name=f"card {Q30} {system} {precision} {label}, {gpus} GPUs")


WEAK_SCALING = {8: 44511.004, 32: 45086.158, 128: 44951.404, 256: 45052.607}
"""The card's GB300 weak-scaling points: GPUs -> tokens/s/GPU (GBS = 64 x GPUs)."""

CARD_ROWS: list[MoeRow] = [
    card("GB300", "FP8-MX", 8, 512, 8, 8, 44773.361, "benchmark", "", False),
    *[card("GB300", "FP8-MX", gpus, 64 * gpus, 8, 8, tokens, "weak scaling", "", False)
      for gpus, tokens in WEAK_SCALING.items()],
    card("H100", "BF16", 16, 1024, 1, 16, 13011.378, "benchmark", "moe_router moe_preprocess",
         True, sms=32),
]


def pai_h800(pp: int, ep: int, gbs: int, tokens: float) -> MoeRow:
    """Issue #643's run on 16 H800 at `pp` x `ep` (module docstring)."""
    model: dict[str, Any] = qwen3("30b", dtype="bf16", seq_len=8192)
    model.update(capacity_factor=1.0, moe_permute_fusion=False, moe_router_fusion=False,
                 moe_gemm_streams=TE_GEMM_STREAMS,
                 moe_probs_in_activation=True)  # Megatron-LM-250624 (module docstring)
    parallel = {"tp": 1, "pp": pp, "dp": 16 // pp, "ep": ep, "etp": 1, "sp": False,
                "zero": 1, "fp32_main_grads": True, "micro_batch": 1, "global_batch": gbs,
                "recompute": "none", "schedule": "1f1b", "overlap_grad_reduce": True,
                "overlap_param_gather": True}
    return MoeRow("pai", f"Pai {Q30} H800 BF16 pp{pp} ep{ep}, 16 GPUs", PAI, model, parallel,
                  {"preset": "dgx-h800", "nodes": 2}, tokens, "tokens/s", host=True)


PAI_ROWS: list[MoeRow] = [pai_h800(2, 8, 128, 6325), pai_h800(4, 4, 256, 6244)]


def b200_4439() -> MoeRow:
    """Issue #4439's DGX B200 MXFP8 run at MBS 4 (module docstring, item 3): its ~562 model
    TFLOP/s over the causal count per token."""
    row = bridge("26.02", "B200", Q30, "FP8-MX", 8, 512, 4, (1, 1, 1, 8),
                 562e12 / QWEN3_30B_CAUSAL_FLOPS, HYBRIDEP)
    return dataclasses.replace(row, table="bridge-4439", source=ISSUE_4439,
                               name=f"#4439 {Q30} B200 FP8-MX MBS 4, 8 GPUs")


ISSUE_ROWS: list[MoeRow] = [b200_4439()]
