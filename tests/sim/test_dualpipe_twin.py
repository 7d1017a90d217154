"""schedule = "dualpipe" (issue 33, item 1): deepseek-ai/DualPipe's rules in one line each;
simulated as its DualPipeV twin (`traces.dualpipe_twin`), whose per-rank order is the
repository's (rank r and pp - 1 - r both run the twin's rank min(r, pp - 1 - r)) and whose
ranks hold DualPipe's two copies: a stage of each direction, twice 1F1B's parameters."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.config import experiment_from_dict
from sim.models.memory import memory_by_pp_rank
from sim.simulate import predict
from traces.dualpipe_order import dualpipe_order
from traces.dualpipev_order import dualpipev_order
from traces.errors import ConfigError
from traces.layout import Schedule
from traces.pipeline import layout_schedule

CONFIG = {
    "model": {"layers": 8, "hidden": 1024, "heads": 8, "seq_len": 1024, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 2048, "experts": 8, "top_k": 2,
              "moe_ffn_hidden": 512, "dense_layers": 0, "bias": False,
              "tied_embeddings": False},
    "parallel": {"pp": 4, "schedule": "dualpipe", "dp": 2, "ep": 2, "global_batch": 16},
    "cluster": {"preset": "dgx-h800", "nodes": 1},
}


def _config(**parallel: object) -> dict:
    config = copy.deepcopy(CONFIG)
    config["parallel"].update(parallel)
    return config


@pytest.mark.parametrize(("layers", "parallel", "message"), [
    (6, {"pp": 3, "global_batch": 12}, "parallel.pp: 3; dualpipe (deepseek-ai/DualPipe) needs"),
    (8, {"pp": 8, "dp": 1, "global_batch": 14}, "parallel: 14 micro-batches; dualpipe"),
    (8, {"global_batch": 14}, "parallel: 7 micro-batches; dualpipe"),
    (8, {"vp": 2}, "parallel.vp: 2; dualpipe holds two copies"),
    (8, {"pp_first_layers": 1}, "parallel.schedule: \"dualpipe\" needs an even split"),
])
def test_deepseeks_rules_in_one_line(layers: int, parallel: dict, message: str) -> None:
    config = _config(**parallel)
    config["model"]["layers"] = layers
    with pytest.raises(ConfigError) as err:
        experiment_from_dict(config)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_twin_is_dualpipev_on_half_the_ranks_and_twice_the_replicas() -> None:
    exp = experiment_from_dict(_config())
    assert exp.twin_of is not None and exp.twin_of.schedule is Schedule.DUALPIPE
    assert (exp.layout.pp, exp.layout.dp, exp.layout.vp, exp.layout.schedule) == (
        2, 4, 2, Schedule.DUALPIPEV)
    assert exp.layout.world == exp.twin_of.world and exp.layout.num_microbatches == 4
    assert any("DualPipeV twin" in w for w in exp.warnings)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_each_ranks_order_is_its_twins(pp: int) -> None:
    """DualPipe's rank r (the repository's order: tests/traces/test_dualpipe.py) runs, chunk
    for chunk, DualPipeV's rank h = min(r, pp - 1 - r) of pp/2 ranks and m/2 micro-batches:
    its stage for phase c where the twin runs chunk c (c ^ the rank's half = its direction)."""
    m = 2 * pp + 4
    twin = dualpipev_order(pp // 2, m // 2)
    for r, steps in dualpipe_order(pp, m).items():
        h, second = min(r, pp - 1 - r), r >= pp // 2
        chunk = {r: 0 ^ second, 2 * pp - 1 - r: 1 ^ second}
        assert [(chunk[s], k, i % (m // 2)) for s, k, i in steps] == [
            (int(s != h), k, i) for s, k, i in twin[h]]


def test_each_rank_holds_two_copies_stages_parameters() -> None:
    """The twin's rank h holds what 1F1B's ranks h and pp - 1 - h hold together: stage h of
    one copy, stage pp - 1 - h of the other (the README's 2x parameters). Untied embeddings
    (DeepSeek-V3's): tied ones would be one matrix in the twin's V, two in DualPipe."""
    exp = experiment_from_dict(_config())
    one = experiment_from_dict(_config(schedule="1f1b"))
    dual = memory_by_pp_rank(exp.model, exp.layout, layout_schedule(exp.layout))
    single = memory_by_pp_rank(one.model, one.layout, layout_schedule(one.layout))
    pp = one.layout.pp
    assert [m.params_bytes for m in dual] == [
        single[h].params_bytes + single[pp - 1 - h].params_bytes for h in range(pp // 2)]


def test_dualpipe_simulates_as_its_twin() -> None:
    exp = experiment_from_dict(_config())
    twin = experiment_from_dict(_config(pp=2, dp=4, vp=2, schedule="dualpipev"))
    assert predict(exp)[0].step_time_s == predict(twin)[0].step_time_s


def test_the_executor_refuses_dualpipe_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from executor.run import run

    with pytest.raises(ConfigError, match=r"^parallel.schedule: \"dualpipe\" is not run by "):
        run(experiment_from_dict(_config()), tmp_path / "out")


def test_the_command_line_warns_and_simulates(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    config = tmp_path / "dualpipe.toml"
    config.write_text("".join(f"[{table}]\n" + "".join(f"{k} = {_toml(v)}\n"
                                                       for k, v in CONFIG[table].items())
                              for table in ("model", "parallel", "cluster")))
    done = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--json"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0 and "\"schedule\": \"dualpipev\"" in done.stdout
    written = json.loads(done.stdout)["layout_as_written"]
    assert (written["schedule"], written["pp"], written["dp"]) == ("dualpipe", 4, 2)
    assert "simulated as its DualPipeV twin" in done.stderr


def _toml(value: object) -> str:
    return f"\"{value}\"" if isinstance(value, str) else str(value).lower() \
        if isinstance(value, bool) else str(value)


def test_the_shipped_deepseek_example_is_dualpipe_on_2048_h800() -> None:
    """sim/examples/deepseek-v3-2048-h800.toml: the report's PP16 DualPipe, EP64, DP128 on
    256 nodes of 8 H800, loaded as its twin with the twin's note only; its pairs' all-to-all
    holds DeepSeek's 20 SMs."""
    from sim.config import load_experiment
    from traces.moe_overlap import comm_sms

    exp = load_experiment(Path(__file__).parents[2] / "sim" / "examples"
                          / "deepseek-v3-2048-h800.toml")
    assert exp.twin_of is not None
    assert (exp.twin_of.pp, exp.twin_of.dp, exp.twin_of.ep, exp.cluster.num_devices) == (
        16, 128, 64, 2048)
    assert (exp.layout.pp, exp.layout.dp, exp.layout.vp) == (8, 256, 2)
    assert len(exp.warnings) == 1 and comm_sms(exp.layout) == 20
