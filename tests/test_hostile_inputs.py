"""Issue 6's list of hostile inputs, one test each: a hostile new user tried ~370 inputs and 66
broke the rule "one line on stderr and exit 2, never a traceback, a hang, a blow-up or a silent
wrong answer" (Ctrl-C: one line and exit 130). The sections follow the issue's list.

Most cases run the command line in-process (`sim.cli.main`); the few that need a real process
(stdout on /dev/full or closed, a real SIGINT) run `python -m sim`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli import main
from tests.child import sigint_default
from traces.errors import ConfigError
from traces.files import check_output
from traces.header import check_fold_ranks
from traces.header_json import meta_from_json
from traces.io import load

SMALL = {
    "model": {"layers": "4", "hidden": "256", "heads": "16", "seq_len": "128", "vocab": "1024"},
    "parallel": {"tp": "2", "pp": "2", "dp": "4", "global_batch": "16"},
    "cluster": {"preset": '"dgx-h100"', "nodes": "2", "fabric": '"rail"'},
}
TPU = {
    "model": {"layers": "4", "hidden": "256", "heads": "16", "seq_len": "128", "vocab": "1024"},
    "parallel": {"tp": "4", "dp": "4", "global_batch": "16"},
    "cluster": {"preset": '"tpu-v4"', "dims": "[4, 4]"},
}
DIGITS_400 = "1" + "0" * 400
PROFILE = {"schema": "parasim.profile", "version": 2, "name": "p",
           "compute": {"gemm_efficiency": 0.7, "memory_efficiency": 0.8, "kernels": {}}}


def with_compute(**values: object) -> dict:
    return {**PROFILE, "compute": {**PROFILE["compute"], **values}}


def toml(base: dict[str, dict[str, str]], top: str = "", **edits: dict[str, str | None]) -> str:
    """`base` with keys replaced, added or (None) removed; values are TOML text."""
    lines = [top] if top else []
    for table in dict.fromkeys([*base, *edits]):
        keys = {**base.get(table, {}), **edits.get(table, {})}
        lines.append(f"[{table}]")
        lines += [f"{key} = {value}" for key, value in keys.items() if value is not None]
    return "\n".join(lines) + "\n"


def run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, needle: str, *argv: object) -> None:
    """The command fails with exit 2, nothing on stdout, one line on stderr holding `needle`."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert err.startswith("parasim: error: ") and err.count("\n") == 1, err
    assert needle in err, err


def python_m_sim(*argv: object, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *map(str, argv)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


# --- Hang, no output -------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "needle"), [
    ("inf", "cluster.nvlink_latency: inf is not a finite number"),
    ('"1e400s"', "cluster.nvlink_latency: '1e400s' is not a finite number"),
])
def test_infinite_nvlink_latency_is_refused_not_a_hang(capsys, write, value, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL, cluster={"nvlink_latency": value})))


# --- Memory blow-up before the one-line check ------------------------------------------------

@pytest.mark.parametrize(("edits", "needle"), [
    ({"cluster": {"nodes": "1000000"}}, "cluster.nodes: 1000000 must be an integer from 1 to"),
    ({"cluster": {"nodes": "1" + "0" * 30}}, "cluster.nodes: 1000000000...00000000000 must be"),
    ({"cluster": {"gpus_per_node": "10000000"}}, "cluster.gpus_per_node: 10000000 must be"),
    ({"model": {"layers": "1000000"}}, "model.layers: 1000000 is larger than 65,536"),
    ({"parallel": {"global_batch": "1000000"}}, "= 250,000 micro-batches per step, more than"),
])
def test_sizes_are_checked_before_anything_big_is_built(capsys, write, edits, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL, **edits)))


def test_torus_of_a_million_chips_is_refused_at_once(capsys, write):
    refused(capsys, "cluster.dims: a 100x100x100 torus holds 1,000,000 chips, more than the "
            "131,072", "simulate", write(toml(TPU, cluster={"dims": "[100, 100, 100]"})))


def test_gpu_count_is_checked_against_the_layout_before_the_graph(capsys, write, monkeypatch):
    # 4,000 nodes is a legal cluster, but 16 ranks cannot fill it: no graph may be built.
    def no_build(self):
        raise AssertionError("the cluster graph was built before the size check")

    monkeypatch.setattr("topology.config.ClusterSpec.build", no_build)
    refused(capsys, "= 16 ranks, but the cluster has 32000 GPUs", "simulate",
            write(toml(SMALL, cluster={"nodes": "4000"})))


@pytest.mark.parametrize(("argv", "needle"), [
    (["--nodes", "200000"], "cluster.nodes: 200000 must be an integer from 1 to 131,072"),
    (["--nodes", "20000"], "cluster.nodes: 20,000 nodes x 8 accelerators = 160,000, more than"),
    (["--channels", str(10**6)], "--channels: 1000000 must be from 1 to 64"),
])
def test_collective_sizes_are_bounded(capsys, argv, needle):
    refused(capsys, needle, "collective", *argv)


# --- Endless reads -----------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_config_or_profile_is_refused_before_reading(capsys, write, device):
    refused(capsys, f"{device}: not a regular file", "simulate", device)
    refused(capsys, f"--profile: {device}: not a regular file", "simulate",
            write(toml(SMALL)), "--profile", device)


def test_a_device_behind_a_toml_name_as_cluster_file_is_refused(capsys, tmp_path):
    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    refused(capsys, "--cluster: ", "collective", "--cluster", link)
    refused(capsys, "not a regular file", "collective", "--cluster", link)


def test_a_fifo_as_config_does_not_wait_for_a_writer(capsys, tmp_path):
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    refused(capsys, "c.toml: not a regular file", "simulate", fifo)


def test_a_config_larger_than_a_mebibyte_is_refused(capsys, write):
    refused(capsys, "larger than 1,048,576 bytes", "simulate",
            write(toml(SMALL) + "# " + "x" * 2**20 + "\n"))


# --- Tracebacks --------------------------------------------------------------------------------

