"""The MoE Parallel Folding paper's rows for `bench_moe_recipes.py`, entered as stated.

Source: Liu et al., "MoE Parallel Folding: Heterogeneous Parallelism Mappings for Efficient
Large-Scale MoE Model Training with Megatron Core", arXiv 2504.14960 v2 (2025): §4.1-4.5,
Table 2 (FP8, model TFLOP/s) and the appendix's Tables 3-5 (§6.4: MFU, with each run's mapping;
Table 1 of §4.2 repeats Table 3's MFU). Read from a Markdown transcription of the paper in the
search corpus (2026-12-05); where the transcription is doubtful the row says so.

What the paper states, used for every row: Eos, DGX H100 nodes (8 GPUs on NVLink 4, InfiniBand
400 Gb/s per GPU: the dgx-h100 preset), BF16 unless FP8 is named, MFU against 989.5 TFLOP/s,
"token drop training with a capacity factor equal to 1 for benchmarking" (§4.2), sequence 4,096
and global batch 256 (Table 3) or 1,024 (Table 4, "all parallel configurations are the same
as those identified in the performance experiments"). FP8 is "FP8 delayed scaling" (§4.5).
What it does not state, taken as Megatron-Core's defaults of the time and the same for every
row: micro-batch 1, no virtual pipeline, no recomputation, sequence parallelism wherever TP > 1
(Megatron-Core requires it for MoE with TP), the distributed optimizer (ZeRO-1) except for the
FSDP baselines (ZeRO-3), gradients accumulated and reduced in FP32 (`fp32_main_grads`:
Megatron-LM's arguments.py turns `accumulate_allreduce_grads_in_fp32` on for every BF16 run,
its `if args.bf16:` branch of 2024-25; the Bridge rows set it too); expert tensor parallelism =
TP where the row has no ETP (the layout before folding: experts split as attention is), as the
table gives it where it does; the routing probabilities applied in the unpermute
(`moe_probs_in_activation` false, the default): v1 of the paper (2025-04) predates
Megatron-Core 0.12.1 (2025-05-23), the first release that moved them into the experts' activation
(`traces.moe_probs`); the router's score function, top-k and probabilities as separate aten
ops (`moe_router_fusion` false): the fused router kernels (`--moe-router-fusion`) arrived in
Megatron-Core 0.14 (2025/09; Megatron-LM megatron/core/transformer/moe/README.md, "What's
New"), after the paper. The token permutation stays fused and the expert GEMMs grouped, as the
authors' own Mixtral-8x22B benchmark config sets them (yanring/Megatron-MoE-ModelZoo
model_configs/benchmarking/Mixtral-8x22B.yaml: --moe-permute-fusion, --moe-grouped-gemm).
Table 3's columns read CP, TP, EP, PP, ETP in order; the FSDP baselines fill only the first
ones (FSDP: CP, TP, EP; no PP).

Which FSDP the baselines ran is not stated in what the corpora hold of the paper (the stored
arXiv HTML is reachable only through its abstract). What Megatron-LM's own code allows: its
PyTorch-FSDP2 wrapper (`--use-torch-fsdp2`, megatron/core/distributed/
torch_fully_sharded_data_parallel.py) is refused with EP ("--use-torch-fsdp2 is not supported
with expert parallelism", megatron/training/arguments.py, still so in 2025-26 versions), and
the MoE README lists "Support FSDP with EP for MoE models" only under MCore v0.15 (2025/11).
The one Megatron-Core FSDP of early 2025 that shards experts over expert-DP is the custom FSDP
(`--use-custom-fsdp`, megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py,
`data_parallel_sharding_strategy = "optim_grads_params"`): a TransformerLayer per unit,
released after forward and all-gathered again before backward (`_post_forward`,
`_pre_backward`), gradients reduce-scattered every micro-batch ("For grads shard mode there
will actually always be gradient sync happening", its `no_sync`), in fp32 under
`grad_reduce_in_fp32`, expert parameters over the expert-DP group (`expt_dp_group`). That is
parasim's ZeRO 3 with its defaults (`reshard_after_forward` true, `grad_sync` "microbatch"),
`fp32_main_grads` and experts over EDP, which is how these rows are entered; if the paper's
baseline was another FSDP it is not one these sources describe.

The models (§4.1): Mixtral 8x22B (mistralai/Mixtral-8x22B-v0.1 config.json: 56 layers,
hidden 6144, 48 heads, 8 KV heads, experts 16384 wide, 8 experts top-2, vocabulary 32,000);
Mixtral-8x22B-G8T8 (the same, 64 experts of 16384/8 = 2048, top-8); Qwen2-57B-A14B
(Qwen/Qwen2-57B-A14B config.json: 28 layers, hidden 3584, 28 heads, 4 KV heads, 64 experts of
2560 top-8, a shared expert of 20480 = 8 x 2560, vocabulary 151,936; its QKV biases are left
out: parasim's `bias` is all or nothing); Llama3-8x70B (Llama 3 70B upcycled to 8 experts:
80 layers, hidden 8192, 64 heads, 8 KV heads, experts 28672 wide; top-k is not stated, top-2
taken from the upcycling work it cites, [13]).
"""

