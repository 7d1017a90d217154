"""Progress that moves (issue 36): writing --trace and --chrome counts ranks, then ops or
events, then bytes gzipped, on bars whose counts end at the file's own totals; the chunked
writing gives the very bytes of the one-shot one; a bar appears and its clock moves while
nothing is counted."""

from __future__ import annotations

import gzip
import io
import json
import re
import time

import pytest

from sim.cli import main
from sim.commands import common
from sim.config import example_path, load_experiment
from sim.simulate import predict
from traces import json_chunks
from traces.chrome import dumps_chrome, to_chrome
from traces.io import dumps, to_json
from traces.json_chunks import gzip_counted


@pytest.fixture
def timed():
    _, times = predict(load_experiment(example_path("gpt-tiny-localhost.toml")))
    return times.timed_trace()


@pytest.fixture
def shown(monkeypatch):
    """Bars drawn as if stderr were a terminal, at once and at every count."""
    monkeypatch.setattr(common, "_hidden", lambda: False)
    monkeypatch.setattr(common, "BAR_DELAY_S", 0.0)
    monkeypatch.setattr(common, "BAR_MININTERVAL_S", 0.0)
    monkeypatch.setattr(json_chunks, "CHUNK_ITEMS", 97)
    monkeypatch.setattr(json_chunks, "CHUNK_BYTES", 4096)


def test_the_chunks_give_the_one_shot_bytes(timed, monkeypatch):
    monkeypatch.setattr(json_chunks, "CHUNK_ITEMS", 7)
    monkeypatch.setattr(json_chunks, "CHUNK_BYTES", 1000)
    calls: list[tuple[str, int, int]] = []
    text = dumps_chrome(timed, lambda *c: calls.append(c))
    assert text == json.dumps(to_chrome(timed), separators=(",", ":")) + "\n"
    assert dumps(timed) == json.dumps(to_json(timed), separators=(",", ":")) + "\n"
    assert gzip_counted(text, None) == gzip.compress(text.encode(), compresslevel=6, mtime=0)
    ranks = [c for c in calls if c[0] == "rank"]
    events = [c for c in calls if c[0] == "item"]
    assert [d for _, d, _ in ranks] == list(range(1, len(timed.ops) + 1))
    assert events[-1][1:] == (len(to_chrome(timed)["traceEvents"]),) * 2
    assert all(b[1] - a[1] == 7 for a, b in zip(events, events[1:-1]))


def last_count(err: str, desc: str) -> tuple[int, int]:
    """The last 'n/total' a bar named `desc` drew."""
    frames = re.findall(rf"{re.escape(desc)}:[^\r\n]*?(\d+)/(\d+)", err)
    assert frames, f"no bar {desc!r} in {err[-500:]!r}"
    return int(frames[-1][0]), int(frames[-1][1])


def test_simulate_counts_its_plan_its_replay_and_its_writing(tmp_path, capsys, shown):
    trace, chrome = tmp_path / "t.json", tmp_path / "c.json.gz"
    assert main(["simulate", str(example_path("gpt-tiny-localhost.toml")), "--trace",
                 str(trace), "--chrome", str(chrome)]) == 0
    err = capsys.readouterr().err
    ranks = len(json.loads(trace.read_text())["ranks"])
    ops = sum(len(r) for r in json.loads(trace.read_text())["ranks"].values())
    text = gzip.decompress(chrome.read_bytes())
    events = len(json.loads(text)["traceEvents"])
    assert last_count(err, "simulate: ranks planned") == (ranks, ranks)  # the plan's build
    replayed = last_count(err, "simulate: ops replayed")
    assert replayed[0] == replayed[1] > 0
    assert err.index("simulate: ranks planned") < err.index("simulate: ops replayed")
    assert last_count(err, "--trace t.json: ranks") == (ranks, ranks)
    assert last_count(err, "--trace t.json: ops") == (ops, ops)
    assert last_count(err, "--chrome c.json.gz: ranks") == (ranks, ranks)
    assert last_count(err, "--chrome c.json.gz: events") == (events, events)
    assert last_count(err, "--chrome c.json.gz: bytes gzipped") == (len(text), len(text))


def test_a_bar_appears_and_ticks_while_nothing_is_counted(monkeypatch):
    """Its first frame within BAR_DELAY_S and a heartbeat, and frames with no count added."""
    stream = io.StringIO()
    stream.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(common.sys, "stderr", stream)
    monkeypatch.setattr(common, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(common, "BAR_DELAY_S", 0.1)
    with common.Phases("waiting", 2) as phase:
        phase("the first, long, unit")
        deadline = time.monotonic() + 30
        while stream.getvalue().count("the first, long, unit") < 3:
            assert time.monotonic() < deadline, stream.getvalue()
            time.sleep(0.05)
    assert "waiting: 0/2 done, the first, long, unit" in stream.getvalue()


def test_a_sweep_counts_its_points(capsys, shown):
    assert main(["sweep", "parallel.micro_batch", "1", "2", "4", "--config",
                 str(example_path("gpt-tiny-localhost.toml"))]) == 0
    assert last_count(capsys.readouterr().err, "sweep") == (3, 3)


@pytest.mark.slow
def test_a_run_counts_its_ranks_joining_then_rank_0s_ops(tmp_path, capsys, shown):
    pytest.importorskip("torch")
    from traces.io import load

    out = tmp_path / "run"
    assert main(["run", str(example_path("gpt-tiny-2rank-localhost.toml")), "--out", str(out),
                 "--steps", "2", "--warmup", "1"]) == 0
    err = capsys.readouterr().err
    ops = len(load(out / "rank0.json").ops[0])
    assert last_count(err, "run: ranks joined") == (2, 2)
    assert last_count(err, "run: ops over 2 steps") == (2 * ops, 2 * ops)


@pytest.mark.slow
def test_validate_counts_its_runs_ranks_joining_then_rank_0s_ops(tmp_path, capsys, shown):
    """As `run` does, inside validate's phase bar (issue 36: its run showed only the phase)."""
    pytest.importorskip("torch")
    from sim.profile import ComputeParams, LinkParams, Profile
    from traces.io import load

    profile, keep = tmp_path / "given.json", tmp_path / "keep"
    Profile(name="given", calibrated=True, measured_on="CPU-localhost",
            compute=ComputeParams(gemm_efficiency=0.5, gemm_tiles=((8, 8),),
                                  launch_overhead_s=5e-5),
            links={"loopback": LinkParams(bandwidth_Bps=2e9, latency_s=2e-5)}).save(profile)
    assert main(["validate", str(example_path("gpt-tiny-2rank-localhost.toml")), "--profile",
                 str(profile), "--steps", "2", "--warmup", "1", "--keep", str(keep)]) == 0
    err = capsys.readouterr().err
    ops = len(load(keep / "run" / "rank0.json").ops[0])
    assert last_count(err, "validate run: ranks joined") == (2, 2)
    assert last_count(err, "validate run: ops over 2 steps") == (2 * ops, 2 * ops)
    assert err.index("validate: 0/3 done, run") < err.index("validate run: ranks joined")
