"""`--model hf:PATH` and `[model] from = "hf:PATH"`: published config.json files (tests/data/hf,
each from its Hugging Face repository) give the shipped examples' [model]; what parasim cannot
express is one line, exit 2; unknown fields one warning line."""

import dataclasses
import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import example_path, experiment_from_dict, load_experiment
from sim.frontdoors.hf import read_hf
from sim.frontdoors.model_source import resolve_model
from sim.settings import apply_settings, parse_settings
from traces.errors import ConfigError
from traces.files import load_toml
from traces.model import ModelSpec

HF = Path(__file__).parents[1] / "data" / "hf"
LLAMA = HF / "Meta-Llama-3-8B.config.json"
DEEPSEEK = HF / "DeepSeek-V3.config.json"
QWEN = HF / "Qwen3-32B.config.json"


def flag_model(example, source):
    """The example's experiment with `--model hf:SOURCE` applied, as the command line does."""
    path = example_path(example)
    settings = parse_settings(_flag_texts(source))
    data = apply_settings(load_toml(path), settings)
    return experiment_from_dict(data, name=path.stem, base=path.parent).model


def _flag_texts(source):
    from sim.settings import ModelFlag

    return [ModelFlag(f"hf:{source}")]


def from_model(table):
    """A [model] table with `from` read on its own (the TOML path)."""
    return ModelSpec(**resolve_model({"model": table}, Path("/"))["model"])


def test_llama3_8b_config_gives_the_shipped_llama3_8b_model():
    expected = load_experiment(example_path("llama3-8b-128k-h100.toml")).model
    assert flag_model("llama3-8b-128k-h100.toml", LLAMA) == expected
    # In a TOML: the file's keys, then the table's own (the 128K sequence) on top.
    assert from_model({"from": f"hf:{LLAMA}", "seq_len": 131072}) == expected


def test_deepseek_v3_config_gives_the_shipped_model_plus_what_the_example_leaves_out():
    """The released config also has group-limited routing (n_group 8, topk_group 4) and one MTP
    module, which the shipped example leaves out (its comment says so); everything else,
    MLA, 256 experts, the 3 dense layers, sigmoid scores with expert bias, is equal."""
    expected = load_experiment(example_path("deepseek-v3-1024-h100.toml")).model
    read = flag_model("deepseek-v3-1024-h100.toml", DEEPSEEK)
    assert (read.router_groups, read.router_group_topk, read.mtp_layers) == (8, 4, 1)
    assert dataclasses.replace(read, router_groups=0, router_group_topk=0, mtp_layers=0) == \
        expected
    # Without seq_len the pre-training context: YaRN's original 4,096, not 163,840.
    assert from_model({"from": f"hf:{DEEPSEEK}"}).seq_len == 4096 == expected.seq_len


def test_qwen3_32b_config_gives_the_shipped_model_with_its_head_dim_and_qk_norm():
    expected = load_experiment(example_path("qwen3-32b-h100.toml")).model
    read = flag_model("qwen3-32b-h100.toml", QWEN)
    assert (read.head_dim, read.qk_norm) == (128, True)
    assert read == expected


def test_mixtral_config_counts_the_published_parameters(tmp_path):
    """Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): 46,702,792,704 parameters, the
    sum of its safetensors shards' tensors (routers included)."""
    cfg = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
           "max_position_embeddings": 32768, "sliding_window": None, "rope_theta": 1e6,
           "tie_word_embeddings": False, "hidden_act": "silu", "router_aux_loss_coef": 0.02}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = from_model({"from": f"hf:{tmp_path / 'config.json'}"})
    assert model.num_params() == 46_702_792_704


def write(tmp_path, **cfg):
    base = json.loads(LLAMA.read_text())
    base.update(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base))
    return path


