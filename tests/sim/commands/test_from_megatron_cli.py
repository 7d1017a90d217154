"""`parasim from-megatron`: Megatron-Bridge's Llama 3 70B layout, as Megatron-LM flags and as
Bridge overrides, gives the shipped 70B example's [parallel] and [model]; what cannot be
expressed is named in one line; a missing world size or vocabulary is one refusal."""

import tomllib

import pytest

from sim.cli import main
from sim.config import example_path, experiment_from_dict, load_experiment, read_layout
from sim.frontdoors.megatron import arguments

# Megatron-Bridge, scripts/performance/configs/llama/llama3_workload_base_configs.py:
# LLAMA3_70B_PRETRAIN_CONFIG_H100_BF16 (TP 4, PP 4, CP 2, VP 5, 64 GPUs, GBS 128, MBS 1, seq
# 8192), with the Llama 3 70B model (Meta's config.json) and the recipe's DDP settings
# (distributed optimizer, overlapped gradient reduction in fp32), as Megatron-LM flags.
LLAMA70B = """
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64
    --group-query-attention --num-query-groups 8 --seq-length 8192
    --max-position-embeddings 8192 --vocab-size 128256 --swiglu --normalization RMSNorm
    --position-embedding-type rope --rotary-base 500000 --disable-bias-linear
    --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 --bf16
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 4 --context-parallel-size 2 --cp-comm-type p2p
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --grad-reduce-in-fp32
    --micro-batch-size 1 --global-batch-size 128 --lr 1.5e-4 --min-lr 1.5e-5
    --weight-decay 0.1 --clip-grad 1.0 --train-iters 1000 --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model meta-llama/Meta-Llama-3-70B --data-path /data/slimpajama
"""
BRIDGE = """
    model.num_layers=80 model.hidden_size=8192 model.ffn_hidden_size=28672
    model.num_attention_heads=64 model.num_query_groups=8 model.seq_length=8192
    model.vocab_size=128256 model.swiglu=true model.normalization=RMSNorm
    model.position_embedding_type=rope model.disable_bias_linear=true
    model.untie_embeddings_and_output_weights=true model.attention_dropout=0.0
    model.hidden_dropout=0.0 model.tensor_model_parallel_size=4
    model.pipeline_model_parallel_size=4 model.virtual_pipeline_model_parallel_size=5
    model.context_parallel_size=2 model.sequence_parallel=true
    ddp.use_distributed_optimizer=true ddp.overlap_grad_reduce=true ddp.grad_reduce_in_fp32=true
    train.micro_batch_size=1 train.global_batch_size=128
"""


def from_megatron(capsys, *argv):
    code = main(["from-megatron", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [LLAMA70B, BRIDGE], ids=["megatron-lm", "bridge"])
def test_bridge_llama3_70b_gives_the_shipped_70b_example(capsys, args):
    code, out, err = from_megatron(capsys, args, "--gpus", "64")
    assert code == 0 and err == ""
    data = tomllib.loads(out)
    example = load_experiment(example_path("llama3-70b-h100.toml"))
    assert read_layout(data["parallel"]) == example.layout
    assert data["cluster"] == {"preset": "dgx-h100", "nodes": 8}
    assert experiment_from_dict(data).model == example.model


def test_torchruns_world_size_is_read_from_the_launch_line(capsys):
    code, out, _ = from_megatron(capsys, "torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py",
                                 LLAMA70B)
    assert code == 0 and tomllib.loads(out)["parallel"]["dp"] == 2


def test_every_argument_it_cannot_express_is_named_in_one_line(capsys):
    code, out, err = from_megatron(capsys, LLAMA70B, "--manual-gc --cp-comm-type a2a "
                                   "--recompute-granularity full --recompute-method block "
                                   "--recompute-num-layers 1 --hidden-dropout 0.1", "--gpus", "64")
    assert code == 0
    assert err.count("\n") == 1 and err.startswith("parasim: warning: from-megatron: cannot "
                                                   "express, left out: --manual-gc; ")
    for text in ("--cp-comm-type a2a", "--recompute-method block --recompute-num-layers 1",
                 "--hidden-dropout 0.1 (parasim has one dropout"):
        assert text in err
    for harmless in ("--lr", "--tokenizer-model", "--data-path", "--rotary-base"):
        assert harmless not in err
    assert tomllib.loads(out)["parallel"]["cp_comm"] == "p2p"  # the expressible value stays


def test_megatron_defaults_are_written_where_parasims_differ(capsys):
    """No --overlap-grad-reduce: Megatron reduces after the backward; an MoE model without
    --moe-grouped-gemm runs a GEMM per expert."""
    args = LLAMA70B.replace("--overlap-grad-reduce", "") + \
        " --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2"
    code, out, _ = from_megatron(capsys, args, "--gpus", "64")
    data = tomllib.loads(out)
    assert code == 0 and data["parallel"]["overlap_grad_reduce"] is False
    assert data["model"]["moe_grouped_gemm"] is False


def test_deepseek_style_moe_arguments(capsys):
    args = ("--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096 "
            "--vocab-size 129280 --ffn-hidden-size 18432 --swiglu --normalization RMSNorm "
            "--position-embedding-type rope --disable-bias-linear --multi-latent-attention "
            "--q-lora-rank 1536 "
            "--kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 "
            "--num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
            "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq '([0]*3+[1]*58)' "
            "--moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-score-function "
            "sigmoid --moe-router-enable-expert-bias --moe-grouped-gemm --mtp-num-layers 1 "
            "--pipeline-model-parallel-size 16 --expert-model-parallel-size 64 "
            "--pipeline-model-parallel-layout 'Et|(tt|)*30mL' --fp8-format e4m3 "
            "--fp8-recipe blockwise --micro-batch-size 1 --global-batch-size 15360")
    code, out, err = from_megatron(capsys, args, "--gpus", "1024")
    assert code == 0 and err == ""
    model = tomllib.loads(out)["model"]
    assert (model["dense_layers"], model["shared_experts"], model["router_groups"],
            model["dtype"], model["fp8_recipe"]) == (3, 1, 8, "fp8", "blockwise")


def test_missing_world_or_vocabulary_is_one_refusal(capsys):
    code, _, err = from_megatron(capsys, LLAMA70B)
    assert code == 2 and err.startswith("parasim: error: --gpus: the world size is missing")
    code, _, err = from_megatron(capsys, LLAMA70B.replace("--vocab-size 128256", ""),
                                 "--gpus", "64")
    assert code == 2 and "do not give vocab" in err and err.count("\n") == 1
    code, _, err = from_megatron(capsys, LLAMA70B, "--gpus", "60")
    assert code == 2 and err == ("parasim: error: --gpus: 60 is not divisible by TP x CP x PP "
                                 "= 32\n")


def test_a_bridge_override_and_a_flag_with_equals_read_alike():
    assert list(arguments(["train.micro_batch_size=2", "--micro-batch-size=2"])) == [
        ("micro-batch-size", "2", "train.micro_batch_size=2"),
        ("micro-batch-size", "2", "--micro-batch-size=2")]


@pytest.mark.parametrize("args, message", [
    ("--num-layers abc", "--num-layers: 'abc' must be an integer"),
    ("'unclosed", "ARGS: cannot be split as a shell would: No closing quotation"),
    ("--num-layers 8 --pipeline-model-parallel-layout '(('", "parallel.pipeline_layout: "),
    ("--num-layers 8 --num-layers-per-virtual-pipeline-stage 3 "
     "--pipeline-model-parallel-size 2", "--num-layers-per-virtual-pipeline-stage: 3 does not "
     "divide 8 layers over 2 stages"),
    ("--swiglu=maybe --num-layers 8", "--swiglu=maybe: 'maybe' must be true or false"),
])
def test_bad_arguments_are_one_line(capsys, args, message):
    code, out, err = from_megatron(capsys, f" {args}", "--gpus", "8")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"parasim: error: {message}")


