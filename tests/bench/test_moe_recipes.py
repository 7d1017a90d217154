"""bench_moe_recipes.py's rows against their sources' own arithmetic: each row's GPUs are its
layout's product and its source's GPU count, the Folding paper's two units agree through the
FLOP count the benchmark uses, DeepSeek's figure is its derivation, and every row either builds
or is refused as the benchmark prints it (a missing key, or one ConfigError line)."""

from __future__ import annotations

import pytest
from bench_moe_recipes import TABLES, missing
from moe_rows import UNITS
from moe_rows_bridge import (
    BRIDGE_ROWS,
    CUTEDSL_MLP,
    DEEPSEEK_ROWS,
    FULL_ITERATION,
    H800_TOKENS_PER_S,
    TE_GEMM_STREAMS,
)
from moe_rows_folding import FOLDING_ROWS, H100_PEAK, MAPPINGS, TABLE3_MFU
from moe_rows_qwen30b import (
    CARD_ROWS,
    ISSUE_ROWS,
    PAI_ROWS,
    QWEN3_30B_CAUSAL_FLOPS,
    WEAK_SCALING,
)

from sim.config import experiment_from_dict
from sim.models.activation_memory import layer_bytes
from sim.models.memory import memory_by_pp_rank
from traces.errors import ConfigError
from traces.fsdp import GradSync
from traces.model import ModelSpec
from traces.moe_steps import permute_steps, router_steps
from traces.step_flops import megatron_num_flops

ROWS = [row for rows in TABLES.values() for row in rows]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_each_row_is_consistent(row):
    """GPUs = TP·CP·PP·DP and, on a rack preset, whole 64-GPU domains; EP·ETP within the
    TP·CP·DP ranks of a stage; a known unit; the published figure positive where there is
    one."""
    p = row.parallel
    assert row.gpus == p.get("tp", 1) * p.get("cp", 1) * p["pp"] * p["dp"]
    per_node = row.cluster.get("gpus_per_node", 8)
    assert row.cluster["nodes"] * per_node == row.gpus
    stage = p.get("tp", 1) * p.get("cp", 1) * p["dp"]
    assert stage % (p.get("ep", 1) * p.get("etp", 1)) == 0
    assert row.unit in UNITS
    assert row.published is None or row.published > 0


def test_the_folding_mappings_have_table_3s_gpu_counts():
    """Table 3's GPUs per model (Mixtral 128, Qwen2 64, G8T8 128, Llama3-8x70B 256) for every
    method, and its only two "OOM" cells are Llama3-8x70B's FSDP and TP + EP + DP."""
    counts = {model: {m[0] for m in methods.values()} for model, methods in MAPPINGS.items()}
    assert counts == {"Mixtral-8x22B": {128}, "Qwen2-57B-A14B": {64},
                      "Mixtral-8x22B-G8T8": {128}, "Llama3-8x70B": {256}}
    ooms = [(model, method) for model, mfu in TABLE3_MFU.items()
            for method, value in mfu.items() if value is None]
    assert ooms == [("Llama3-8x70B", "FSDP"), ("Llama3-8x70B", "TP + EP + DP")]


FSDP_ROWS = [row for table in ("folding-t3", "folding-t4") for row in FOLDING_ROWS[table]
             if " FSDP" in row.name]


def test_there_are_the_fsdp_rows_of_tables_3_and_4():
    """Table 3's eight FSDP cells (Llama3-8x70B's FSDP "OOM", entered without a figure)
    and Table 4's sixteen FSDP + EP points."""
    assert sum(r.table == "folding-t3" for r in FSDP_ROWS) == 8
    assert sum(r.table == "folding-t4" for r in FSDP_ROWS) == 16


@pytest.mark.parametrize("row", FSDP_ROWS, ids=lambda r: r.name)
def test_fsdp_rows_run_megatron_core_custom_fsdp_as_its_source_states(row):
    """The FSDP baselines as Megatron-Core's custom FSDP (optim_grads_params) runs a layer:
    parameters sharded, re-gathered for backward, gradients reduce-scattered every
    micro-batch in fp32, experts over expert-DP (`moe_rows_folding`'s docstring)."""
    layout = experiment_from_dict(row.config()).layout
    assert (layout.zero, layout.reshard_after_forward) == (3, True)
    assert layout.sync is GradSync.MICROBATCH
    assert layout.fp32_main_grads and layout.pp == 1


