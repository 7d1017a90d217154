"""bench_recipes.py's arithmetic against its sources: the FLOP counts each source uses, its
unit conversions against the sources' own paired columns, and that every row either builds or
is refused in one ConfigError line (the benchmark's "not expressible")."""

from __future__ import annotations

import pytest
from bench_recipes import (
    MEGASCALE_SECONDS,
    SCALE_OUT,
    figure,
    flops_per_token,
    scale_out_loss,
    tokens,
)
from recipes_bridge import BRIDGE_ROWS, PAIRS_2511
from recipes_rows import LLAMA3_ROWS, MEGASCALE_ROWS, TITAN_ASYNCTP_ROWS, TORCHTITAN_ROWS

from sim.config import experiment_from_dict
from traces.errors import ConfigError
from traces.model import ModelSpec
from traces.step_flops import megatron_num_flops


@pytest.mark.parametrize("row", [LLAMA3_ROWS[0], LLAMA3_ROWS[2], MEGASCALE_ROWS[0]],
                         ids=lambda r: r.name)
def test_the_full_count_is_megatron_num_flops(row):
    """Read off the row's table, Megatron's count equals traces.step_flops' (GQA, SwiGLU and
    GeLU shapes), an independent path to the same formula."""
    ours = flops_per_token(row.model, causal=False) * tokens(row)
    theirs = megatron_num_flops(ModelSpec(**row.model), row.parallel["global_batch"])
    assert ours == pytest.approx(theirs, rel=1e-12)


@pytest.mark.parametrize(("row", "tflops"), PAIRS_2511, ids=lambda r: getattr(r, "name", ""))
def test_nvidia_model_tflops_are_the_causal_count(row, tflops):
    """Each published Model TFLOP/s over its tokens/s is the causal count per token, to the
    rounding of the two published integers."""
    published = tflops * 1e12 / row.published
    ours = flops_per_token(row.model, causal=True)
    assert abs(ours / published - 1) <= 0.5 / row.published + 0.5 / tflops


@pytest.mark.parametrize("row", MEGASCALE_ROWS, ids=lambda r: r.name)
def test_megascale_mfu_is_the_full_count_of_its_iteration_time(row):
    """Table 2's iteration time, through figure()'s MFU path, gives its MFU column, to the
    rounding of both (times to 0.1 s below 3,072 GPUs and 0.01 s above, MFU to 0.1 point)."""
    seconds = MEGASCALE_SECONDS[row.gpus]
    ours = figure(row, seconds)
    step = 0.05 if row.gpus < 3072 else 0.005
    assert abs(ours / row.published - 1) <= step / seconds + 0.05 / row.published


def test_the_scale_out_losses_are_table_2s():
    """The issue's 19.0% and 18.1% are Table 2's GPU-seconds per step, large over small."""
    losses = [round(100 * scale_out_loss(MEGASCALE_SECONDS, *span), 1) for span in SCALE_OUT]
    assert losses == [19.0, 18.1]


@pytest.mark.parametrize("row", [r for r in TORCHTITAN_ROWS if r.parallel.get("pp", 1) > 1],
                         ids=lambda r: r.name)
def test_torchtitan_pipelines_run_its_default_micro_batch_count(row):
    """torchtitan 9dec370, which ran the tables, split a rank's local batch into
    pipeline_parallel_degree micro-batches whatever the schedule (pp x stages a rank only
    from pytorch/torchtitan#781, 2025-01-07): 8 for every PP row, interleaved included."""
    p = row.parallel
    assert p["global_batch"] // p["dp"] // p["micro_batch"] == p["pp"] == 8


ROWS = [r for r in LLAMA3_ROWS + TORCHTITAN_ROWS + BRIDGE_ROWS + MEGASCALE_ROWS
        + TITAN_ASYNCTP_ROWS if r.gpus <= 1024]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_row_builds_or_is_refused_in_one_line(row):
    """A row parasim cannot express fails as the benchmark expects: a one-line ConfigError."""
    try:
        exp = experiment_from_dict(row.config(), name=row.name)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)
        return
    assert exp.cluster.num_devices == row.gpus


def test_the_nvfp4_row_states_megatron_bridge_s_nvfp4_recipe():
    """bf16_with_nvfp4_mixed: fp4 e2m1 with the nvfp4 recipe, no FP8 parameter gather, every
    layer in NVFP4; on GB300, whose dense FP4 rate is 15 PF (1,080 PF for 72 GPUs)."""
    row = next(r for r in BRIDGE_ROWS if "NVFP4" in r.name)
    exp = experiment_from_dict(row.config(), name=row.name)
    assert (exp.model.dtype, exp.model.fp4_recipe, exp.model.fp8_recipe) == ("fp4", "nvfp4", "")
    assert not exp.layout.fp8_param_gather
    assert exp.cluster.accelerator.peak_flops_fp4 == 15e15


def test_the_2025_asynctp_rows_are_table_4_s_run_but_the_precision():
    """The June 2025 benchmark's tensorwise pair is Table 4's pair as configured (model,
    layout, cluster); each AsyncTP row differs from its vanilla one by tp_comm_overlap only."""
    table4 = [r for r in TORCHTITAN_ROWS if r.name.startswith("70B 2D")]
    tensorwise = [r for r in TITAN_ASYNCTP_ROWS if "tensorwise" in r.name]
    for old, new in zip(table4, tensorwise, strict=True):
        assert (dict(old.model), dict(old.parallel), dict(old.cluster)) == \
            (dict(new.model), dict(new.parallel), dict(new.cluster))
    for vanilla, asynctp in zip(TITAN_ASYNCTP_ROWS[::2], TITAN_ASYNCTP_ROWS[1::2], strict=True):
        assert dict(asynctp.parallel) == {**vanilla.parallel, "tp_comm_overlap": True}
        assert dict(asynctp.model) == dict(vanilla.model)