from __future__ import annotations

from typing import Any

from moe_rows import MoeRow

FOLDING = ("Liu et al., \"MoE Parallel Folding\", arXiv 2504.14960 v2 (2025)")
H100_PEAK = 989.5e12
"""§4.1: "Each GPU achieves a peak half-precision throughput of 989.5 TFLOP/s"."""

BLOCK: dict[str, Any] = {
    "ffn": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
    "tied_embeddings": False, "attention": "flash", "dropout": 0.0, "seq_len": 4096,
    "capacity_factor": 1.0, "dtype": "bf16", "head_dim": 128, "moe_router_fusion": False,
}

MODELS: dict[str, dict[str, Any]] = {
    "Mixtral-8x22B": {**BLOCK, "layers": 56, "hidden": 6144, "heads": 48, "kv_heads": 8,
                      "vocab": 32000, "ffn_hidden": 16384, "experts": 8, "top_k": 2},
    "Mixtral-8x22B-G8T8": {**BLOCK, "layers": 56, "hidden": 6144, "heads": 48, "kv_heads": 8,
                           "vocab": 32000, "ffn_hidden": 2048, "experts": 64, "top_k": 8},
    "Qwen2-57B-A14B": {**BLOCK, "layers": 28, "hidden": 3584, "heads": 28, "kv_heads": 4,
                       "vocab": 151936, "ffn_hidden": 2560, "experts": 64, "top_k": 8,
                       "shared_experts": 8},
    "Llama3-8x70B": {**BLOCK, "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
                     "vocab": 128256, "ffn_hidden": 28672, "experts": 8, "top_k": 2},
}

# Table 3 (GBS 256): method -> (GPUs, CP, TP, EP, PP, ETP) per model; PP 1 and ETP = TP where
# the table leaves the cell empty, None where the method's MFU is "OOM".
MAPPINGS: dict[str, dict[str, tuple[int, int, int, int, int, int]]] = {
    "Mixtral-8x22B": {"FSDP": (128, 1, 8, 1, 1, 8), "FSDP + EP": (128, 1, 2, 8, 1, 2),
                      "TP + EP + DP": (128, 1, 4, 8, 1, 4), "MCore": (128, 1, 2, 4, 8, 2),
                      "MCore w/ Folding": (128, 1, 2, 8, 8, 1)},
    "Qwen2-57B-A14B": {"FSDP": (64, 1, 2, 1, 1, 2), "FSDP + EP": (64, 1, 1, 8, 1, 1),
                       "TP + EP + DP": (64, 1, 4, 4, 1, 4), "MCore": (64, 1, 2, 4, 4, 2),
                       "MCore w/ Folding": (64, 1, 2, 4, 4, 1)},
    "Mixtral-8x22B-G8T8": {"FSDP": (128, 1, 8, 1, 1, 8), "FSDP + EP": (128, 1, 4, 8, 1, 4),
                           "TP + EP + DP": (128, 1, 8, 8, 1, 8), "MCore": (128, 1, 2, 8, 8, 2),
                           "MCore w/ Folding": (128, 1, 4, 8, 8, 1)},
    # Folding's ETP cell is empty here; ETP 1 as in the other Folding rows (ETP 8 cannot fit:
    # EP 8 x ETP 8 = 64 > the 16 ranks of a stage).
    "Llama3-8x70B": {"FSDP": (256, 8, 8, 1, 1, 8), "FSDP + EP": (256, 1, 8, 8, 1, 8),
                     "TP + EP + DP": (256, 1, 8, 8, 1, 8), "MCore": (256, 1, 8, 4, 8, 8),
                     "MCore w/ Folding": (256, 1, 8, 8, 16, 1)},
}