def test_table_2s_bf16_tflops_are_table_3s_mfu_of_the_h100_peak():
    """Table 2's 458.3 and 487.7 TFLOP/s are Table 3's 46.3% and 49.3% of 989.5 TFLOP/s, to
    the rounding of the MFU (0.05 points): both count the same FLOPs."""
    t2 = {r.name: r.published for r in FOLDING_ROWS["folding-t2"]}
    for method in ("MCore", "MCore w/ Folding"):
        tflops = t2[f"Mixtral-8x22B {method}, 128 GPUs BF16"]
        mfu = TABLE3_MFU["Mixtral-8x22B"][method]
        assert tflops is not None and mfu is not None
        assert abs(tflops / (H100_PEAK / 1e12) * 100 - mfu) <= 0.05


def test_the_folding_fp8_speedups_are_table_2s():
    """Table 2's own ratios: FP8 over BF16 1.26x (MCore) and 1.30x (Folding), Folding over
    MCore 1.06x (BF16) and 1.10x (FP8), each to its printed two decimals (575.1 / 458.3 =
    1.2549: the paper rounds it to 1.26, so within 0.006)."""
    t = {(r.name.split(", ")[0], r.name[-4:].strip()): r.published
         for r in FOLDING_ROWS["folding-t2"]}
    mcore, fold = "Mixtral-8x22B MCore", "Mixtral-8x22B MCore w/ Folding"
    ratios = [t[mcore, "FP8"] / t[mcore, "BF16"], t[fold, "FP8"] / t[fold, "BF16"],
              t[fold, "BF16"] / t[mcore, "BF16"], t[fold, "FP8"] / t[mcore, "FP8"]]
    assert ratios == pytest.approx([1.26, 1.30, 1.06, 1.10], abs=0.006)


def test_nvidia_qwen3_model_tflops_are_the_causal_count():
    """The page's 563 model TFLOP/s at 3,805 tokens/s (26.02, B200, Qwen3-235B-A22B) is
    Megatron's count with causal attention (half the s/h term) per token, to the rounding of
    the two integers; the full count is 12.8% higher."""
    row = next(r for r in BRIDGE_ROWS if r.name == "26.02 Qwen3-235B-A22B B200 FP8-MX, "
               "256 GPUs")
    model = ModelSpec(**row.model)
    full = megatron_num_flops(model, 1) / model.seq_len
    h, s, n = model.hidden, model.seq_len, model.layers
    ratio = model.head_dim * model.heads / h
    causal = full - 12 * n * h * h * (s / h) * ratio / 2
    assert megatron_num_flops(model, 1, causal=True) / s == pytest.approx(causal, rel=1e-12)
    published = 563e12 / 3805
    assert abs(causal / published - 1) <= 0.5 / 563 + 0.5 / 3805
    assert full / causal == pytest.approx(1.128, abs=0.001)


def test_deepseeks_figure_is_180k_gpu_hours_per_trillion_tokens():
    assert abs(H800_TOKENS_PER_S - 1543.2) < 0.05
    assert DEEPSEEK_ROWS[0].published == H800_TOKENS_PER_S
    assert DEEPSEEK_ROWS[0].gpus == 2048


@pytest.mark.parametrize("row", [r for r in ROWS if r.gpus <= 1024], ids=lambda r: r.name)
def test_every_row_builds_or_is_refused_as_the_benchmark_prints_it(row):
    """A row needing a key parasim lacks names it; any other refusal is one ConfigError
    line; a row that builds has the row's GPUs."""
    if missing(row):
        assert missing(row) in row.needs
        return
    try:
        exp = experiment_from_dict(row.config(), name=row.name)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)
        return
    assert exp.cluster.num_devices == row.gpus