@pytest.mark.parametrize(("top", "edits", "needle"), [
    ("sim = 5", {}, "sim: 5 must be a table of keys"),
    ("sim = [1]", {}, "sim: [1] must be a table of keys"),
    ("", {"model": {"dtype": '["bf16"]'}}, "model.dtype: ['bf16'] is not one of bf16, fp16"),
    ("", {"cluster": {"preset": '["dgx-h100"]'}}, "cluster.preset: ['dgx-h100'] is not a preset"),
    ("", {"sim": {"algo": '["ring"]'}}, "sim.algo: ['ring'] is not one of auto, ring"),
    ("", {"sim": {"profile": "5"}}, "sim.profile: 5 must be a string"),
    ("", {"sim": {"profile": "true"}}, "sim.profile: True must be a string"),
    ("", {"sim": {"profile": '""'}}, "sim.profile: an empty path names no file"),
    ("", {"parallel": {"bucket_bytes": DIGITS_400}},
     "parallel.bucket_bytes: 1000000000...00000000000 is too large"),
    ("", {"cluster": {"gpu_memory": DIGITS_400}},
     "cluster.gpu_memory: 1000000000...00000000000 is too large"),
    ("", {"model": {"hidden": DIGITS_400}},
     "model.hidden: 1000000000...00000000000 is larger than 1,048,576"),
])
def test_bad_types_and_huge_numbers_are_one_line(capsys, write, top, edits, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL, top=top, **edits)))


def test_400_digit_sizes_flag(capsys):
    refused(capsys, "--sizes: '1000000000000", "collective", "--sizes", DIGITS_400)


DEEP_TOML = "x = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n"
DEEP_KEY = ".".join(["a"] * 100_000) + " = 1\n"  # a dotted key: tomllib's time grows as depth^3
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("text", "needle"), [
    (DEEP_TOML, "not valid TOML: nested too deeply"),
    (DEEP_KEY, ": keys nested more than 16 deep"),
])
def test_a_table_nested_100000_deep_in_a_config_or_cluster_file(capsys, write, text, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL) + text))
    refused(capsys, needle, "collective", "--cluster", write("[cluster]\n" + text, "k.toml"))


def test_a_profile_nested_100000_deep(capsys, write):
    refused(capsys, "not a JSON file: nested too deeply", "simulate", write(toml(SMALL)),
            "--profile", write(DEEP_JSON, "p.json"))


def test_files_that_are_not_utf8(capsys, write):
    latin1 = "[cluster]\npreset = \"dgx-h100\" # caf\xe9\n".encode("latin-1")
    refused(capsys, "not valid TOML: not UTF-8 text (invalid continuation byte", "collective",
            "--cluster", write(latin1, "k.toml"))
    refused(capsys, "--profile: ", "simulate", write(toml(SMALL)), "--profile",
            write(b"\xff\xfe{}", "p.json"))
    refused(capsys, "not a JSON file: not UTF-8 text", "simulate", write(toml(SMALL)),
            "--profile", write(b"\xff\xfe{}", "p.json"))


@pytest.mark.parametrize(("ops", "needle"), [
    ([], "profile.compute.kernels: [] must be a table of keys"),
    ("attn", "profile.compute.kernels: 'attn' must be a table of keys"),
])
def test_profile_ops_not_a_table(capsys, write, ops, needle):
    profile = write(json.dumps(with_compute(kernels=ops)), "p.json")
    refused(capsys, needle, "simulate", write(toml(SMALL)), "--profile", profile)


def test_stdout_on_a_full_disk_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        proc = python_m_sim("collective", "--sizes", "1M", "--model", "analytic", stdout=full)
    assert proc.returncode == 2
    assert proc.stderr == "parasim: error: cannot write to stdout: No space left on device\n"


def test_a_number_of_5000_digits_is_named_as_such_not_as_a_python_limit(capsys, write):
    digits = "1" * 5000  # past Python's 4,300-digit limit on int(): the parser fails inside
    config = write(toml(SMALL, parallel={"bucket_bytes": digits}))
    code, out, err = run(capsys, "simulate", config)
    assert (code, out) == (2, "")
    assert err == f"parasim: error: {config}: not valid TOML: a number of more than 4,300 digits\n"
    trace = write('{"schema": "parasim.trace", "version": 2, "ranks": {"0": [{"kind": "compute", '
                  f'"stream": "c", "flops": {digits}}}]}}}}', "t.json")
    code, out, err = run(capsys, "replay", trace)
    assert (code, out) == (2, "")
    assert err == f"parasim: error: {trace}: not a JSON file: a number of more than 4,300 digits\n"


# --- Silently wrong ----------------------------------------------------------------------------

@pytest.mark.parametrize(("base", "edits", "needle"), [
    (SMALL, {"cluster": {"switch_latency": '"1e400s"'}},
     "cluster.switch_latency: '1e400s' is not a finite number"),
    (TPU, {"cluster": {"link_latency": "inf"}}, "cluster.link_latency: inf is not a finite"),
    (SMALL, {"cluster": {"nic_bandwidth": "inf"}}, "cluster.nic_bandwidth: inf is not a finite"),
    (SMALL, {"cluster": {"nic_bandwidth": '"1e400GB/s"'}}, "'1e400GB/s' is not a finite number"),
    (SMALL, {"cluster": {"nvlink_bandwidth": "1e-300"}},
     "cluster.nvlink_bandwidth: 1e-300 must be from 1 MB/s to 100 TB/s"),
    (SMALL, {"cluster": {"gpu_peak_tflops": "inf"}}, "cluster.gpu_peak_tflops: inf must be at "
                                                     "least 0.001 TFLOP/s and at most 100000"),
    (SMALL, {"cluster": {"gpu_peak_tflops": "1e-300"}}, "cluster.gpu_peak_tflops: 1e-300 must"),
    (SMALL, {"parallel": {"zero": "1.0"}}, "parallel.zero: 1.0 must be 0, 1, 2 or 3"),
    (SMALL, {"cluster": {"fabric": '"fat-tree"', "tiers": "2.0"}},
     "cluster.tiers: 2.0 is not one of 2, 3"),
    (SMALL, {"cluster": {"gpu_power": '"150W"'}}, "cluster.gpu_power: '150W' is outside "
     "H100-SXM5-80GB's measured range (200 W to 700 W, its TDP 700 W): its sustained clock is "
     "not extrapolated"),
    (SMALL, {"cluster": {"gpu_power": "inf"}}, "cluster.gpu_power: inf is not a finite number"),
    (SMALL, {"cluster": {"gpu_power": "nan"}}, "cluster.gpu_power: nan is not a finite number"),
    (SMALL, {"cluster": {"gpu_power": '"-5W"'}}, "cluster.gpu_power: '-5W' is not a power"),
    (SMALL, {"cluster": {"gpu_power": '"700 watts"'}}, "'700 watts' is not a power (write e.g."),
    (SMALL, {"cluster": {"gpu_power": '"1e9kW"'}}, "'1e9kW' is more than the 10000 W any"),
    (TPU, {"cluster": {"gpu_power": '"200W"'}}, "cluster.gpu_power: TPU-v4 has no published"),
    (SMALL, {"model": {"kernels": '"jit"'}},
     "model.kernels: 'jit' is not one of fused, compiled, eager"),
    (SMALL, {"model": {"kernels": "1"}}, "model.kernels: 1 is not one of fused, compiled, eager"),
])
def test_values_that_gave_silent_wrong_answers(capsys, write, base, edits, needle):
    refused(capsys, needle, "simulate", write(toml(base, **edits)))