TABLE3_MFU: dict[str, dict[str, float | None]] = {
    "Mixtral-8x22B": {"FSDP": 4.3, "FSDP + EP": 23.4, "TP + EP + DP": 36.6, "MCore": 46.3,
                      "MCore w/ Folding": 49.3},
    "Qwen2-57B-A14B": {"FSDP": 9.9, "FSDP + EP": 25.4, "TP + EP + DP": 23.1, "MCore": 35.3,
                       "MCore w/ Folding": 39.0},
    "Mixtral-8x22B-G8T8": {"FSDP": 2.2, "FSDP + EP": 9.0, "TP + EP + DP": 8.7, "MCore": 17.1,
                           "MCore w/ Folding": 28.8},
    "Llama3-8x70B": {"FSDP": None, "FSDP + EP": 19.6, "TP + EP + DP": None, "MCore": 38.8,
                     "MCore w/ Folding": 41.6},
}

# Table 4 (GBS 1024, Table 3's mappings): (model, method) -> {GPUs: MFU %}.
TABLE4_MFU: dict[tuple[str, str], dict[int, float]] = {
    ("Mixtral-8x22B", "MCore"): {128: 49.4, 256: 48.0, 512: 45.5, 1024: 42.3},
    ("Mixtral-8x22B", "MCore w/ Folding"): {128: 52.2, 256: 50.7, 512: 48.9, 1024: 44.9},
    ("Mixtral-8x22B", "FSDP + EP"): {128: 23.9, 256: 25.5, 512: 24.4, 1024: 23.8},
    ("Mixtral-8x22B", "TP + EP + DP"): {128: 40.4, 256: 39.1, 512: 36.0, 1024: 36.2},
    ("Qwen2-57B-A14B", "MCore"): {64: 36.2, 128: 36.0, 256: 34.8, 512: 32.5, 1024: 29.8},
    ("Qwen2-57B-A14B", "MCore w/ Folding"): {64: 39.9, 128: 39.7, 256: 38.1, 512: 36.6,
                                             1024: 33.4},
    ("Qwen2-57B-A14B", "FSDP + EP"): {64: 26.3, 128: 25.6, 256: 23.4, 512: 22.8, 1024: 21.6},
    ("Qwen2-57B-A14B", "TP + EP + DP"): {64: 22.4, 128: 20.9, 256: 19.8, 512: 19.7,
                                         1024: 17.9},
    ("Mixtral-8x22B-G8T8", "MCore"): {128: 19.8, 256: 18.4, 512: 16.3, 1024: 13.4},
    ("Mixtral-8x22B-G8T8", "MCore w/ Folding"): {128: 30.0, 256: 29.3, 512: 26.7, 1024: 25.5},
    ("Mixtral-8x22B-G8T8", "FSDP + EP"): {128: 9.0, 256: 8.5, 512: 8.9, 1024: 8.6},
    ("Mixtral-8x22B-G8T8", "TP + EP + DP"): {128: 8.6, 256: 8.5, 512: 8.5, 1024: 8.1},
    ("Llama3-8x70B", "MCore"): {256: 40.1, 512: 39.5, 1024: 39.1},
    # As transcribed: 128, 512, 1024 (no 256 row) for these two methods; §4.3 quotes the
    # Folding drop "from 43.7% to 41.5%".
    ("Llama3-8x70B", "MCore w/ Folding"): {128: 43.7, 512: 42.7, 1024: 41.5},
    ("Llama3-8x70B", "FSDP + EP"): {128: 18.9, 512: 17.3, 1024: 17.1},
}

