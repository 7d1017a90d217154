"""Model arithmetic against the Megatron-LM papers' closed forms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.step_flops import megatron_step_flops, model_flops, recompute_flops

GPT3 = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)


@given(layers=st.integers(1, 128), heads=st.integers(1, 64), head_dim=st.integers(1, 256),
       seq=st.integers(1, 8192), vocab=st.integers(1, 2**17), batch=st.integers(1, 4096))
def test_step_flops_equal_megatrons_72_and_96_forms(layers, heads, head_dim, seq, vocab, batch):
    m = ModelSpec(layers=layers, hidden=heads * head_dim, heads=heads, seq_len=seq, vocab=vocab)
    assert model_flops(m, batch) == pytest.approx(megatron_step_flops(m, batch, False), rel=1e-12)
    full = model_flops(m, batch) + recompute_flops(m, batch, "full")
    assert full == pytest.approx(megatron_step_flops(m, batch, True), rel=1e-12)


def test_selective_recompute_reruns_only_the_attention_core():
    extra = recompute_flops(GPT3, 1536, "selective")
    assert extra == 1536 * 96 * 4 * 2048**2 * 12288  # 4*b*s^2*h per layer
    assert recompute_flops(GPT3, 1536, "none") == 0


def test_gpt3_has_175_billion_parameters():
    assert GPT3.layer_params() == 12 * 12288**2 + 13 * 12288  # 12h^2 + 13h with f = 4h
    assert GPT3.num_params() == pytest.approx(175e9, rel=0.005)


def test_tensor_parallel_split_of_a_layer():
    t = 8
    per_rank = GPT3.layer_params(t)
    replicated = 6 * 12288  # two biases and two layer norms stay whole on every rank
    assert per_rank * t - replicated * (t - 1) == GPT3.layer_params()
    assert GPT3.attn_flops(1, t) * t == GPT3.attn_flops(1)


SMALL = ModelSpec(layers=16, hidden=1024, heads=16, seq_len=512, vocab=32000)
UNTIED = ModelSpec(layers=16, hidden=1024, heads=16, seq_len=512, vocab=32000,
                   tied_embeddings=False)


def _per_pp_rank(model: ModelSpec, layout: Layout) -> tuple[list[float], list[float]]:
    stages = [layout.stages_of_rank(r) for r in range(layout.pp)]
    return ([model.params_on_stages(s, layout.num_stages, layout.tp) for s in stages],
            [model.head_params_on_stages(s, layout.tp) for s in stages])


@pytest.mark.parametrize(("model", "options", "params", "heads"), [
    # the numbers `Layout.params_on_rank` and `head_params_on_rank` gave before they moved here
    (SMALL, dict(pp=4, global_batch=4), [83677184, 50384896, 50384896, 83154944],
     [2048, 32770048, 32770048, 32770048]),
    (SMALL, dict(tp=2, pp=2, dp=2, global_batch=4), [67317760, 66795520], [2048, 16386048]),
    (SMALL, dict(tp=4, pp=4, vp=2, schedule="interleaved", global_batch=8),
     [21330944, 12614656, 12614656, 20808704], [2048, 8194048, 8194048, 8194048]),
    (UNTIED, dict(tp=2, pp=4, global_batch=4), [42113024, 25204736, 25204736, 41590784],
     [16386048] * 4),
    (SMALL, dict(tp=8, global_batch=1), [29900800], [2048]),
])
def test_params_per_pipeline_rank_are_the_models(model, options, params, heads):
    assert _per_pp_rank(model, Layout(**options)) == (params, heads)


def test_params_on_the_pipeline_ranks_add_up_to_the_model():
    layout = Layout(tp=1, pp=4, dp=1, global_batch=4)
    total = sum(_per_pp_rank(SMALL, layout)[0])
    # the last stage keeps its own copy of the tied word embeddings (Megatron, pp > 1)
    assert total == SMALL.num_params() + SMALL.vocab * SMALL.hidden
    assert SMALL.params_on_stages([0], 1, 1) == SMALL.num_params()  # pp = 1: one tensor
    assert sum(_per_pp_rank(UNTIED, layout)[0]) == UNTIED.num_params()


def test_model_spec_rejects_bad_values():
    with pytest.raises(ConfigError, match="model.layers: 0 must be a positive integer"):
        ModelSpec(layers=0, hidden=64, heads=4, seq_len=8, vocab=8)
    with pytest.raises(ConfigError, match="model.hidden: 100 is not divisible by model.heads"):
        ModelSpec(layers=1, hidden=100, heads=3, seq_len=8, vocab=8)
    with pytest.raises(ConfigError, match="model.ffn_hidden: -4 must be a positive integer"):
        ModelSpec(layers=1, hidden=64, heads=4, seq_len=8, vocab=8, ffn_hidden=-4)
    with pytest.raises(ConfigError, match="model.dtype: 'nvfp4' is not one of bf16, fp16, fp32, "
                       "fp8, fp4"):
        ModelSpec(layers=1, hidden=64, heads=4, seq_len=8, vocab=8, dtype="nvfp4")