def test_every_inexpressible_field_is_named_in_one_refusal(tmp_path, capsys):
    path = write(tmp_path, hidden_act="gelu", mlp_bias=True)
    code = main(["simulate", str(example_path("llama3-70b-h100.toml")), "--model", f"hf:{path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "hidden_act = 'gelu'" in err and "attention_bias != mlp_bias" in err


@pytest.mark.parametrize("cfg", [{"model_type": "gpt2"}, {"model_type": None}])
def test_a_family_parasim_does_not_read_is_refused(tmp_path, cfg):
    with pytest.raises(ConfigError, match="is not one parasim reads"):
        read_hf(write(tmp_path, **cfg))


def test_a_sliding_window_shorter_than_the_sequence_is_refused(tmp_path):
    path = write(tmp_path, model_type="mistral", sliding_window=4096)
    assert from_model({"from": f"hf:{path}", "seq_len": 4096}).seq_len == 4096  # no effect
    with pytest.raises(ConfigError, match="sliding_window = 4096 shorter than model.seq_len"):
        from_model({"from": f"hf:{path}", "seq_len": 8192})
    qwen = write(tmp_path, model_type="qwen2", sliding_window=4096, use_sliding_window=False)
    assert from_model({"from": f"hf:{qwen}", "seq_len": 8192}).seq_len == 8192  # unused


def test_unknown_fields_are_named_in_one_warning_line(tmp_path, capsys):
    path = write(tmp_path, new_field_a=1, zz_other={"x": 2})
    code = main(["simulate", str(example_path("llama3-8b-128k-h100.toml")), "--model",
                 f"hf:{path}", "--json"])
    err = capsys.readouterr().err
    assert code == 0
    assert err.splitlines() == [f"parasim: warning: hf:{path}: fields parasim does not know, "
                                "left out: new_field_a, zz_other"]


def test_the_flag_replaces_the_configs_model_and_set_applies_after_it():
    """--model replaces even keys the TOML states (GPT-3's 96 layers become Llama's 32) and keeps
    its seq_len; --set, wherever it stands, applies on top."""
    gpt3 = load_experiment(example_path()).model
    exp = experiment_from_dict(apply_settings(load_toml(example_path()), parse_settings(
        ["model.layers=16", *_flag_texts(LLAMA)])), base=example_path().parent)
    assert (exp.model.layers, exp.model.hidden, exp.model.seq_len) == (16, 4096, gpt3.seq_len)


def test_a_bad_source_is_one_line(tmp_path, capsys):
    toml = tmp_path / "c.toml"
    text = example_path("gpt-tiny-localhost.toml").read_text()
    toml.write_text(text.replace("[model]\n", "[model]\nfrom = \"llama.json\"\n", 1))
    assert main(["simulate", str(toml)]) == 2
    assert capsys.readouterr().err == ("parasim: error: model.from: 'llama.json' must be "
                                       "\"hf:PATH\" (a Hugging Face config.json)\n")
    toml.write_text(text.replace("[model]\n", "[model]\nfrom = \"hf:missing.json\"\n", 1))
    assert main(["simulate", str(toml)]) == 2
    assert "missing.json" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "a config.json holds a JSON object, not [1, 2]"),
    ("{bad", "not a JSON file"),
    ('{"model_type": "llama", "hidden_size": 64}',
     "missing num_hidden_layers, num_attention_heads, vocab_size, intermediate_size"),
    (" " * (2**20 + 1), "larger than 1,048,576 bytes"),
])
def test_a_broken_file_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    code = main(["simulate", str(example_path("gpt-tiny-localhost.toml")), "--model",
                 f"hf:{path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err
    assert err.startswith("parasim: error: hf") and str(path) in err


def test_a_deepseek_layer_pattern_parasim_cannot_express_is_refused(tmp_path):
    cfg = json.loads(DEEPSEEK.read_text())
    cfg["moe_layer_freq"] = 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="cannot express moe_layer_freq = 2"):
        read_hf(path)


def test_the_provenance_covers_the_config_json_it_read(tmp_path, capsys):
    """config_sha256 changes with the config.json's bytes (same path, same flags), by the flag
    and by `[model] from` alike."""
    path = write(tmp_path)
    toml = tmp_path / "job.toml"
    toml.write_text(example_path("llama3-8b-128k-h100.toml").read_text().replace(
        "[model]\n", "[model]\nfrom = \"hf:config.json\"\n", 1))

    def digests():
        out = []
        for argv in (["simulate", str(example_path("llama3-8b-128k-h100.toml")), "--model",
                      f"hf:{path}", "--json"], ["simulate", str(toml), "--json"]):
            assert main(argv) == 0
            out.append(json.loads(capsys.readouterr().out)["parasim"]["config_sha256"])
        return out

    before = digests()
    path.write_text(path.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e-06'))
    after = digests()
    assert before[0] != after[0] and before[1] != after[1]


QWEN_MOE = HF / "Qwen3-235B-A22B.config.json"


def test_qwen3_235b_config_gives_the_shipped_model_but_the_unused_dense_width():
    """Every Qwen3-235B layer is MoE (mlp_only_layers [], decoder_sparse_step 1), so the file's
    intermediate_size 12,288 is the width of a dense MLP no layer has; the shipped example
    writes 1,536 there. All else is equal, parameters too."""
    expected = load_experiment(example_path("qwen3-235b-a22b-256-b200.toml")).model
    read = flag_model("qwen3-235b-a22b-256-b200.toml", QWEN_MOE)
    assert read.ffn_hidden == 12288
    assert dataclasses.replace(read, ffn_hidden=expected.ffn_hidden) == expected
    assert (read.num_params(), read.active_params()) == \
        (expected.num_params(), expected.active_params())


@pytest.mark.slow
def test_qwen3_235b_step_is_the_shipped_examples(capsys):
    """The whole predicted step, every figure of --json but the provenance, is the example's."""
    example = str(example_path("qwen3-235b-a22b-256-b200.toml"))
    outs = []
    for extra in ([], ["--model", f"hf:{QWEN_MOE}"]):
        assert main(["simulate", example, "--json", *extra]) == 0
        data = json.loads(capsys.readouterr().out)
        data.pop("parasim")
        outs.append(data)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("field, value", [("attention_bias", [1]), ("mlp_bias", {"a": 1}),
                                          ("model_type", ["llama"]), ("num_hidden_layers", "32"),
                                          ("head_dim", {"a": 1}), ("rope_scaling", [1])])
def test_odd_values_are_one_line_never_a_traceback(tmp_path, capsys, field, value):
    path = write(tmp_path, **{field: value})
    code = main(["simulate", str(example_path("llama3-8b-128k-h100.toml")), "--model",
                 f"hf:{path}"])
    err = capsys.readouterr().err
    assert code in (0, 2) and err.count("\n") <= 1 and "Traceback" not in err
    if field != "rope_scaling":  # a list there is no scaling: the context is the file's own
        assert code == 2
