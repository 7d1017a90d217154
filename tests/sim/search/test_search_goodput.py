"""`parasim search --objective goodput`: the simulated layouts ranked by effective tokens/s,
the default output untouched."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from tests.sim.search.search_cases import SMALL_TOML


@pytest.fixture
def config(tmp_path):
    def write(extra: str = "") -> str:
        path = tmp_path / "small.toml"
        path.write_text(SMALL_TOML + extra)
        return str(path)
    return write


def search(capsys, *argv: str) -> str:
    assert main(["search", *argv, "--workers", "1", "--top", "3"]) == 0
    return capsys.readouterr().out


def test_goodput_ranks_by_effective_tokens_and_only_adds_keys(capsys, config):
    path = config()
    plain = json.loads(search(capsys, path, "--json"))
    ranked = json.loads(search(capsys, path, "--json", "--objective", "goodput"))
    assert ranked["objective"] == "goodput"
    assert {k: v for k, v in ranked.items() if k not in ("objective", "goodput")} == plain
    rows = ranked["goodput"]
    assert sorted(r["step_rank"] for r in rows) == [1, 2, 3]
    assert [r["effective_tokens_per_s"] for r in rows] == sorted(
        (r["effective_tokens_per_s"] for r in rows), reverse=True)
    by_summary = {r["summary"]: r for r in plain["simulated"]}
    for r in rows:  # effective = simulated tokens/s x the expected fraction
        assert 0 < r["effective_training_fraction"] < 1
        assert r["effective_tokens_per_s"] == pytest.approx(
            by_summary[r["summary"]]["tokens_per_s"] * r["effective_training_fraction"])


def test_a_slow_checkpoint_store_lowers_every_fraction(capsys, config):
    fast = json.loads(search(capsys, config(), "--json", "--objective", "goodput"))
    slow = json.loads(search(capsys, config('\n[reliability]\nstorage_bandwidth = "10MB/s"\n'
                                            'mtti = "6h"\n'),
                             "--json", "--objective", "goodput"))
    fast_f = {r["summary"]: r["effective_training_fraction"] for r in fast["goodput"]}
    for r in slow["goodput"]:
        assert r["effective_training_fraction"] < fast_f[r["summary"]]
    assert "ranked by goodput" in search(capsys, config(), "--objective", "goodput")


def test_goodput_objective_reports_time_to_train_one_common_target(capsys, config):
    ranked = json.loads(search(capsys, config("\n[reliability]\nruns = 20\n"), "--json",
                               "--objective", "goodput"))
    rows = ranked["goodput"]
    fastest = max(r["tokens_per_s"] for r in ranked["simulated"])
    for r in rows:
        t = r["time_to_train"]
        assert t["tokens"] == pytest.approx(30 * 86_400 * fastest)  # one target for all
        assert t["days"]["p50"] <= t["days"]["p90"]
        gpus = 16  # 2 DGX A100
        assert t["gpu_hours"]["p50"] == pytest.approx(t["days"]["p50"] * 24 * gpus)
        # the slower a layout's step, the longer its failure-free part alone
        speed = next(s["tokens_per_s"] for s in ranked["simulated"]
                     if s["summary"] == r["summary"])
        assert t["days"]["p50"] >= 30 * fastest / speed
    text = search(capsys, config("\n[reliability]\nruns = 20\n"), "--objective", "goodput")
    assert "p50 d" in text and "time to train" in text