def test_every_folding_row_reduces_gradients_in_fp32():
    """Megatron-LM turns FP32 gradient accumulation and reduction on for BF16 runs, so every
    Folding row (Megatron-Core, FSDP baselines included) reduces FP32 gradients, as the
    Megatron-Bridge rows do."""
    for rows in FOLDING_ROWS.values():
        for r in rows:
            assert r.parallel["fp32_main_grads"] is True, r.name


def test_bridge_rows_reduce_bf16_gradients_and_gather_fp8_weights():
    """Megatron-Bridge's performance scripts set grad_reduce_in_fp32 = False for every Qwen3
    and DeepSeek-V3 run, so the main gradients are bf16 (2 bytes, not 4); the FP8 rows' precision
    configs gather FP8 weights. With 4-byte gradients the GB200 Qwen3-30B-A3B row NVIDIA ran
    would not fit its 186 GB."""
    for row in BRIDGE_ROWS:
        assert row.parallel["fp32_main_grads"] is False, row.name
        fp8 = row.model.get("dtype") == "fp8"
        assert row.parallel.get("fp8_param_gather", False) is fp8, row.name


def test_folding_rows_route_with_aten_ops_and_permute_fused():
    """Every Folding row runs the router as Megatron-Core did before 0.14 (its score function,
    top-k and probabilities as aten ops: more than one kernel each way) and the permutation as
    one fused kernel each way (the authors' benchmark config)."""
    for rows in FOLDING_ROWS.values():
        for row in rows:
            model = ModelSpec(**row.model)
            fwd, bwd = router_steps(model, 4096)
            assert not model.moe_router_fusion and len(fwd) > 1 and len(bwd) > 1
            assert [len(steps) for steps in permute_steps(model, 4096, 4096)] == [1, 1]


def test_bridge_experts_run_te_groupedlinear_but_the_cutedsl_recipes():
    """Megatron-Core's TEGroupedMLP runs a cuBLAS GEMM per local expert on Transformer Engine's
    4 compute streams (`moe_rows_bridge.TE_GEMM_STREAMS`); the DeepSeek-V3 FP8-MX recipes
    with cutedsl_fused_grouped_mlp keep parasim's one grouped kernel."""
    for row in BRIDGE_ROWS:
        fused = row.name.split(",")[0].split(" ", 1)[1] in {
            f"{m} {s} {p}" for m, s, p in CUTEDSL_MLP}
        assert row.model["moe_gemm_streams"] == (0 if fused else TE_GEMM_STREAMS), \
            row.name


@pytest.mark.parametrize("row", FOLDING_ROWS["folding-t5"], ids=lambda r: r.name)
def test_table_5s_causal_reading_scales_mfu_by_the_two_counts_ratio(row):
    """`--causal-flops` reads Table 5's MFU with Megatron-LM's later count: per token
    12·n·h²·(1 + g/a + s/(2h) + 3kf/(2h) + V/(2nh)) over the full count's s/h (Mixtral 8x22B:
    d·a = h), 0.888 at 16K and 0.651 at 128K."""
    model = ModelSpec(**row.model)
    n, h, s, a, g = model.layers, model.hidden, model.seq_len, model.heads, model.kv_heads
    rest = 1 + g / a + 1.5 * model.top_k * model.ffn_hidden / h + model.vocab / (2 * n * h)
    ratio = (rest + s / (2 * h)) / (rest + s / h)
    assert megatron_num_flops(model, 1, causal=True) / megatron_num_flops(model, 1) == \
        pytest.approx(ratio, rel=1e-12)
    assert round(ratio, 3) == {16384: 0.888, 32768: 0.817, 65536: 0.732, 131072: 0.651}[s]


