"""`parasim simulate`: the summary, --json, output files, and one-line errors (exit 2)."""

import json
import re
import subprocess
import sys

import pytest

from sim.cli import main
from sim.report import read_payload
from tests.sim.report.report_cases import typed
from traces.chrome import to_chrome
from traces.io import load
from traces.model import ModelSpec
from traces.step_flops import megatron_step_flops

SMALL = """
[model]
layers = 4
hidden = 256
heads = 16
seq_len = 128
vocab = 1024

[parallel]
tp = 2
pp = 2
dp = 4
global_batch = 16
recompute = "full"

[cluster]
preset = "dgx-h100"
nodes = 2
fabric = "rail"
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_promised_fields_and_they_agree(capsys, small):
    code, out, err = run_cli(capsys, "simulate", small, "--json")
    assert code == 0 and err == ""
    r = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                "mfu", "bubble_fraction", "exposed_comm_s", "compute_s", "peak_memory_bytes",
                "memory_by_pp_rank", "fits"):
        assert key in r
    model = ModelSpec(layers=4, hidden=256, heads=16, seq_len=128, vocab=1024)
    step, world = r["step_time_s"], 16
    assert r["tokens_per_s"] == pytest.approx(16 * 128 / step)
    assert r["model_tflops_per_gpu"] == pytest.approx(
        megatron_step_flops(model, 16, False) / world / step / 1e12)
    # flash's causal half: the core's 4 full squares (fwd, bwd 2, recompute) run as 2.25
    skipped = (4 - 2.25) * 16 * model.layers * model.attn_core_flops(1)
    assert r["hardware_tflops_per_gpu"] == pytest.approx(
        (megatron_step_flops(model, 16, True) - skipped) / world / step / 1e12)
    assert r["mfu"] == pytest.approx(r["model_tflops_per_gpu"] * 1e12 / 989.4e12)
    assert 0 < r["bubble_fraction"] < 1 and r["fits"] is True
    assert len(r["memory_by_pp_rank"]) == 2
    assert r["peak_memory_bytes"] == max(m["total_bytes"] for m in r["memory_by_pp_rank"])
    for rank in r["ranks"]:  # the step splits into compute, exposed communication and idle
        assert rank["compute_s"] + rank["exposed_comm_s"] + rank["idle_s"] == pytest.approx(step)


def test_two_runs_print_byte_identical_json(small):
    outs = [subprocess.run([sys.executable, "-m", "sim", "simulate", str(small), "--json"],
                           capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert outs[0] == outs[1]


def test_output_files(capsys, small, tmp_path):
    trace, chrome, report = tmp_path / "t.json", tmp_path / "c.json", tmp_path / "r.html"
    code, out, _ = run_cli(capsys, "simulate", small, "--trace", trace, "--chrome", chrome,
                           "--report", report)
    assert code == 0 and "step time" in out
    timed = load(trace)
    assert timed.timed and timed.meta.folded and timed.ranks == [0, 8]
    events = json.loads(chrome.read_text())["traceEvents"]
    assert len([e for e in events if e["ph"] == "X"]) == timed.num_ops()
    assert to_chrome(timed)["traceEvents"] == events
    check_report(report.read_text(), json.loads(run_cli(capsys, "simulate", small, "--json")[1]))


def check_report(page: str, r: dict) -> None:
    """The page is whole, has a div for each figure it carries, and draws the step --json
    states: the time axes end at its step time, the breakdown's bars are its ranks' times,
    and the memory bars add up to its per-stage peaks."""
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<h1>parasim: small</h1>" in page and f"{r['step_time_s']:.4g} s" in page
    figures = read_payload(page)["figures"]
    divs = re.findall(r"<div id='([\w-]+)' class='figure'", page)
    assert sorted(divs) == sorted(figures) and len(divs) == 6
    assert all(figure["data"] for figure in figures.values())
    for div in ("parasim-pipeline", "parasim-lanes", "parasim-memory-time"):
        assert figures[div]["layout"]["xaxis"]["range"] == [0, r["step_time_s"]]
    bars = {t["name"]: typed(t["y"]) for t in figures["parasim-breakdown"]["data"]}
    for key, name in (("compute_s", "compute"), ("exposed_comm_s", "exposed communication"),
                      ("idle_s", "idle (bubble)")):
        assert bars[name] == pytest.approx([rank[key] for rank in r["ranks"]], rel=1e-12)
    memory = sum(typed(t["y"]) for t in figures["parasim-memory"]["data"])
    unit = figures["parasim-memory"]["layout"]["yaxis"]["title"]["text"]  # the bars' unit
    assert memory * {"GiB": 2**30, "MiB": 2**20}[unit] == pytest.approx(
        [m["total_bytes"] for m in r["memory_by_pp_rank"]], rel=1e-6)


def test_unfolded_and_folded_agree(capsys, small):
    folded = json.loads(run_cli(capsys, "simulate", small, "--json")[1])
    full = json.loads(run_cli(capsys, "simulate", small, "--json", "--no-fold")[1])
    assert full["step_time_s"] == folded["step_time_s"]
    assert len(full["ranks"]) == 16 and len(folded["ranks"]) == 2


def bad(tmp_path, old, new):
    assert old in SMALL
    path = tmp_path / "bad.toml"
    path.write_text(SMALL.replace(old, new))
    return path


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("vocab = 1024", "vocab = 1024\ncolour = 3", "model.colour: unknown key"),
    ("[model]", "[model\n", "not valid TOML"),
    ("[cluster]", "[clusters]", "[clusters]: unknown table"),
    ("dp = 4", "dp = 2", "= 8 ranks, but the cluster has 16 GPUs"),
    ("heads = 16", "heads = 16\n", None),  # a valid change: no error
    ("tp = 2\npp = 2\ndp = 4", "tp = 16\npp = 1\ndp = 1", "tp: 16 is larger than a node"),
    ("heads = 16", "heads = 1", "parallel.tp: 2 does not divide model.heads = 1"),
    ("layers = 4", "layers = 3", "model.layers: 3 is not divisible by pp x vp"),
    ("global_batch = 16", "global_batch = 4\nvp = 2\nschedule = \"interleaved\"",
     "1 micro-batches are fewer than pp = 2"),
    ("recompute = \"full\"", "recompute = \"most\"", "parallel.recompute: 'most' is not one of"),
    ("tp = 2", "tp = 2\nsp = \"yes\"", "parallel.sp: 'yes' must be true or false"),
    ("nodes = 2", "nodes = 2\nnic_bandwidth = \"fast\"", "cluster.nic_bandwidth: 'fast'"),
    ("fabric = \"rail\"", "fabric = \"rail\"\n\n[sim]\nnetwork = \"magic\"",
     "sim.network: 'magic' is not one of"),
    ("fabric = \"rail\"", "fabric = \"rail\"\n\n[sim]\nspeed = 1", "sim.speed: unknown key"),
    ("vocab = 1024", "vocab = 1024\nattention = \"fast\"", "model.attention: 'fast' is not one of"),
    ("vocab = 1024", "vocab = 1024\nattention = [\"flash\"]", "model.attention:"),
    ("tp = 2", "tp = 2\nflash_attention = true", "moved to [model] attention"),
    ("tp = 2", "tp = 2\noverlap_grad_reduce = 1", "parallel.overlap_grad_reduce: 1 must be true"),
    ("tp = 2", "tp = 2\nfp32_main_grads = \"no\"", "parallel.fp32_main_grads: 'no' must be true"),
    ("vocab = 1024", "vocab = 1024\nattention = \"unfused\"", None),
    ("tp = 2", "tp = 2\ntp_comm_overlap = true",
     "parallel.tp_comm_overlap: true at tp = 2 needs sp = true"),
    ("tp = 2", "tp = 2\ntp_comm_overlap = \"yes\"",
     "parallel.tp_comm_overlap: 'yes' must be true"),
    ("tp = 2", "tp = 2\noverlap_param_gather = 0",
     "parallel.overlap_param_gather: 0 must be true"),
    ("tp = 2", "tp = 2\nsp = true\ntp_comm_overlap = true\noverlap_param_gather = true", None),
])
def test_bad_configs_give_one_line_and_exit_2(capsys, tmp_path, old, new, needle):
    code, out, err = run_cli(capsys, "simulate", bad(tmp_path, old, new), "--json")
    if needle is None:
        assert code == 0
        return
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize(("flags", "needle"), [
    (["--report", "/no/such/dir/r.html"], "directory /no/such/dir does not exist"),
    (["--profile", "/no/such/profile.json"], "--profile: /no/such/profile.json: cannot read: No "),
    (["--network", "magic"], "invalid choice: 'magic'"),
    (["--algo", "magic"], "sim.algo: 'magic' is not one of auto, ring"),
])
def test_bad_flags_give_one_line_and_exit_2(capsys, small, flags, needle):
    code, out, err = run_cli(capsys, "simulate", small, *flags)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "simulate", tmp_path / "nope.toml")
    assert code == 2 and "cannot read" in err


def test_trace_never_overwrites_the_configs_own_profile(capsys, tmp_path):
    """[sim] profile is an input of the run, as --profile is: naming it as an output fails."""
    from sim.profile import default_profile
    from topology.presets import PRESETS

    profile = tmp_path / "p.json"
    default_profile(PRESETS["dgx-h100"].accelerator).save(profile)
    before = profile.read_bytes()
    config = tmp_path / "c.toml"
    config.write_text(SMALL + '\n[sim]\nprofile = "p.json"\n')
    code, out, err = run_cli(capsys, "simulate", config, "--trace", profile)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "p.json" in err and profile.read_bytes() == before


def test_the_local_host_is_counted_in_cpu_ranks_not_gpus(capsys):
    from sim.config import example_path

    code, out, _ = run_cli(capsys, "simulate", example_path("gpt-tiny-localhost.toml"))
    assert code == 0
    assert "(4 CPU ranks)" in out.splitlines()[0] and "GPU" not in out.splitlines()[0]


def test_report_ranks_without_a_report_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(SMALL)
    assert main(["simulate", str(config), "--report-ranks", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("parasim: error: --report-ranks: it chooses the ranks a report "
                                 "details; give --report HTML too\n")