# Table 5 (context scaling, tokens per batch fixed): method -> rows of
# (GPUs, sequence, CP, TP, EP, PP, ETP, GBS, MFU %); ETP = TP where the cell is empty.
TABLE5: dict[str, list[tuple[int, int, int, int, int, int, int, int, float]]] = {
    "MCore": [(128, 16384, 4, 2, 4, 8, 2, 1024, 45.3), (256, 32768, 8, 2, 4, 8, 2, 512, 43.2),
              (512, 65536, 16, 2, 4, 8, 2, 256, 42.6),
              (1024, 131072, 16, 4, 8, 8, 4, 128, 38.2)],
    "MCore w/ Folding": [(128, 16384, 4, 2, 8, 8, 1, 1024, 47.6),
                         (256, 32768, 8, 2, 8, 8, 1, 512, 45.1),
                         (512, 65536, 8, 4, 8, 8, 1, 256, 44.5),
                         (1024, 131072, 8, 8, 8, 8, 1, 128, 42.9)],
}
"""Mixtral-8x22B's rows. The transcribed table gives Qwen2-57B-A14B the very same ten numbers,
which §4.3 contradicts ("the MFU only drops from 38.7% to 35.9% for Qwen-57B14A"): those rows
are left out rather than entered wrong."""


def parallel(method: str, mapping: tuple[int, int, int, int, int, int], gbs: int,
             gpus: int | None = None) -> dict[str, Any]:
    """A Folding-paper mapping as parasim's [parallel] (module docstring's defaults)."""
    total, cp, tp, ep, pp, etp = mapping
    gpus = gpus or total
    return {"tp": tp, "cp": cp, "pp": pp, "dp": gpus // (tp * cp * pp), "ep": ep, "etp": etp,
            "sp": tp > 1, "zero": 3 if method.startswith("FSDP") else 1, "micro_batch": 1,
            "fp32_main_grads": True,
            "global_batch": gbs, "recompute": "none", "schedule": "1f1b"}


def row(table: str, model: str, method: str, par: dict[str, Any], mfu: float | None,
        unit: str = "MFU %", note: str = "", **model_extra: Any) -> MoeRow:
    gpus = par["tp"] * par["cp"] * par["pp"] * par["dp"]
    seq = model_extra.get("seq_len", 4096)
    name = f"{model} {method}, {gpus} GPUs" + (f", {seq // 1024}K" if seq != 4096 else "")
    if "dtype" in model_extra:
        name += f" {model_extra['dtype'].upper()}"
    return MoeRow(table, name, f"{FOLDING}, Table {table[-1]}",
                  {**MODELS[model], **model_extra}, par, {"preset": "dgx-h100",
                                                          "nodes": gpus // 8}, mfu, unit,
                  note=note)


def table2() -> list[MoeRow]:
    """Table 2: Mixtral 8x22B on 128 H100, model TFLOP/s, BF16 and FP8 delayed scaling (Table
    3's mappings and batch: the paper gives none other)."""
    published = {("MCore", "bf16"): 458.3, ("MCore w/ Folding", "bf16"): 487.7,
                 ("MCore", "fp8"): 575.1, ("MCore w/ Folding", "fp8"): 631.7}
    rows = []
    for (method, dtype), tflops in published.items():
        extra: dict[str, Any] = {"dtype": dtype}
        if dtype == "fp8":
            extra["fp8_recipe"] = "delayed"
        rows.append(row("folding-t2", "Mixtral-8x22B", method,
                        parallel(method, MAPPINGS["Mixtral-8x22B"][method], 256), tflops,
                        "TFLOP/s", **extra))
    return rows


def table3() -> list[MoeRow]:
    return [row("folding-t3", model, method, parallel(method, mapping, 256),
                TABLE3_MFU[model][method])
            for model, methods in MAPPINGS.items() for method, mapping in methods.items()]


def table4() -> list[MoeRow]:
    return [row("folding-t4", model, method,
                parallel(method, MAPPINGS[model][method], 1024, gpus), mfu)
            for (model, method), points in TABLE4_MFU.items() for gpus, mfu in points.items()]


def table5() -> list[MoeRow]:
    rows = []
    for method, points in TABLE5.items():
        for gpus, seq, cp, tp, ep, pp, etp, gbs, mfu in points:
            par = parallel(method, (gpus, cp, tp, ep, pp, etp), gbs)
            rows.append(row("folding-t5", "Mixtral-8x22B", method, par, mfu, seq_len=seq))
    return rows


FOLDING_ROWS: dict[str, list[MoeRow]] = {
    "folding-t2": table2(), "folding-t3": table3(), "folding-t4": table4(),
    "folding-t5": table5(),
}
