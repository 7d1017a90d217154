"""`parasim run` from the command line: the shipped CPU example for real, and its refusals."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import replace

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.recorder import load_run
from sim.cli import main
from sim.config import example_path, load_experiment
from sim.provenance import file_sha256
from traces.io import load
from traces.kineto import load_kineto


def test_the_shipped_cpu_example_runs_and_writes_traces_perfetto_opens(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", str(example_path("gpt-tiny-localhost.toml")), "--out", str(out),
                 "--json", "--timeout", "30"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["world"] == 4 and summary["backend"] == "gloo"
    assert len(summary["losses"]) == 1 and summary["step_time_s"] > 0
    assert summary["parasim"]["config_sha256"] == file_sha256(
        example_path("gpt-tiny-localhost.toml"))
    for rank in range(4):
        trace = load(out / f"rank{rank}.json")
        assert trace.timed and trace.meta.complete is True
    chrome = json.loads((out / "chrome.json").read_text())
    assert {event["ph"] for event in chrome["traceEvents"]} >= {"X", "M"}
    # the traces carry the cluster they ran on: a replay without --cluster rebuilds it
    exp = load_experiment(example_path("gpt-tiny-localhost.toml"))
    # and the host cores its CPU ranks shared (`parasim whatif` times a target's sharing)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert exp.cluster.table is not None and exp.cluster.cores == 0
    assert trace.meta.cluster_spec == replace(exp.cluster.table, overrides=tuple(sorted(
        (*exp.cluster.table.overrides, ("cores", cores)))))
    assert main(["replay", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"] == exp.cluster.name


@pytest.mark.parametrize(("flags", "message"), [
    (["--steps", "0"], "--steps: 0 must be from 1 to 1000"),
    (["--timeout", "0"], "--timeout: 0 must be from 1 s to 24 h"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, message):
    assert main(["run", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"parasim: error: {message}\n"


def test_out_may_not_be_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["run", "--out", str(target)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_a_world_larger_than_the_host_is_one_line(tmp_path, capsys):
    config = tmp_path / "big.toml"
    config.write_text("[model]\nlayers = 2\nhidden = 64\nheads = 4\nseq_len = 16\nvocab = 64\n"
                      "[parallel]\ndp = 16\nglobal_batch = 16\n"
                      "[cluster]\npreset = \"dgx-a100\"\nnodes = 2\n")
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "16" in err


def _config(tmp_path, parallel: str, model: str = "", ranks: int = 2) -> str:
    path = tmp_path / "job.toml"
    path.write_text("[model]\nlayers = 2\nhidden = 32\nheads = 4\nseq_len = 16\nvocab = 64\n"
                    f"dtype = \"fp32\"\n{model}[parallel]\n{parallel}"
                    f"[cluster]\npreset = \"localhost\"\ngpus_per_node = {ranks}\n")
    return str(path)


def test_a_plan_the_executor_refuses_is_one_line_and_writes_nothing(tmp_path, capsys):
    config = _config(tmp_path, "pp = 2\ndp = 2\nzero = 1\nglobal_batch = 4\n",
                     "tied_embeddings = true\n", ranks=4)
    out = tmp_path / "o"
    assert main(["run", config, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parasim: error: parallel.zero: tied embeddings with pp > 1")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_failing_rank_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    import executor.run
    from traces.plan import build

    config = _config(tmp_path, "dp = 2\nglobal_batch = 4\n")
    exp = load_experiment(config)
    fail_at = len(build(exp.model, exp.layout).ops[1]) // 2
    monkeypatch.setattr(executor.run, "run", functools.partial(executor.run.run,
                                                                 fault=(1, fail_at)))
    out = tmp_path / "o"
    code = main(["run", config, "--out", str(out), "--warmup", "0", "--timeout", "15"])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"parasim: error: rank 1 failed in op {fail_at} (")
    assert "ValueError: injected fault" in err and "marked incomplete" in err
    assert load(out / "rank1.json").meta.complete is False


def test_kernels_writes_profiler_traces_that_kineto_reads(tmp_path, capfd):
    config = _config(tmp_path, "dp = 2\nglobal_batch = 4\nbucket_bytes = 20000\n")
    out = tmp_path / "o"
    code = main(["run", config, "--out", str(out), "--kernels", "--json", "--timeout", "30"])
    stdout, stderr = capfd.readouterr()
    assert code == 0, stderr
    assert stderr == ""  # not kineto's "USDT: ... profiler_start" lines (issue 22, item 14)
    files = json.loads(stdout)["files"]
    plan = load(out / "rank0.json")
    planned = [op for op in plan.ops[0] if op.kind.is_collective]
    for rank in range(2):
        path = out / f"kernels-rank{rank}.json"
        assert str(path) in files
        trace = load_kineto(path)
        assert trace.ranks == [rank] and trace.meta.backend == "gloo"
        ops = trace.ops[rank]
        assert any(op.kind == "compute" for op in ops)
        # the step's gradient all-reduces, as the plan has them (the barrier before the
        # step is an all_reduce named "barrier")
        found = [op for op in ops if op.kind.is_collective and op.name != "barrier"]
        assert [(op.kind, op.size_bytes) for op in found] == \
            [(op.kind, op.size_bytes) for op in planned]
        assert all(op.group == (0, 1) for op in found)
    assert load_run(out).ranks == [0, 1]  # the parasim traces still load beside them


@pytest.mark.parametrize("dtype, executor_rule", [
    ("fp8", "needs FP8 tensor cores"),
    ("fp4", "needs FP4 tensor cores \\(Blackwell\\)"),  # the executor runs no FP4
])
def test_low_precision_on_cpu_is_one_line_and_writes_nothing(tmp_path, capsys, dtype,
                                                             executor_rule):
    """At the config (the localhost 'accelerator' has no FP8 or FP4) and in the executor."""
    from executor.options import check_supported
    from traces.errors import ConfigError
    from traces.layout import Layout
    from traces.model import ModelSpec

    config = tmp_path / f"{dtype}.toml"
    config.write_text(example_path("gpt-tiny-localhost.toml").read_text()
                      .replace('dtype = "fp32"', f'dtype = "{dtype}"'))
    out = tmp_path / "run"
    code = main(["run", str(config), "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert (code, stdout) == (2, "") and stderr.count("\n") == 1, stderr
    assert f"model.dtype: \"{dtype}\" needs {dtype.upper()} tensor cores, which CPU-localhost" \
        in stderr
    assert not out.exists()
    import torch
    if torch.cuda.is_available():  # the GPU's refusal names the missing kernels instead
        return
    model = ModelSpec(layers=2, hidden=32, heads=4, seq_len=16, vocab=64, dtype=dtype)
    with pytest.raises(ConfigError, match=f"model.dtype: \"{dtype}\" {executor_rule}") as e:
        check_supported(model, Layout(global_batch=1))
    assert "\n" not in str(e.value)