def test_the_bridge_rows_pay_their_host_but_the_full_iteration_graph_recipes():
    """Every Megatron-Bridge MoE run launches from Megatron's eager loop (CUDA graphs at most
    over the recipe's scopes) and is simulated with its host by default, but the three
    DeepSeek-V3 FP8-MX recipes that graph the whole step; the Folding and DeepSeek rows are
    not (no stated launch setup), and a host row's config carries the recipe's scopes."""
    for row in BRIDGE_ROWS:
        full = row.name.split(",")[0].split(" ", 1)[1] in {
            f"{m} {s} {p}" for m, s, p in FULL_ITERATION}
        assert row.host is not full, row.name
        if row.host:
            sim = row.config(True)["sim"]
            assert sim["host"] is True
            assert sim.get("cuda_graph_scope", "") == row.graphs
    assert not any(r.host for rows in FOLDING_ROWS.values() for r in rows)
    assert not any(r.host for r in DEEPSEEK_ROWS)


def test_the_qwen3_30b_card_and_pai_figures_are_their_step_times():
    """Each new row's tokens/s is its source's GBS x sequence / GPUs / step time: the card's
    5,854.910 ms (GB300) and 20,147.290 ms (H100) to its three decimals, Pai issue #643's
    10.361 s and 20.992 s to its whole tokens; the card's 1,030.070 TFLOP/s (GB300) is its
    tokens/s times Megatron's causal count per token, to five digits."""
    steps = {"card Qwen3-30B-A3B GB300 FP8-MX benchmark, 8 GPUs": 5.854910,
             "card Qwen3-30B-A3B H100 BF16 benchmark, 16 GPUs": 20.147290,
             "Pai Qwen3-30B-A3B H800 BF16 pp2 ep8, 16 GPUs": 10.361,
             "Pai Qwen3-30B-A3B H800 BF16 pp4 ep4, 16 GPUs": 20.992}
    rows = {r.name: r for r in CARD_ROWS + PAI_ROWS}
    for name, step in steps.items():
        row = rows[name]
        derived = row.tokens / row.gpus / step
        assert row.published is not None
        assert abs(derived - row.published) < (0.5 if name.startswith("Pai") else 0.01), name
    gb300 = rows["card Qwen3-30B-A3B GB300 FP8-MX benchmark, 8 GPUs"]
    model = ModelSpec(**gb300.model)
    per_token = megatron_num_flops(model, 1, causal=True) / model.seq_len
    assert gb300.published is not None
    assert gb300.published * per_token / 1e12 == pytest.approx(1030.070, abs=0.005)
    weak = [r for r in CARD_ROWS if "weak scaling" in r.name]
    assert {r.gpus: (r.published, r.parallel["global_batch"]) for r in weak} == {
        g: (t, 64 * g) for g, t in WEAK_SCALING.items()}


def test_the_card_rows_state_their_recipes_graphs_and_sms():
    """The GB300 MXFP8 recipe graphs the whole step (no host), HybridEP at Megatron-Core's
    default SMs; the H100 BF16 one launches eagerly with moe_router / moe_preprocess graphed,
    HybridEP on its recipe's 32 SMs; both overlap the expert all-to-all, TP 1, PP 1. Pai's run
    launches eagerly with no graph, NCCL's all-to-all, a capacity factor of 1, unfused
    permutation and router."""
    for row in CARD_ROWS:
        p = row.parallel
        assert (p["tp"], p["pp"], p["overlap_moe_comm"], row.model["dispatch"]) == \
            (1, 1, True, "hybridep")
        h100 = row.name.startswith("card Qwen3-30B-A3B H100")
        assert row.host is h100 and row.graphs == ("moe_router moe_preprocess" if h100 else "")
        assert p.get("comm_sms", 0) == (32 if h100 else 0)
    for row in PAI_ROWS:
        m = row.model
        assert row.host and not row.graphs and m.get("dispatch", "nccl") == "nccl"
        assert (m["capacity_factor"], m["moe_permute_fusion"], m["moe_router_fusion"],
                m["seq_len"]) == (1.0, False, False, 8192)