@pytest.mark.parametrize(("compute", "needle"), [
    ({"launch_overhead_s": "Infinity"},
     "profile.compute.launch_overhead_s: inf must be at least 0 s and at most 1 s"),
    ({"launch_overhead_s": 1e308}, "profile.compute.launch_overhead_s: 1e+308 must be at least"),
    ({"gemm_efficiency": True}, "profile.compute.gemm_efficiency: True must be an efficiency"),
    ({"compute_interference_delay_s": -1e-3},
     "profile.compute.compute_interference_delay_s: -0.001 must be at least 0 s"),
    ({"compute_interference_delay_s": "NaN"},
     "profile.compute.compute_interference_delay_s: nan must be at least 0 s"),
    ({"kernels": {"fc1": {"overhead_s": "Infinity"}}},
     "profile.compute.kernels.fc1.overhead_s: inf must be at least 0 s"),
])
def test_profile_values_that_gave_nan_or_were_taken_as_numbers(capsys, write, compute, needle):
    text = json.dumps(with_compute(**compute)).replace('"Infinity"', "Infinity").replace(
        '"NaN"', "NaN")
    refused(capsys, needle, "simulate", write(toml(SMALL)), "--profile", write(text, "p.json"))


def test_sizes_beyond_a_tebibyte(capsys):
    refused(capsys, "--sizes: '99999999999999999999T' is too large", "collective",
            "--sizes", "99999999999999999999T")


# --- Left behind -------------------------------------------------------------------------------

def test_a_failing_later_output_removes_the_earlier_ones(capsys, write, tmp_path, monkeypatch):
    config = write(toml(SMALL))
    calls = []

    def disk_full_on_second(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("traces.files.os.fsync", disk_full_on_second)
    refused(capsys, "c.json: cannot write: No space left on device", "simulate", config,
            "--trace", tmp_path / "t.json", "--chrome", tmp_path / "c.json")
    assert sorted(os.listdir(tmp_path)) == ["c.toml"]  # no trace, no temporary


def test_ctrl_c_while_writing_leaves_nothing_and_prints_one_line(write, tmp_path):
    config = write(toml(SMALL))
    old = tmp_path / "old.json"
    old.write_text("from an earlier run")
    script = (
        "import os, signal, sys\n"
        "import sim.cli as cli, sim.commands.common as common\n"
        "real = common.dumps_chrome\n"
        "def interrupted(*args):\n"  # Ctrl-C arrives after the trace was written
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(*args)\n"
        "common.dumps_chrome = interrupted\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, "simulate", str(config), "--trace",
                           str(tmp_path / "t.json"), "--chrome", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=sigint_default)
    assert proc.returncode == 128 + signal.SIGINT == 130
    assert proc.stderr == "parasim: error: interrupted\n" and proc.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["c.toml", "old.json"]


# --- Quietly odd -------------------------------------------------------------------------------

@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--trace", "", "--trace: an empty path names no file"),
    ("--trace", "newdir/", "--trace: 'newdir/' ends with '/', so it names a directory"),
    ("--chrome", "/dev/null", "--chrome: /dev/null is not a regular file"),
    ("--report", ".", "--report: . is a directory"),
    ("--trace", "/no/such/dir/t.json", "--trace: directory /no/such/dir does not exist"),
    ("--profile", "", "--profile: an empty path names no file"),
    ("--algo", "", "sim.algo: '' is not one of auto"),
])
def test_odd_output_flags_are_errors(capsys, write, flag, value, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL)), flag, value)


def test_an_output_in_a_missing_directory_or_with_a_long_name_is_one_plain_line(capsys, write,
                                                                              tmp_path):
    # The whole line: check_output once wrapped its own error ("--trace: P: --trace: ...").
    long_name = tmp_path / ("x" * 300 + ".json")
    for path, line in [
        ("/no/such/dir/t.json", "--trace: directory /no/such/dir does not exist"),
        (long_name, f"--trace: file name {'x' * 40!r}... is longer than the 255 bytes this "
                    "file system allows"),
    ]:
        code, out, err = run(capsys, "simulate", write(toml(SMALL)), "--trace", path)
        assert (code, out, err) == (2, "", f"parasim: error: {line}\n")
        with pytest.raises(ConfigError) as caught:
            check_output(str(path), "--trace")
        assert str(caught.value) == line
    with pytest.raises(ConfigError) as caught:
        check_output("a\0b", "--trace")
    assert str(caught.value) == "--trace: a\x00b: embedded null byte"


def test_an_output_may_not_overwrite_the_config(capsys, write):
    config = write(toml(SMALL))
    refused(capsys, "is an input of this run", "simulate", config, "--trace", config)
    assert config.read_text() == toml(SMALL)


def test_two_outputs_may_not_name_one_file(capsys, write, tmp_path):
    refused(capsys, "--chrome: ", "simulate", write(toml(SMALL)), "--trace",
            tmp_path / "t.json", "--chrome", tmp_path / "t.json")


def test_empty_algo_is_an_error_in_collective_too(capsys):
    refused(capsys, "--algo: '' is not an algorithm", "collective", "--algo", "")


def test_dims_on_a_dgx_preset_is_an_error(capsys, write):
    refused(capsys, "cluster.dims: applies to a torus preset only, not to preset 'dgx-h100'",
            "simulate", write(toml(SMALL, cluster={"dims": "[4, 4]"})))


