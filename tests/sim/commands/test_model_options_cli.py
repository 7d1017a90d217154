"""Issue 18's [model] keys at the command line: every bad value is one line and exit 2; the
summary prints the architecture; the plan's header stores the keys (and only where they are not
GPT's defaults, so older readers and older traces agree); the Blackwell presets build."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from topology.config import read_cluster
from traces.header import TraceMeta
from traces.header_json import meta_from_json, meta_to_json
from traces.io import load
from traces.model import ModelSpec

LLAMA = {"layers": "4", "hidden": "256", "heads": "16", "kv_heads": "4", "seq_len": "128",
         "vocab": "1024", "ffn": '"swiglu"', "ffn_hidden": "512", "norm": '"rmsnorm"',
         "position": '"rope"', "bias": "false"}
BASE = {"model": LLAMA, "parallel": {"tp": "2", "pp": "2", "dp": "2", "global_batch": "8"},
        "cluster": {"preset": '"dgx-h100"', "nodes": "1"}}


def toml(**edits: dict[str, str | None]) -> str:
    lines = []
    for table in BASE:
        keys = {**BASE[table], **edits.get(table, {})}
        lines.append(f"[{table}]")
        lines += [f"{k} = {v}" for k, v in keys.items() if v is not None]
    return "\n".join(lines) + "\n"


def run(capsys, tmp_path, text: str, *flags: str) -> tuple[int, str, str]:
    path = tmp_path / "c.toml"
    path.write_text(text)
    code = main(["simulate", str(path), *flags])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("model", "needle"), [
    ({"kv_heads": "3"}, "model.kv_heads: 3 does not divide model.heads = 16"),
    ({"kv_heads": "32"}, "model.kv_heads: 32 must be an integer from 1 to model.heads = 16"),
    ({"kv_heads": "-2"}, "model.kv_heads: -2 must be"),
    ({"kv_heads": "2.5"}, "model.kv_heads: 2.5 must be"),
    ({"kv_heads": '"8"'}, "model.kv_heads: '8' must be"),
    ({"kv_heads": "1"}, "parallel.tp: 2 does not divide model.kv_heads = 1"),
    ({"ffn": '"relu"'}, "model.ffn: 'relu' is not one of gelu, swiglu"),
    ({"ffn": "1"}, "model.ffn: 1 is not one of gelu, swiglu"),
    ({"ffn_hidden": None}, "model.ffn_hidden: required with ffn = \"swiglu\""),
    ({"ffn_hidden": "-1"}, "model.ffn_hidden: -1 must be a positive integer"),
    ({"norm": '"batchnorm"'}, "model.norm: 'batchnorm' is not one of layernorm, rmsnorm"),
    ({"position": '"alibi"'}, "model.position: 'alibi' is not one of learned, rope"),
    ({"bias": '"false"'}, "model.bias: 'false' must be true or false"),
    ({"bias": "0"}, "model.bias: 0 must be true or false"),
    ({"dtype": '"nvfp4"'}, "model.dtype: 'nvfp4' is not one of bf16, fp16, fp32, fp8, fp4"),
    ({"dtype": '"fp4"', "fp4_recipe": '"mxfp4"'}, "model.fp4_recipe: 'mxfp4' is not one of nvfp4"),
    ({"dtype": '"fp4"', "kernels": '"compiled"'}, "model.kernels: 'compiled' with model.dtype = "
                                                  "\"fp4\": NVFP4 is Transformer Engine's"),
    ({"fp4_recipe": '"nvfp4"'}, "model.fp4_recipe: 'nvfp4' applies only with model.dtype = "
                                "\"fp4\", not 'bf16'"),
    ({"fp8_recipe": '"mxfp8"'}, "model.fp8_recipe: 'mxfp8' applies only with model.dtype"),
    ({"dtype": '"fp8"', "fp8_recipe": '"nvfp4"'}, "model.fp8_recipe: 'nvfp4' is not one of"),
])
def test_bad_values_are_one_line_and_exit_2(capsys, tmp_path, model, needle):
    code, out, err = run(capsys, tmp_path, toml(model=model), "--json")
    assert (code, out) == (2, ""), err
    assert err.startswith("parasim: error: ") and err.count("\n") == 1, err
    assert needle in err, err


@pytest.mark.parametrize(("model", "needle"), [
    ({"dtype": '"fp4"'}, "model.dtype: \"fp4\" needs FP4 tensor cores, which H100-SXM5-80GB "
                         "does not have (Blackwell does: B200, GB200, B300, GB300)"),
    ({"dtype": '"fp4"', "fp4_recipe": '"nvfp4"'}, "model.dtype: \"fp4\" needs FP4 tensor "
                                                  "cores, which H100-SXM5-80GB does not have"),
])
def test_fp4_on_hopper_is_one_line_and_exit_2(capsys, tmp_path, model, needle):
    """NVFP4 needs Blackwell's FP4 tensor cores: on the H100 preset the config is refused in
    one line naming the field, its value and the rule."""
    code, out, err = run(capsys, tmp_path, toml(model=model), "--json")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith("parasim: error: ") and needle in err, err


def test_an_empty_fp4_recipe_is_refused_on_blackwell(capsys, tmp_path):
    text = toml(model={"dtype": '"fp4"', "fp4_recipe": '""'},
                cluster={"preset": '"dgx-b200"'})
    code, out, err = run(capsys, tmp_path, text, "--json")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert "model.fp4_recipe: \"\" is not one of nvfp4; leave the key out" in err, err


def test_an_fp4_model_runs_on_blackwell_at_the_fp4_peak(capsys, tmp_path):
    """The summary names the recipe and the peak MFU is against; the header keeps the key."""
    text = toml(model={"dtype": '"fp4"'}, cluster={"preset": '"dgx-b200"'})
    trace = tmp_path / "t.json"
    code, out, err = run(capsys, tmp_path, text, "--trace", str(trace))
    assert code == 0, err
    assert "(nvfp4 scaling; MFU against the FP4 peak)" in out, out
    model = load(trace).meta.model
    assert model is not None and (model.dtype, model.fp4_recipe) == ("fp4", "nvfp4")
    assert json.loads(trace.read_text())["meta"]["model"]["fp4_recipe"] == "nvfp4"


@pytest.mark.parametrize(("cluster", "name"), [
    ({"preset": '"dgx-a100"'}, "A100-SXM4-80GB"),
    ({"preset": '"tpu-v4"', "nodes": None, "dims": "[2, 2, 2]"}, "TPU-v4"),
])
def test_fp8_without_fp8_tensor_cores_is_one_line(capsys, tmp_path, cluster, name):
    code, out, err = run(capsys, tmp_path, toml(model={"dtype": '"fp8"'}, cluster=cluster))
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert f"model.dtype: \"fp8\" needs FP8 tensor cores, which {name} does not have" in err


def test_the_summary_prints_the_architecture(capsys, tmp_path):
    code, out, err = run(capsys, tmp_path, toml(model={"dtype": '"fp8"'}))
    assert code == 0, err
    assert ("model               GQA 4 kv heads, swiglu 512, rmsnorm, rope positions, no biases, "
            "dropout 0.1, fp8 (delayed scaling; MFU against the FP8 peak)") in out
    code, out, _ = run(capsys, tmp_path, toml(model={"kv_heads": "16", "ffn": None,
                                                     "ffn_hidden": None, "norm": None,
                                                     "position": None, "bias": None}))
    assert ("model               MHA, gelu 1024, layernorm, learned positions, biases, "
            "dropout 0.1, bf16") in out


def test_the_plan_header_stores_the_keys(capsys, tmp_path):
    trace = tmp_path / "t.json"
    code, _, err = run(capsys, tmp_path, toml(model={"dtype": '"fp8"'}), "--trace", str(trace))
    assert code == 0, err
    model = load(trace).meta.model
    assert model is not None
    assert (model.kv_heads, model.ffn, model.norm, model.position, model.bias, model.dtype,
            model.fp8_recipe) == (4, "swiglu", "rmsnorm", "rope", False, "fp8", "delayed")
    meta = json.loads(trace.read_text())["meta"]["model"]
    assert meta["kv_heads"] == 4 and meta["bias"] is False


def test_a_gpt_header_is_what_it_was_and_an_old_one_reads_as_gpt():
    gpt = ModelSpec(layers=2, hidden=64, heads=4, seq_len=16, vocab=32)
    written = meta_to_json(TraceMeta(model=gpt))["model"]
    assert list(written) == ["layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden",
                             "dtype", "tied_embeddings", "attention"]
    back = meta_from_json(meta_to_json(TraceMeta(model=gpt)), 3).model
    assert back == gpt and back.kv_heads == 4 and back.ffn == "gelu" and back.bias


@pytest.mark.parametrize(("preset", "gpus"), [("dgx-b200", 8), ("gb200-nvl72", 72)])
def test_blackwell_presets(preset, gpus):
    cluster = read_cluster({"preset": preset, "nodes": 2}).build()
    acc = cluster.accelerator
    assert cluster.devices_per_server == gpus and cluster.num_devices == 2 * gpus
    assert acc.peak_flops_fp8 == 2 * acc.peak_flops and acc.fp8_block_scaling


def test_tp_spans_an_nvl72_rack_on_nvlink(capsys, tmp_path):
    text = toml(model={"heads": "72", "kv_heads": "72", "hidden": "4608", "ffn_hidden": "9216",
                       "vocab": "7200"},
                parallel={"tp": "72", "pp": "1", "dp": "1", "global_batch": "1"},
                cluster={"preset": '"gb200-nvl72"'})
    code, out, err = run(capsys, tmp_path, text, "--json")
    assert code == 0, err
    assert json.loads(out)["world"] == 72 and err == ""  # no "TP across nodes" warning