def test_the_pai_rows_hold_their_closed_form_activations_and_fit_an_h800():
    """Issue #643's runs (Megatron-LM-250624: probabilities weighed in the experts' activation,
    `traces.moe_probs`) hold on their first pipeline rank pp micro-batches of 48/pp layers, each
    layer's stored activations in closed form: attention and norms 21.5 bytes per s·b·h (8
    replicated with no dropout, Q/K/V/O (4 + 4·4/32)·4096/2048 = 9, the q/k norms' inputs
    2·(1 + 1/8)·2 = 4.5), and per each of the R = T·k = 65,536 rows a rank's experts process
    (capacity factor 1: no rank above the balanced count) fc1's input h, the SwiGLU's 2f and
    fc2's f in bf16 plus one probability, and the router's T·E scores and map (4 + 1 bytes).
    That is 44.96 GB on either layout, 77.6 / 76.8 GiB in all: under the H800's 81,559 MiB,
    as the runs were. Weighed in the unpermute instead (Megatron-Core <= 0.12.0) each layer
    would keep its A = T·k combined outputs too, A·h·2 bytes: 89.6 / 88.8 GiB, over it."""
    t, h, f, e, k = 8192, 2048, 768, 128, 8
    rows = t * k
    layer = t * h * 21.5 + rows * (h + 3 * f) * 2 + rows * 4 + t * e * (4 + 1)
    assert layer == 936_640_512
    for row in PAI_ROWS:
        exp = experiment_from_dict(row.config(), name=row.name)
        pp = exp.layout.pp
        ranks = memory_by_pp_rank(exp.model, exp.layout)
        assert ranks[0].activations_bytes == pp * (48 // pp) * layer == 44_958_744_576
        peak = max(m.total_bytes for m in ranks)
        assert peak == ranks[0].total_bytes < 81559 * 2**20
        assert peak + 48 * rows * h * 2 > 81559 * 2**20  # the unpermute's outputs: no fit


def test_the_card_rows_hold_one_micro_batch_and_a_layer_under_the_combined_1f1b():
    """The card's GB300 and H100 runs overlap the expert all-to-all (Megatron-Core's combined
    1F1B at PP 1: F0, (F1 B0), ..., B(m-1)): each paired step stores the forward's layer i as
    it frees the backward's layer 47 - i, so the rank holds one micro-batch's 48 equal layers
    and the one stored ahead, 49 layers (not 96: `sim.models.activation_memory.pair_rise`),
    and both fit their GPUs, as they ran (the GB300 one 253.2 of 268.2 GiB, 417.5 before). The
    card states the H100 run's memory: "peak allocated memory remains below 65 GiB/GPU" (its
    expected result, steps 41-50): parasim's 58.1 GiB is (78.6 before, both micro-batches
    held whole)."""
    for row in CARD_ROWS[:1] + CARD_ROWS[-1:]:
        exp = experiment_from_dict(row.config(), name=row.name)
        layers = layer_bytes(exp.model, exp.layout, 0)
        assert len(layers) == 48 and len(set(layers)) == 1
        (rank,) = memory_by_pp_rank(exp.model, exp.layout)
        assert rank.activations_bytes == 49 * layers[0]
        assert rank.total_bytes < exp.cluster.accelerator.memory_bytes, row.name
    assert rank.total_bytes < 65 * 2**30  # the H100 row, last: the card's stated bound


def test_issue_4439s_row_is_its_tflops_over_the_causal_count():
    """Issue #4439's ~562 TFLOP/s is entered as tokens/s over Megatron's causal count per token
    of the row's own model (23.006 GFLOP at sequence 4,096), on the B200 recipe's MBS 4, EP 8,
    HybridEP without overlap, attn / moe_router / moe_preprocess graphed, its host paid."""
    (row,) = ISSUE_ROWS
    model = ModelSpec(**row.model)
    per_token = megatron_num_flops(model, 1, causal=True) / model.seq_len
    assert per_token == pytest.approx(QWEN3_30B_CAUSAL_FLOPS, rel=1e-12)
    assert row.published == pytest.approx(562e12 / per_token, rel=1e-12)
    p = row.parallel
    assert (row.gpus, p["micro_batch"], p["global_batch"], p["ep"], row.model["dispatch"]) == \
        (8, 4, 512, 8, "hybridep")
    assert not p.get("overlap_moe_comm") and row.host
    assert row.graphs == "attn moe_router moe_preprocess"