def test_unknown_op_names_in_a_profile_are_errors(capsys, write):
    profile = write(json.dumps(with_compute(kernels={"atn": {"flops_efficiency": 0.5}})),
                    "p.json")
    refused(capsys, "profile.compute.kernels.atn: unknown key (known: embed, pos_embed",
            "simulate",
            write(toml(SMALL)), "--profile", profile)


def test_a_250_character_output_name_works(capsys, write, tmp_path):
    name = tmp_path / ("t" * 245 + ".json")
    code, _, err = run(capsys, "simulate", write(toml(SMALL)), "--trace", name)
    assert code == 0, err
    assert json.loads(name.read_text())["schema"] == "parasim.trace"
    assert sorted(os.listdir(tmp_path)) == sorted(["c.toml", name.name])


def test_stdout_closed_is_an_error_not_a_silent_success():
    proc = subprocess.run(f'"{sys.executable}" -m sim collective --sizes 1M >&-', shell=True,
                          capture_output=False, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "parasim: error: stdout is closed; parasim prints its results there\n"


def test_no_progress_frames_in_a_log(write):
    proc = python_m_sim("simulate", write(toml(SMALL)), "--json")
    assert proc.returncode == 0 and proc.stderr == ""  # not a terminal: no bar, no \r frames


# --- Trace loader (the list's last item: tests/traces/test_io.py BAD_DOCUMENTS has each rule) ---

def test_a_foreign_fold_layout_is_one_config_error():
    def fold(**layout: object) -> dict:
        return {"fold": {"axes": ["tp", "dp"], "layout": layout}}

    def read_fold(raw: dict, ranks: list[int] | None = None):
        meta = meta_from_json(raw, 3)
        if ranks is not None:
            check_fold_ranks(meta.fold, ranks)
        return meta.fold

    with pytest.raises(ConfigError, match=r"^trace: meta\.fold\.layout\.tp: 'x' must be an "):
        read_fold(fold(tp="x"))
    with pytest.raises(ConfigError, match=r"^trace: meta\.fold\.layout\.zero: 1\.0 must be 0, "):
        read_fold(fold(zero=1.0))
    with pytest.raises(ConfigError, match=r"^trace: meta\.fold\.layout\.tensor: unknown key"):
        read_fold(fold(tensor=2))
    with pytest.raises(ConfigError, match=r"^trace: meta\.fold\.layout: tp 1 x cp 1 x pp 1 x "
                                          r"dp 4 = 4 ranks, but meta\.world is 16$"):
        read_fold({**fold(dp=4, global_batch=4), "world": 16})
    with pytest.raises(ConfigError, match=r"^trace: meta\.fold\.layout: folds onto ranks \[0, 4\] "
                                          r"\(one per pipeline stage\), but the trace holds ranks "
                                          r"\[0, 8\]$"):
        read_fold(fold(tp=2, dp=2, pp=2, global_batch=2), ranks=[8, 0])
    layout = read_fold(fold(tp=2, dp=4, pp=2, global_batch=16), ranks=[8, 0])
    assert layout is not None and layout.world == 16


def _edited_trace(capsys, write, tmp_path, edit) -> Path:
    """A folded trace of SMALL (ranks 0 and 8 of 16 on dgx-h100 x2), its meta edited."""
    trace = tmp_path / "t.json"
    code, _, err = run(capsys, "simulate", write(toml(SMALL)), "--trace", trace)
    assert code == 0, err
    data = json.loads(trace.read_text())
    edit(data["meta"], data["ranks"])
    trace.write_text(json.dumps(data))
    return trace


@pytest.mark.parametrize(("edit", "line"), [
    # the audit's case: a fold of 256 ranks on a 16-GPU cluster (a KeyError traceback before)
    (lambda meta, ranks: meta["fold"]["layout"].update(dp=64, global_batch=256),
     "trace: meta.fold.layout: tp 2 x cp 1 x pp 2 x dp 64 = 256 ranks, but meta.world is 16"),
    # a smaller fold was silently accepted (its representatives 0 and 4 are not the trace's)
    (lambda meta, ranks: (meta["fold"]["layout"].update(dp=2), meta.update(world=8)),
     "trace: meta.fold.layout: folds onto ranks [0, 4] (one per pipeline stage), but the trace "
     "holds ranks [0, 8]"),
    # consistent, but larger than the cluster: refused before the cluster's graph is built
    (lambda meta, ranks: (meta["fold"]["layout"].update(pp=1, dp=64, global_batch=256),
                          meta.update(world=128), ranks.pop("8")),
     "trace: its fold's world of 128 ranks does not fit dgx-h100 x2 rail (16 accelerators); "
     "give --nodes 16 or a larger --cluster"),
    (lambda meta, ranks: meta["fold"]["layout"].update(schedule="zigzag"),
     "trace: meta.fold.layout.schedule: 'zigzag' is not one of gpipe, 1f1b, interleaved"),
])
def test_a_fold_that_does_not_fit_the_trace_or_the_cluster_is_one_line(capsys, write, tmp_path,
                                                                      edit, line):
    refused(capsys, line, "replay", _edited_trace(capsys, write, tmp_path, edit))


def test_a_version_1_plan_marked_folded_is_read_with_its_layout(capsys, write, tmp_path):
    """Version 1 said `"folded": true` and was folded with its own `layout`. With one NIC per
    server the folded copies' pipeline messages share the representatives' NIC, so the fold
    shows in the step time: the old spelling replays exactly as `fold` does, and slower than
    the same two ranks read as a plan without a fold (what ignoring the layout would give)."""
    def old_spelling(meta: dict, ranks: dict) -> None:
        del meta["fold"]
        meta["folded"] = True

    path = _edited_trace(capsys, write, tmp_path, old_spelling)
    meta = load(path).meta
    assert meta.fold is not None and meta.fold == meta.layout  # read with its own layout
    assert (meta.fold.tp, meta.fold.pp, meta.fold.dp) == (2, 2, 4) and meta.world == 16
    code, out, err = run(capsys, "replay", path, "--json")
    assert code == 0, err
    assert json.loads(out)["num_ranks"] == 2

    def no_fold(meta: dict, ranks: dict) -> None:
        del meta["fold"]

    one_nic = write('[cluster]\npreset = "dgx-h100"\nnodes = 2\nnics_per_node = 1\n', "nic.toml")

    def step_s(edit) -> float:
        trace = _edited_trace(capsys, write, tmp_path, edit)
        code, out, err = run(capsys, "replay", trace, "--cluster", one_nic, "--json")
        assert code == 0, err
        return json.loads(out)["step_time_predicted_s"]

    folded = step_s(lambda meta, ranks: None)
    assert step_s(old_spelling) == folded
    assert step_s(no_fold) < folded * 0.99
    # Its layout is checked as `fold`'s is, under its own name.
    refused(capsys, "trace: meta.layout: tp 2 x cp 1 x pp 2 x dp 64 = 256 ranks, but meta.world "
            "is 16", "replay", _edited_trace(capsys, write, tmp_path, lambda meta, ranks: (
                old_spelling(meta, ranks), meta["layout"].update(dp=64, global_batch=256))))


# --- Issue 22: what a hostile user found, second round -----------------------------------------

def _kineto(*events: dict, **info: object) -> str:
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10}
    return json.dumps({"schemaVersion": 1, "traceEvents": [mm, *events],
                       "distributedInfo": {"rank": 0, "world_size": 2, **info}})


