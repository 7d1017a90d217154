"""Published rows for `bench_recipes.py`: Llama 3 (Table 4) and torchtitan, entered as stated.

Each `Row` is one figure a source published, with the model, layout, batch, sequence, precision
and hardware the source gives for it, written as a parasim config (`Row.config`). Keys that
parasim does not have yet (other branches add them: `account_for_embedding`,
`account_for_loss`, `pipeline_layout`, `reshard_after_forward`, `grad_sync`, `kernels`,
`fp8_recipe = "tensorwise"`, `gpu_power`, the `h100-96gb` preset) are entered all the same: the
benchmark prints such a row as "not expressible" with parasim's one-line error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Row:
    """One published figure and the run it was measured on, as a parasim config."""

    table: str
    name: str
    source: str
    model: Mapping[str, Any]
    parallel: Mapping[str, Any]
    cluster: Mapping[str, Any]
    published: float
    unit: str
    """"tokens/s" (tokens per second per GPU) or "TFLOP/s" (per GPU, causal count)."""
    note: str = field(default="")

    @property
    def gpus(self) -> int:
        p = self.parallel
        return p.get("tp", 1) * p.get("cp", 1) * p.get("pp", 1) * p.get("dp", 1)

    def config(self) -> dict[str, Any]:
        """The experiment table `sim.config.experiment_from_dict` reads."""
        return {"model": dict(self.model), "parallel": dict(self.parallel),
                "cluster": dict(self.cluster)}


LLAMA_BLOCK: dict[str, Any] = {
    "kv_heads": 8, "ffn": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
    "vocab": 128256, "tied_embeddings": False, "dropout": 0.0, "attention": "flash",
}
"""Llama 3 / 3.1's block (Meta's config.json of each size): GQA with 8 key/value heads, SwiGLU,
RMSNorm, RoPE, no biases, untied embeddings, vocabulary 128,256, no dropout; flash attention."""


def llama(size: str, seq: int, dtype: str = "bf16", **extra: Any) -> dict[str, Any]:
    """Llama 3 / 3.1 8B, 70B or 405B (Llama 3 paper, Table 3; Meta's config.json files)."""
    shape = {"8b": (32, 4096, 32, 14336), "70b": (80, 8192, 64, 28672),
             "405b": (126, 16384, 128, 53248)}[size]
    layers, hidden, heads, ffn = shape
    return {**LLAMA_BLOCK, "layers": layers, "hidden": hidden, "heads": heads,
            "ffn_hidden": ffn, "seq_len": seq, "dtype": dtype, **extra}


# --- 1. Llama 3 paper, Table 4 --------------------------------------------------------------

LLAMA3 = ("Llama Team, \"The Llama 3 Herd of Models\", arXiv 2407.21783 (2024), Table 4; "
          "GPUs, TP/CP/PP, 16M-token batches and TFLOP/s checked against Balaji's SC'24 slide "
          "as transcribed at glennklockwood.com/garden/llama-3.1 (read 2026-12-04)")
"""The paper's own text is not in the search corpora: §3.3's statements below (and the 128K
row's sequence) are entered from the paper as read, not checked there."""

LLAMA3_CLUSTER: dict[str, Any] = {
    # §3.3.1: H100 80GB at 700 W TDP (dgx-h100's accelerator) on Meta's RoCE fabric: a ToR
    # switch per rack of 2 servers (16 GPUs), 192 racks a pod of 3,072 GPUs at full
    # bisection, 1:7 oversubscription between pods. Load balancing (§3.3.1): collectives open
    # 16 flows between two GPUs and E-ECMP hashes them over paths on extra RoCE header fields,
    # which is still a per-flow hash, not a per-packet or load-aware choice: routing = "ecmp",
    # each of a connection's 16 queue pairs hashed on its own: qps_per_connection = 16.
    "preset": "dgx-h100", "fabric": "fat-tree", "nodes_per_leaf": 2, "tiers": 3,
    "leaves_per_pod": 192, "pod_oversubscription": 7, "routing": "ecmp",
    "qps_per_connection": 16,
}

LLAMA3_PARALLEL: dict[str, Any] = {
    # §3.3.2: the interleaved schedule, with one layer fewer on the first and last stages so
    # the embedding and the output projection with the loss take a layer's place; with
    # 126 + 2 = 128 slots on PP 16 that is one layer per virtual stage, VP 8, and "the first
    # model chunk on the first stage has only the embedding" (Megatron-Core's
    # account_for_embedding/loss_in_pipeline_split).
    "tp": 8, "pp": 16, "vp": 8, "schedule": "interleaved",
    "account_for_embedding": True, "account_for_loss": True,
    # §3.3.2 TP with sequence parallelism on the 8 NVLink GPUs of a server (assumed: the
    # paper names TP, and at 8K tokens without activation checkpointing only SP's sharded
    # activations fit); "we could pretrain Llama 3 on sequences of 8K tokens without
    # activation checkpointing".
    "sp": True, "recompute": "none", "micro_batch": 1,
    # §3.3.2 DP: FSDP sharding optimizer states and gradients, parameters not resharded after
    # forward (no re-gather in backward): ZeRO-2, FSDP's SHARD_GRAD_OP. Gradients sharded
    # while accumulated over the micro-batches means each micro-batch's backward
    # reduce-scatters them (FSDP's default, grad_sync = "microbatch") in FP32 into FP32
    # shards (§3.3.2 "Numerical stability": FP32 accumulation, FP32 reduce-scatter).
    # Megatron's distributed optimizer (zero 1, one reduce-scatter a step) keeps a whole FP32
    # gradient buffer, 11.9 GiB a rank here: with it no row fits in 80 GB, while Meta
    # trained them at 8K without activation checkpointing (docs/recipes.md, Llama 3 memory).
    "zero": 2, "fp32_main_grads": True,
}


def llama3_row(name: str, dp: int, cp: int, seq: int, tflops: float) -> Row:
    """A Table 4 row: 16M tokens a batch (2,048 sequences of 8K, 128 of 128K)."""
    parallel = {**LLAMA3_PARALLEL, "dp": dp, "cp": cp, "global_batch": 16 * 2**20 // seq}
    if cp > 1:
        parallel["cp_comm"] = "all_gather"  # §3.3.2: K/V all-gathered, not a ring
    gpus = 8 * 16 * dp * cp
    return Row("llama3", name, LLAMA3, llama("405b", seq), parallel,
               {**LLAMA3_CLUSTER, "nodes": gpus // 8}, tflops, "TFLOP/s")


LLAMA3_ROWS = [
    llama3_row("405B 8K, 8,192 GPUs", 64, 1, 8192, 430),     # batch/DP 32, 43% BF16 MFU
    llama3_row("405B 8K, 16,384 GPUs", 128, 1, 8192, 400),   # batch/DP 16, 41%
    llama3_row("405B 128K CP16, 16,384 GPUs", 8, 16, 131072, 380),  # batch/DP 16, 38%
]


# --- 2. torchtitan (arXiv 2410.06511), H100 tables -----------------------------------------

TORCHTITAN = ("Liang et al., \"TorchTitan\", arXiv 2410.06511 (ICLR 2025); the same tables in "
              "pytorch/torchtitan docs/performance.md @eaea6f6 (torchtitan 9dec370, 2024-12-26)")

TITAN_CLUSTER: dict[str, Any] = {
    # Grand Teton hosts: 8 H100 with 96 GB HBM2e at 2.4 TB/s, the default 500 W power limit,
    # 400 Gb/s RDMA per GPU (docs/performance.md).
    "preset": "h100-96gb", "gpu_power": "500W",
}


def titan(name: str, table: str, model: dict[str, Any], parallel: dict[str, Any],
          tps: float) -> Row:
    """A torchtitan row: FSDP2 with bf16 parameters and fp32 gradient reduction
    (mixed_precision_reduce = "float32"), one micro-batch per rank unless pipelined; AdamW as
    torchtitan builds it, torch.optim's with foreach = not optimizer.fused, off by default
    (torchtitan/optimizer.py, config_manager.py): optimizer = "foreach"."""
    full = {"zero": 3, "fp32_main_grads": True, "reshard_after_forward": True,
            "optimizer": "foreach", **parallel}
    gpus = full.get("tp", 1) * full.get("cp", 1) * full.get("pp", 1) * full["dp"]
    return Row("torchtitan", name, f"{TORCHTITAN}, {table}", model, full,
               {**TITAN_CLUSTER, "nodes": max(1, gpus // 8)}, tps, "tokens/s")


def titan_1d(gpus: int, table: str, tps: tuple[float, float, float]) -> list[Row]:
    """Tables 1 and 3: 8B, FSDP on `gpus`, local batch 2, selective per-op checkpointing
    (selective_ac_option = "op": recompute = "selective_op"), eager, then torch.compile, then
    compile + Float8 (torchao's default then: dynamic tensorwise scaling)."""
    base = {"dp": gpus, "micro_batch": 2, "global_batch": 2 * gpus, "recompute": "selective_op"}
    fp8 = {"dtype": "fp8", "fp8_recipe": "tensorwise"}
    return [titan(f"8B FSDP, {gpus} GPUs", table, llama("8b", 8192, kernels="eager"), base,
                  tps[0]),
            titan(f"8B FSDP + compile, {gpus} GPUs", table,
                  llama("8b", 8192, kernels="compiled"), base, tps[1]),
            titan(f"8B FSDP + compile + Float8, {gpus} GPUs", table,
                  llama("8b", 8192, kernels="compiled", **fp8), base, tps[2])]


def titan_cp(dp: int, cp: int, tps: float) -> Row:
    """Table 2: 8B on 8 GPUs, FSDP x CP, local batch 1, full checkpointing, compile + Float8;
    torchtitan's CP all-gathers K/V (context_parallel_rotate_method = "allgather").

    Every row gives a rank 32,768 tokens (seq / cp), and under torch's load-balanced ring
    (torch/distributed/tensor/experimental/_attention.py, _templated_ring_attention) each of
    a rank's cp SDPA calls a layer has the same shape at every CP degree: step 0 causal on
    its two chunks, every other step 32,768 queries on 16,384 keys or 16,384 on 32,768,
    non-causal. So a rank's step is linear in cp (`tests/traces/plan/test_context.py`,
    ..._grows_as_cp). The published rows' step (32,768 / tokens/s) are 8.42, 12.90, 30.60 and
    59.80 s: CP 1, 4 and 8 lie on one line (7.34 s a CP degree, CP 4 within 0.5%) and CP 2
    is 18% below it, so the table's CP 2 row is off its own trend (issue 32, branch cp2)."""
    seq = 32768 * cp
    parallel = {"dp": dp, "cp": cp, "cp_comm": "all_gather", "micro_batch": 1,
                "global_batch": dp, "recompute": "full"}
    model = llama("8b", seq, "fp8", fp8_recipe="tensorwise", kernels="compiled")
    return titan(f"8B FSDP {dp} CP {cp}, seq {seq}", "Table 2", model, parallel, tps)


TITAN_3D: dict[str, Any] = {
    # Table 5: FSDP 8 x TP 8 x PP 8, local batch 32 (global 256), full checkpointing,
    # compile + Float8 + AsyncTP (TP's collectives overlapped with its GEMMs: tp_comm_overlap,
    # which with kernels = "compiled" is torch's AsyncTP, `traces.plan.overlap`).
    # With PP torchtitan keeps parameters unsharded after forward ("to avoid per-microbatch
    # all-gathers": parallelize_llama.apply_fsdp) and torch.distributed.pipelining turns FSDP's
    # gradient sync and resharding off for every backward, then, once the stage's last
    # backward is over, runs every unit's post-backward (stage.backward_maybe_with_nosync,
    # run_post_backward): gradients accumulated unsharded in fp32 (traces.fsdp_kernels),
    # reduce-scattered after the stage's last backward.
    "tp": 8, "pp": 8, "dp": 8, "sp": True, "tp_comm_overlap": True, "global_batch": 256,
    "recompute": "full", "reshard_after_forward": False, "grad_sync": "step",
}
TITAN_405B = llama("405b", 8192, "fp8", fp8_recipe="tensorwise", kernels="compiled")


def titan_4d(dp: int, cp: int, tps: float) -> Row:
    """Table 6: 405B on 512 GPUs, TP 8 x PP 8 (1F1B, 8 micro-batches of 1) x FSDP x CP,
    local batch 8, full checkpointing, compile + Float8 + AsyncTP, CP's K/V all-gathered."""
    seq = 32768 * cp
    parallel = {**TITAN_3D, "dp": dp, "cp": cp, "cp_comm": "all_gather", "micro_batch": 1,
                "global_batch": 8 * dp, "pp_first_layers": 15, "pp_last_layers": 15}
    model = {**TITAN_405B, "seq_len": seq}
    return titan(f"405B 4D FSDP {dp} CP {cp}, seq {seq}", "Table 6", model, parallel, tps)


TITAN_70B = llama("70b", 8192, "fp8", fp8_recipe="tensorwise", kernels="compiled")

TORCHTITAN_ROWS = [
    *titan_1d(8, "Table 1", (5762, 6667, 8532)),
    titan_cp(8, 1, 3890), titan_cp(4, 2, 2540), titan_cp(2, 4, 1071), titan_cp(1, 8, 548),
    *titan_1d(128, "Table 3", (5605, 6514, 8380)),
    # Table 4: 70B, 256 GPUs, FSDP 32 x TP 8, local batch 16 (global 512), full checkpointing.
    titan("70B 2D, 256 GPUs", "Table 4", TITAN_70B,
          {"tp": 8, "dp": 32, "sp": True, "micro_batch": 16, "global_batch": 512,
           "recompute": "full"}, 829),
    titan("70B 2D + AsyncTP, 256 GPUs", "Table 4", TITAN_70B,
          {"tp": 8, "dp": 32, "sp": True, "tp_comm_overlap": True, "micro_batch": 16,
           "global_batch": 512, "recompute": "full"}, 876),
    # Table 5 1F1B: one stage a rank, 8 micro-batches of 4; torchtitan's default split of 126
    # layers over 8 stages: 15, 16 x 6, 15.
    titan("405B 3D 1F1B, 512 GPUs", "Table 5", TITAN_405B,
          {**TITAN_3D, "micro_batch": 4, "pp_first_layers": 15, "pp_last_layers": 15}, 100),
    # Interleaved 1F1B: two stages a rank, 8 micro-batches of 4. The tables ran torchtitan
    # 9dec370 (2024-12-26), whose build_pipeline_schedule (parallelisms/pipelining_utils.py)
    # defaulted n_microbatches to pipeline_parallel_degree for every schedule; the default of
    # pp x stages a rank came with pytorch/torchtitan#781 (merged 2025-01-07: "PP is using the
    # pipeline_parallel_degree as the default number of microbatches when it should be
    # pipeline_parallel_degree * len(stages) for multi-stage schedules"). The default split
    # over 16 stages is 7, 8 x 14, 7 (the same file's generate_split_points), written as
    # Megatron-Core's --pipeline-model-parallel-layout.
    titan("405B 3D interleaved, 512 GPUs", "Table 5", TITAN_405B,
          {**TITAN_3D, "micro_batch": 4, "vp": 2, "schedule": "interleaved",
           "pipeline_layout": "Et*7|" + "t*8|" * 14 + "t*7L"}, 128),
    titan_4d(8, 1, 76), titan_4d(4, 2, 47), titan_4d(2, 4, 31), titan_4d(1, 8, 16),
]


TITAN_ASYNCTP = ("pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md "
                 "(PR #1299, 2025-06-15; its table as first committed, later an image): torch "
                 "38410cf9 (2025-06-14), the same Grand Teton H100s")


def titan_asynctp(quant: str, overlap: bool, tps: float) -> Row:
    """The June 2025 AsyncTP benchmark's Llama 3.1 70B rows: 256 H100, FSDP 32 x TP 8,
    torch.compile, full AC, local batch 16, bf16 or Float8 (tensorwise, rowwise), without
    and with --parallelism.enable_async_tensor_parallel: Table 4's run on torch of June 2025
    (the paper's ran torchtitan 9dec370, 2024-12). Its note: the vanilla-TP rowwise figure
    is low, under investigation (pytorch/torchtitan#1207)."""
    fp8 = {} if quant == "bf16" else {"fp8_recipe": quant}
    model = llama("70b", 8192, "bf16" if quant == "bf16" else "fp8", kernels="compiled", **fp8)
    parallel = {"tp": 8, "dp": 32, "sp": True, "micro_batch": 16, "global_batch": 512,
                "recompute": "full", **({"tp_comm_overlap": True} if overlap else {})}
    row = titan(f"70B {quant}{' + AsyncTP' if overlap else ''}, 256 GPUs", "2025-06", model,
                parallel, tps)
    return Row("torchtitan-asynctp", row.name, TITAN_ASYNCTP, row.model, row.parallel,
               row.cluster, tps, "tokens/s")


TITAN_ASYNCTP_ROWS = [
    titan_asynctp("bf16", False, 597.3), titan_asynctp("bf16", True, 652.4),
    titan_asynctp("tensorwise", False, 809.8), titan_asynctp("tensorwise", True, 942.4),
    titan_asynctp("rowwise", False, 599.6), titan_asynctp("rowwise", True, 624.8),
]

# --- 5. MegaScale (Jiang et al., NSDI 2024, arXiv 2402.15627), Table 2 ---------------------

MEGASCALE = ("Jiang et al., \"MegaScale\", NSDI 2024 (arXiv 2402.15627), Table 2, Megatron-LM "
             "rows; setup from Table 1 and §3.6, §6.1")

MEGASCALE_MODEL: dict[str, Any] = {
    # Table 1 and §6.1: 96 layers, hidden 12,288, 128 heads, sequence 2,048, vocabulary
    # 64,000; the rest is Megatron-LM's GPT as its commit 285068c8 defaults it (GeLU MLP of
    # 4h, LayerNorm, learned positions, biases, dropout 0.1, tied embeddings, attention not
    # fused: --use-flash-attn was opt-in), bf16.
    "layers": 96, "hidden": 12288, "heads": 128, "seq_len": 2048, "vocab": 64000,
    "dtype": "bf16", "attention": "unfused",
}


def megascale_row(gpus: int, batch: int, mfu: float) -> Row:
    """A Megatron-LM row of Table 2: TP 8, PP 8 (Table 1), the interleaved schedule with six
    chunks a stage (§6.1), MFU as published: Megatron-LM's num_floating_point_operations per
    second over the A100's 312 TFLOP/s (39.3k tokens/s on 256 GPUs at 53.0% is 1.077 TFLOP a
    token, that count). Unstated, taken as Megatron's 2023 recipe for 175B (Korthikanti et
    al.): micro-batch 1, sequence parallelism with selective recomputation, the distributed
    optimizer, gradients reduced after the backward (--overlap-grad-reduce is opt-in), and
    accumulated and reduced in fp32: Megatron-LM's arguments.py sets
    accumulate_allreduce_grads_in_fp32 for every bf16 run ("accumulate and all-reduce
    gradients in fp32 for bfloat16 data type"; --grad-reduce-in-bf16 came later)."""
    parallel = {"tp": 8, "pp": 8, "vp": 6, "schedule": "interleaved", "dp": gpus // 64,
                "micro_batch": 1, "global_batch": batch, "sp": True, "recompute": "selective",
                "zero": 1, "overlap_grad_reduce": False, "fp32_main_grads": True}
    # §3.6: servers of 8 "Ampere" GPUs (taken as A100 SXM: dgx-a100; an A800's NVLink is
    # 400 GB/s, not 600) with eight 200G NICs, each to a different ToR of 64 x 200G
    # downlinks (nodes_per_leaf 8 puts 64 NIC ports on a leaf), a 1:1 Clos, RoCE with ECMP.
    cluster = {"preset": "dgx-a100", "nodes": gpus // 8, "fabric": "fat-tree",
               "nodes_per_leaf": 8, "routing": "ecmp"}
    return Row("megascale", f"175B Megatron-LM, {gpus} GPUs, batch {batch}", MEGASCALE,
               MEGASCALE_MODEL, parallel, cluster, mfu, "MFU %")


MEGASCALE_ROWS = [
    megascale_row(256, 768, 53.0), megascale_row(512, 768, 49.9),
    megascale_row(768, 768, 46.7), megascale_row(1024, 768, 44.7),
    megascale_row(3072, 6144, 48.7), megascale_row(6144, 6144, 47.8),
    megascale_row(8192, 6144, 43.3), megascale_row(12288, 6144, 41.2),
]
MEGASCALE_SECONDS = {256: 40.0, 512: 21.2, 768: 15.2, 1024: 11.9, 3072: 29.02, 6144: 14.78,
                     8192: 12.24, 12288: 8.57}
"""Table 2's Megatron-LM iteration times (s), for the scale-out losses."""