def test_without_a_global_batch_megatrons_default_is_one_micro_batch_per_dp_rank(capsys):
    args = LLAMA70B.replace("--global-batch-size 128", "").replace(
        "--micro-batch-size 1", "--micro-batch-size 2").replace(
        "--num-layers-per-virtual-pipeline-stage 4", "")  # 1F1B: fewer micro-batches than pp
    code, out, _ = from_megatron(capsys, args, "--gpus", "64")
    assert code == 0 and tomllib.loads(out)["parallel"]["global_batch"] == 2 * 2


@pytest.mark.parametrize("flags", ["--fp4-format e2m1 --fp4-recipe nvfp4",
                                   "model.fp4=e2m1 model.fp4_recipe=nvfp4"],
                         ids=["megatron-lm", "bridge"])
def test_nvfp4_flags_give_the_fp4_dtype_and_its_recipe(capsys, flags):
    """Megatron-Core's --fp4-format e2m1 --fp4-recipe nvfp4 (Megatron-Bridge's
    bf16_with_nvfp4_mixed sets fp4 and fp4_recipe so): dtype fp4 over --bf16's storage."""
    code, out, err = from_megatron(capsys, LLAMA70B + " " + flags, "--gpus", "64",
                                   "--cluster", "dgx-b200")
    assert code == 0 and err == "", err
    model = tomllib.loads(out)["model"]
    assert (model["dtype"], model["fp4_recipe"]) == ("fp4", "nvfp4")


def test_nvfp4_on_the_default_hopper_cluster_is_one_refusal(capsys):
    code, out, err = from_megatron(capsys, LLAMA70B + " --fp4-format e2m1", "--gpus", "64")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert "model.dtype: \"fp4\" needs FP4 tensor cores, which H100-SXM5-80GB does not " \
        "have" in err, err


def test_grouped_gemm_writes_te_groupedlinears_four_streams(capsys):
    """--moe-grouped-gemm builds Megatron-Core's TEGroupedMLP (TE's GroupedLinear: a cuBLAS GEMM
    per local expert on 4 streams), written out; without it a GEMM per expert and no streams;
    the legacy GroupedMLP's kernels depend on grouped_gemm's build: left out, named."""
    moe = LLAMA70B + " --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2"
    code, out, err = from_megatron(capsys, moe + " --moe-grouped-gemm", "--gpus", "64")
    model = tomllib.loads(out)["model"]
    assert code == 0 and (model["moe_grouped_gemm"], model["moe_gemm_streams"]) == (True, 4)
    code, out, _ = from_megatron(capsys, moe, "--gpus", "64")
    assert code == 0 and "moe_gemm_streams" not in tomllib.loads(out)["model"]
    code, out, err = from_megatron(capsys, moe + " --moe-grouped-gemm "
                                   "--moe-use-legacy-grouped-gemm", "--gpus", "64")
    assert code == 0 and "moe_gemm_streams" not in tomllib.loads(out)["model"]
    assert "--moe-use-legacy-grouped-gemm" in err