@pytest.mark.parametrize(("event", "info", "needle"), [
    ({"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": [1], "ts": 0, "dur": 1}, {},
     "traceEvents[1] ('x'): tid [1] is not an integer or a string"),
    ({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": -1}, {},
     "traceEvents[1] ('k'): dur -1 is negative"),
    ({"ph": {}, "name": "x"}, {}, "ph {} is not a string"),
    ({"ph": "M", "name": "x"}, {"world_size": 0}, "distributedInfo.world_size 0 is not a world"),
    ({"ph": "M", "name": "x"}, {"pg_config": [{"pg_name": "0", "ranks": [0, 3]}]},
     "group '0' names rank 3, outside the world of 2 ranks"),
])
def test_kineto_malformed_event_is_one_line_naming_it(capsys, write, event, info, needle):
    refused(capsys, needle, "replay", write(_kineto(event, **info), "rank0.json"))


def test_kineto_events_left_out_are_counted_in_a_warning_and_in_json(capsys, write):
    gather = {"ph": "X", "cat": "cpu_op", "name": "c10d::gather_", "pid": 1, "tid": 1, "ts": 20,
              "dur": 5}
    path = write(_kineto(gather, {**gather, "ts": 40}, {"ph": "B", "name": "b", "ts": 1}),
                 "rank0.json")
    code, out, err = run(capsys, "replay", path, "--cluster", "localhost", "--json")
    assert code == 0, err
    assert err == (f"parasim: warning: {path}: left out 3 events parasim cannot use: "
                   "2 collective parasim does not model: gather, 1 phase B\n")
    assert json.loads(out)["events_left_out"] == {
        "collective parasim does not model: gather": 2, "phase B": 1}


def test_kineto_trace_with_nothing_usable_is_an_error(capsys, write):
    text = json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "C", "name": "m", "ts": 0}],
                       "distributedInfo": {"rank": 0, "world_size": 1}})
    refused(capsys, "nothing parasim can use: no compute op and no collective (left out: 1 "
            "phase C)", "replay", write(text, "rank0.json"))


# --- A run's output folder: checked first, written whole (items 6, 7, 8, 14) -----------------

TINY_LOCAL = ("[model]\nlayers = 1\nhidden = 32\nheads = 4\nseq_len = 16\nvocab = 64\n"
              'dtype = "fp32"\n[parallel]\ndp = 2\nglobal_batch = 2\n'
              '[cluster]\npreset = "localhost"\ngpus_per_node = 2\n')
# Each command that writes a folder of a run: its argv before the folder flag, and the flag.
FOLDER_COMMANDS = [("run", "{config}", "--out"), ("validate", "{config}", "--keep"),
                   ("calibrate", "--run", "localhost", "--ranks", "2", "-o", "{tmp}/p.json",
                    "--keep")]


def _folder_argv(command: tuple[str, ...], config: Path, folder: object) -> list[str]:
    return [a.format(config=config, tmp=config.parent) for a in command] + [str(folder)]


def _no_stage_left(*folders: Path) -> None:
    for folder in folders:
        assert not [p for p in folder.iterdir() if p.name.startswith(".parasim-")], folder


@pytest.fixture
def tiny(write) -> Path:
    pytest.importorskip("torch")
    return write(TINY_LOCAL, "tiny.toml")


@pytest.mark.parametrize("command", FOLDER_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(("make", "needle"), [
    (lambda tmp: Path("/proc/parasim-out"), "cannot write /proc/parasim-out: No such file"),
    (lambda tmp: _symlink(tmp / "dangling", tmp / "absent"), "dangling is a symlink to "),
    (lambda tmp: _symlink(tmp / "loop", tmp / "loop"), "Too many levels of symbolic links"),
    (lambda tmp: _touch(tmp / "file"), "file exists and is not a directory"),
    (lambda tmp: _touch(tmp / "file") / "below", "Not a directory"),
    (lambda tmp: _touch(tmp / "other" / "notes.txt").parent,
     "holds files that are not a parasim run's (notes.txt); give a new or empty directory"),
])
def test_a_folder_that_cannot_be_the_runs_is_one_line(capsys, tiny, tmp_path, command, make,
                                                      needle):
    refused(capsys, needle, *_folder_argv(command, tiny, make(tmp_path)))
    _no_stage_left(tmp_path)


def _symlink(link: Path, to: Path) -> Path:
    link.symlink_to(to)
    return link


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    return path


@pytest.mark.parametrize("command", FOLDER_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(("flag", "free", "needle"), [
    (os.ST_RDONLY, 10**6, "is on a read-only file system"),
    (0, 3, "has 0.0 MiB free, less than the 64 MiB a run needs"),
])
def test_a_read_only_or_full_disk_is_refused_before_measuring(capsys, tiny, tmp_path,
                                                              monkeypatch, command, flag, free,
                                                              needle):
    import traces.outdir

    def statvfs(path):
        return type("S", (), {"f_flag": flag, "f_bavail": free, "f_frsize": 4096})()

    monkeypatch.setattr(traces.outdir.os, "statvfs", statvfs)
    refused(capsys, needle, *_folder_argv(command, tiny, tmp_path / "o"))
    _no_stage_left(tmp_path)


def test_a_run_may_not_write_over_its_inputs(capsys, write, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    config = write(TINY_LOCAL, "job.toml")
    monkeypatch.chdir(tmp_path)
    refused(capsys, f"--out: . holds {config}, an input of this run; write the run to another "
            "directory", "run", config, "--out", ".", "--force")
    # an input named as a run's file, in --out: the profile the config names
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rank0.json").write_text(json.dumps(PROFILE))
    with_profile = write(TINY_LOCAL + '[sim]\nprofile = "sub/rank0.json"\n', "p.toml")
    refused(capsys, "sub/rank0.json, an input of this run", "run", with_profile, "--out", "sub",
            "--force")
    refused(capsys, "sub/rank0.json, an input of this run", "validate", with_profile, "--keep",
            "sub")
    # calibrate DIR --run ... --keep DIR
    refused(capsys, "--keep: sub holds sub, an input of this run", "calibrate", "sub", "--run",
            "localhost", "--ranks", "2", "-o", tmp_path / "q.json", "--keep", "sub")


def test_a_folder_holding_another_run_is_refused_naming_it_and_the_way_to_replace_it(
        capsys, tiny, tmp_path):
    old = tmp_path / "old"
    for name in ("rank0.json", "rank1.json", "rank2.json", "rank3.json", "chrome.json"):
        _touch(old / name)
    refused(capsys, "--out: " + str(old) + " holds another run (chrome.json, rank0.json, "
            "rank1.json, rank2.json and 1 more); give --force to replace it, or a new "
            "directory", "run", tiny, "--out", old)
    refused(capsys, "--keep: " + str(old) + " holds another run", "validate", tiny, "--keep",
            old)
    assert sorted(p.name for p in old.iterdir())[0] == "chrome.json"  # untouched


def test_a_forced_run_replaces_the_old_set_whole():
    import tempfile

    from traces.outdir import StagedDir

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "o"
        for rank in range(4):
            _touch(out / f"rank{rank}.json")
        staged = StagedDir.check("--out", str(out), force=True)
        for rank in range(2):
            (staged.path / f"rank{rank}.json").write_text("new")
        assert len(list(out.iterdir())) == 4  # nothing moves before commit
        staged.commit()
        assert sorted(p.name for p in out.iterdir()) == ["rank0.json", "rank1.json"]
        _no_stage_left(Path(tmp))


def test_two_runs_into_one_folder_at_once_leave_one_set_and_one_line(tmp_path):
    from traces.outdir import StagedDir

    out = tmp_path / "o"
    first = StagedDir.check("--out", str(out))
    second = StagedDir.check("--out", str(out))  # both checked before either wrote
    for staged, text in ((first, "first"), (second, "second")):
        (staged.path / "rank0.json").write_text(text)
    first.commit()
    with pytest.raises(ConfigError, match="could not take this run's files .* Nothing of this "
                       "run was kept"):
        second.commit()
    assert (out / "rank0.json").read_text() == "first"
    _no_stage_left(tmp_path)


@pytest.mark.parametrize("fails", ["chrome.json", "rank1.json"])
def test_a_write_failing_mid_run_keeps_nothing(capsys, tiny, tmp_path, monkeypatch, fails):
    import errno

    import executor.run

    def run(exp, out_dir, **kwargs):
        for name in ("rank0.json", "rank1.json", "chrome.json"):
            if name == fails:
                raise OSError(errno.ENOSPC, "No space left on device")
            (Path(out_dir) / name).write_text("{}")

    monkeypatch.setattr(executor.run, "run", run)
    out = tmp_path / "o"
    code, stdout, err = run_(capsys, "run", tiny, "--out", out)
    assert (code, stdout) == (1, ""), err
    assert err == (f"parasim: error: --out: cannot write the run's traces to {out}: No space "
                   "left on device; nothing was kept\n")
    assert not out.exists()
    _no_stage_left(tmp_path)


run_ = run


# --- Every signal ends a command cleanly (items 9, 12, 13: the class is `sim.entry`) -----------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_while_writing_leaves_nothing_and_prints_one_line(write, tmp_path, signum):
    config = write(toml(SMALL))
    script = (
        "import os, sys\n"
        "import sim.commands.common as common\n"
        "from sim.entry import main\n"
        "real = common.dumps_chrome\n"
        "def signalled(*args):\n"  # the signal arrives after the trace's temporary was written
        f"    os.kill(os.getpid(), {int(signum)})\n"
        "    return real(*args)\n"
        "common.dumps_chrome = signalled\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, "simulate", str(config), "--trace",
                           str(tmp_path / "t.json"), "--chrome", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signum
    assert proc.stderr == f"parasim: error: terminated by {signal.Signals(signum).name}\n"
    assert sorted(os.listdir(tmp_path)) == ["c.toml"]  # no trace, no hidden temporary


# --- torchrun's environment, checked before anything starts (item 11) -------------------------

TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("edits", "needle"), [
    ({"WORLD_SIZE": "4", "RANK": "3"}, "torchrun: WORLD_SIZE 4 but the config's layout has 2 "
     "ranks"),
    ({"RANK": "abc"}, "torchrun: RANK='abc' must be an integer from 0 to"),
    ({"RANK": "-1"}, "torchrun: RANK='-1' must be an integer"),
    ({"RANK": "2"}, "RANK 2 / LOCAL_RANK 0 lie outside the world of WORLD_SIZE 2"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE 0 holds no rank"),
    ({"MASTER_PORT": None}, "torchrun: MASTER_PORT is not set"),
    ({"MASTER_PORT": "99999"}, "torchrun: MASTER_PORT='99999' must be an integer from 1 to"),
    ({"MASTER_ADDR": ""}, "torchrun: MASTER_ADDR is empty"),
])
def test_a_torchrun_environment_that_cannot_work_is_one_line(capsys, tiny, tmp_path,
                                                             monkeypatch, edits, needle):
    for name, value in {**TORCHRUN_ENV, **edits}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    refused(capsys, needle, "run", tiny, "--out", tmp_path / "o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]  # nothing made


# --- search's workers (item 12) ----------------------------------------------------------------

def test_more_search_workers_than_the_host_holds_is_refused_naming_it(capsys, monkeypatch):
    from sim.search import engines

    cores = engines.cores()
    refused(capsys, f"--workers: 1024 is more than this host holds: {cores} cores, ",
            "search", "--workers", "1024")
    monkeypatch.setattr(engines, "cores", lambda: 16)
    monkeypatch.setattr(engines, "available_memory", lambda: 100 * 2**20)
    refused(capsys, "--workers: 2 is more than this host holds: 16 cores, 0.1 GiB available "
            "memory (64 MiB a worker); give at most 1", "search", "--workers", "2")
    assert engines.default_workers() == 1


def _die(problem: object, item: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_search_worker_is_one_line_not_a_traceback():
    from sim.search.engines import open_engine
    from traces.errors import Fault

    with (pytest.raises(Fault, match=r"search: a worker process died \(.*\); the search "
                        "stopped"), open_engine(workers=2) as engine):
        engine.map(_die, None, [1, 2])


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            found |= {int(child)} | _descendants(int(child))
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_sigterm_to_a_search_ends_its_workers_and_prints_one_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sim", "search", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(_descendants(proc.pid)) < 3:  # the fork server and two workers
        assert time.monotonic() < deadline and proc.poll() is None, "the search never started"
        time.sleep(0.1)
    # Under way: a signal while the pool still starts a worker can leave that one to print
    # a traceback of its own (multiprocessing's start-up; not fixed here).
    time.sleep(1)
    workers = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)  # the parent alone, as `kill PID` does
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (143, "")
    assert err == "parasim: error: terminated by SIGTERM\n"
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() and "Z" not in _state(p) for p in workers):
        assert time.monotonic() < deadline, "a worker outlived the search by 10 s"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# --- Faults of a real run: one 2-rank world, one step, short timeouts (item 9) ---------------

FAULTY_RUN = (
    "import functools, sys\n"
    "import executor.run as r\n"
    "from sim.entry import main\n"
    "fault = tuple(int(x) for x in sys.argv.pop(1).split(','))\n"
    "r.run = functools.partial(r.run, fault=fault)\n"
    "sys.exit(main())\n"
)


def _faulty_run(tmp_path: Path, config: Path, fault: str, *flags: str) -> subprocess.Popen:
    """`parasim run` whose rank sends itself a signal in its first recorded step (`fault`:
    "rank,op,signal"); its temporary folders (the rendezvous) go under tmp_path/tmp."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", FAULTY_RUN, fault, "run", str(config), "--out",
         str(tmp_path / "o"), "--warmup", "0", *flags], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})


def _op_of(config: Path) -> int:
    from sim.config import load_experiment
    from traces.plan import build

    exp = load_experiment(config)
    return len(build(exp.model, exp.layout).ops[1]) // 2


def _left(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "tmp").iterdir())


def test_a_rank_killed_by_sigkill_is_one_line_naming_it(tiny, tmp_path):
    started = time.monotonic()
    proc = _faulty_run(tmp_path, tiny, f"1,{_op_of(tiny)},{int(signal.SIGKILL)}",
                       "--timeout", "20")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err  # no survivor's thread
    assert err.startswith("parasim: error: rank 1 failed in op "), err
    assert "process died (signal SIGKILL)" in err and "marked incomplete" in err
    assert time.monotonic() - started < 40
    assert _left(tmp_path) == []  # the rendezvous folder is gone


@pytest.mark.slow  # a real job waits out its 4 s timeout: ~13 s
def test_a_stopped_rank_is_named_and_every_rank_ends(tiny, tmp_path):
    proc = _faulty_run(tmp_path, tiny, f"1,{_op_of(tiny)},{int(signal.SIGSTOP)}",
                       "--timeout", "4")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.count("\n") == 1, err
    assert "rank 1 in op " in err and "is stopped (SIGSTOP or a debugger)" in err, err
    assert "rank 0 in" not in err, err
    assert _left(tmp_path) == []


# A rank stopped in its op would end the job at the job's own timeout: these tests give it
# JOB_TIMEOUT_S and ask the ranks to end by half of that, so an end by the signal's path is
# told from an end by the timeout by the order of the two, not by a wall time a loaded machine
# may exceed (the suite under load took 14.7 s where 10 s had been asked).
JOB_TIMEOUT_S = 120


@pytest.mark.slow  # a real job started, stopped and ended: ~8 s
def test_sigterm_to_a_run_ends_every_rank_and_removes_the_rendezvous(tiny, tmp_path):
    proc = _faulty_run(tmp_path, tiny, f"1,{_op_of(tiny)},{int(signal.SIGSTOP)}",
                       "--timeout", str(JOB_TIMEOUT_S))
    deadline = time.monotonic() + 60
    while not any(_state(p) == "T" for p in _descendants(proc.pid)):  # rank 1 has stopped
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    ranks = _descendants(proc.pid)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=JOB_TIMEOUT_S)
    assert (proc.returncode, out, err) == (143, "", "parasim: error: terminated by SIGTERM\n")
    assert time.monotonic() - started < JOB_TIMEOUT_S / 2
    deadline = started + JOB_TIMEOUT_S / 2
    while any(_state(p) != "Z" for p in ranks):
        assert time.monotonic() < deadline, "a rank outlived its parent until the timeout"
        time.sleep(0.1)
    assert _left(tmp_path) == [] and not (tmp_path / "o").exists()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_sigkill_to_a_run_leaves_no_rank_behind(tiny, tmp_path):
    """`kill -9` of the parent: it can end nothing, so the ranks must notice it gone and end
    within seconds, not at their timeout: the running rank, the stopped one (which can
    notice nothing: its sibling ends it), the fork server and multiprocessing's resource
    tracker (`executor.launch.exit_with`)."""
    proc = _faulty_run(tmp_path, tiny, f"1,{_op_of(tiny)},{int(signal.SIGSTOP)}",
                       "--timeout", str(JOB_TIMEOUT_S))
    deadline = time.monotonic() + 60
    while not any(_state(p) == "T" for p in _descendants(proc.pid)):  # rank 1 has stopped
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    ranks = _descendants(proc.pid)
    assert len(ranks) >= 3  # the fork server and both ranks
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL  # not communicate: ranks hold the pipes
    deadline = time.monotonic() + JOB_TIMEOUT_S / 2
    try:
        while alive := [p for p in ranks if _state(p) != "Z"]:
            assert time.monotonic() < deadline, (
                f"{[(p, _state(p)) for p in alive]} outlived a killed parent until the "
                "timeout")
            time.sleep(0.1)
        # the rendezvous too (multiprocessing's own pymp- folder, its fork server's socket,
        # only the launcher's exit removes)
        assert [n for n in _left(tmp_path) if not n.startswith("pymp-")] == []
    finally:
        for p in ranks:  # whatever the verdict, nothing of the test's own left running
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        proc.communicate(timeout=10)


# --- Smaller ones (item 14) ----------------------------------------------------------------------

def test_sharp_on_a_cluster_without_switches_is_refused(capsys, write):
    local = {**SMALL, "cluster": {"preset": '"localhost"', "gpus_per_node": "8"},
             "parallel": {"tp": "2", "dp": "4", "global_batch": "16"}}
    refused(capsys, "cluster.sharp: true needs servers whose NICs reach InfiniBand switches; "
            "preset 'localhost' has no NICs", "simulate",
            write(toml(local, cluster={"sharp": "true"})))


@pytest.mark.parametrize(("sim", "needle"), [
    ('profile = "absent.json"', "sim.profile: "),
    ('algo = "bogus"', "sim.algo: 'bogus' is not one of"),
])
def test_config_errors_name_the_config_field_not_a_flag(capsys, write, sim, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL) + f"[sim]\n{sim}\n"))


def test_a_gpu_count_beyond_the_simulator_is_named_as_the_flag(capsys):
    refused(capsys, "--gpus: 800,000,000 is more than the 131,072 accelerators", "search",
            "--gpus", "800000000")


def test_replaying_simulates_own_trace_calls_its_times_predicted(capsys, tmp_path):
    from sim.config import example_path

    trace = tmp_path / "t.json"
    assert run(capsys, "simulate", example_path("gpt-tiny-localhost.toml"), "--trace",
               trace)[0] == 0
    code, out, err = run(capsys, "replay", trace, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["step_time_measured_s"] is None and r["trace_times"] == "predicted"
    assert r["step_time_in_trace_s"] > 0


@pytest.mark.parametrize("value", ["0", "-1", "11", "nan"])
def test_max_error_out_of_range_is_one_line(capsys, tiny, value):
    refused(capsys, f"--max-error: {float(value):g} must be a fraction above 0", "validate",
            tiny, "--max-error", value)


# --- Progress on long steps, on a terminal only (item 15) ----------------------------------------

def test_phases_are_drawn_on_a_terminal_and_never_in_a_log(capsys, monkeypatch):
    import sim.commands.common as common

    with common.Phases("validate", 2) as phase:  # stderr is not a terminal here
        phase("run")
        time.sleep(1.1)
        phase("simulate")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(common, "_hidden", lambda: False)
    with common.Phases("validate", 2) as phase:
        phase("run (1 + 3 steps)")
        time.sleep(1.1)  # a bar shows after its first second
        phase("simulate")
    err = capsys.readouterr().err
    assert "validate: 1/2 done, simulate [00:01]" in err, err


# --- FP8 recipes (issue 32): what a recipe cannot run on, one line each ------------------------

FP8 = {"dtype": '"fp8"'}
MOE = {"experts": "4", "top_k": "2", "ffn": '"swiglu"', "ffn_hidden": "512", "norm": '"rmsnorm"',
       "position": '"rope"', "bias": "false"}


@pytest.mark.parametrize(("base", "edits", "needle"), [
    (SMALL, {"model": {**FP8, "fp8_recipe": '"mxfp8"'}},
     'model.fp8_recipe: "mxfp8" needs hardware block scaling (Blackwell), which H100'),
    (SMALL, {"model": {**FP8, "fp8_recipe": '"rowwise_with_gw_hp"'}},
     "model.fp8_recipe: 'rowwise_with_gw_hp' is not one of delayed, tensorwise, rowwise, "
     "blockwise, mxfp8"),
    (SMALL, {"model": {**FP8, "fp8_recipe": "1e400"}}, "model.fp8_recipe: inf is not one of"),
    (SMALL, {"model": {"fp8_recipe": '"blockwise"'}},
     "model.fp8_recipe: 'blockwise' applies only with model.dtype = \"fp8\", not 'bf16'"),
    (TPU, {"model": {**FP8, "fp8_recipe": '"tensorwise"'}},
     'model.dtype: "fp8" needs FP8 tensor cores, which TPU'),
    (SMALL, {"model": {**FP8, **MOE, "fp8_recipe": '"tensorwise"'},
             "parallel": {"sp": "true", "ep": "2", "etp": "2"}},
     'parallel.etp: 2 with model.fp8_recipe = "tensorwise": Transformer Engine\'s GroupedLinear'),
])
def test_fp8_recipes_where_they_cannot_run(capsys, write, base, edits, needle):
    refused(capsys, needle, "simulate", write(toml(base, **edits)))


FP4 = {"dtype": '"fp4"'}


@pytest.mark.parametrize(("base", "edits", "needle"), [
    (SMALL, {"model": FP4}, 'model.dtype: "fp4" needs FP4 tensor cores, which H100'),
    (TPU, {"model": FP4}, 'model.dtype: "fp4" needs FP4 tensor cores, which TPU'),
    (SMALL, {"model": {**FP4, "fp4_recipe": "1e400"}}, "model.fp4_recipe: inf is not one of"),
    (SMALL, {"model": {**FP8, "fp4_recipe": '"nvfp4"'}},
     "model.fp4_recipe: 'nvfp4' applies only with model.dtype = \"fp4\", not 'fp8'"),
    (SMALL, {"model": {**FP4, "fp8_recipe": '"mxfp8"'}},
     "model.fp8_recipe: 'mxfp8' applies only with model.dtype = \"fp8\", not 'fp4'"),
    (SMALL, {"model": {**FP4, "kernels": '"eager"'}},
     "model.kernels: 'eager' with model.dtype = \"fp4\""),
])
def test_fp4_where_it_cannot_run(capsys, write, base, edits, needle):
    """NVFP4 needs FP4 tensor cores (Blackwell), its own recipe key, TE's stack."""
    refused(capsys, needle, "simulate", write(toml(base, **edits)))
