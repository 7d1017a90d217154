"""`[reliability] recovery`: in-memory checkpoints (GEMINI) and elastic restarts (ByteRobust)
priced from the cluster's own links, and the work a failure loses against its closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.config import load_experiment
from sim.goodput import badput
from sim.goodput.costs import host_copy_bandwidth
from sim.goodput.montecarlo import Cause, RunModel, simulate_run
from sim.goodput.plan import plan_run
from sim.goodput.rates import COMPONENT_NAMES
from sim.goodput.recovery import expected_lost_s, largest_shard, peer_bandwidth
from sim.simulate import predict
from tests.sim.commands.test_goodput_cli import refused, run
from tests.sim.commands.test_simulate_cli import SMALL

DAY = 86_400.0


def lost_per_failure(m: RunModel, runs: int, seed: int) -> float:
    out = simulate_run(m, runs=runs, seed=seed)
    return out.badput_s[badput.WASTED] / float(np.mean(out.interruptions))


@pytest.mark.parametrize(("interval", "stall", "drain"), [
    (1800.0, 120.0, 0.0),     # a synchronous write to storage
    (1800.0, 5.0, 600.0),     # asynchronous: a failure while it drains loses one more cycle
    (60.0, 0.5, 20.0),        # in memory: a short cycle, a short drain to the peer
])
def test_lost_work_per_failure_is_the_closed_form(interval, stall, drain):
    # no restart time: every failure strikes compute, as the closed form assumes
    rate = 1 / 7200.0
    m = RunModel(useful_s=30 * DAY, work_s=30 * DAY, interval_s=interval, stall_s=stall,
                 drain_s=drain, causes=(Cause("gpu", rate, 0.0, False),), spare_nodes=0,
                 repair_s=0.0)
    closed = expected_lost_s(interval + stall, drain, rate)
    assert lost_per_failure(m, 100, 1) == pytest.approx(closed, rel=0.03)


def test_closed_form_limits():
    # λ → 0: half a cycle, plus the drain; and the exact form approaches it
    assert expected_lost_s(100.0, 10.0, 0.0) == 60.0
    assert expected_lost_s(100.0, 10.0, 1e-8) == pytest.approx(60.0, rel=1e-5)
    # no drain: the mean of a truncated exponential, 1/λ - c / (e^{λc} - 1)
    lam, c = 1 / 3600, 1800.0
    assert expected_lost_s(c, 0.0, lam) == pytest.approx(1 / lam - c / math.expm1(lam * c))


def plan(tmp_path, mode: str, extra: str = 'mtti = "2h"\nrestart = "0s"\n'):
    p = tmp_path / f"{mode}.toml"
    p.write_text(SMALL + f'\n[reliability]\nrecovery = "{mode}"\n' + extra)
    exp = load_experiment(p)
    summary, _ = predict(exp)
    return exp, plan_run(exp, summary, target=20 * DAY * summary.tokens_per_s)


def test_in_memory_prices_its_checkpoint_from_pcie_and_the_nic(tmp_path):
    exp, p = plan(tmp_path, "in_memory", "")
    _, storage = plan(tmp_path, "restart", "")
    summary, _ = predict(exp)
    shard = largest_shard(summary.memory_by_pp_rank)
    pcie, nic = host_copy_bandwidth(exp.cluster), peer_bandwidth(exp.cluster)
    assert p.stall_s == pytest.approx(shard / pcie)
    assert p.checkpoint_write_s == pytest.approx(shard / pcie + shard / nic)
    assert p.restart.load_s == pytest.approx(shard / nic)
    assert p.restart.requeue_s == storage.restart.requeue_s  # the scheduler still requeues
    assert p.restart.repair_s == storage.restart.repair_s
    assert p.stall_s < storage.stall_s and p.interval_s < storage.interval_s


GPU_ONLY = "spare_nodes = 0\n[reliability.rates]\n" + "\n".join(
    f"{c} = 0" for c in COMPONENT_NAMES if c != "gpu") + "\n"


def test_elastic_skips_the_requeue_and_the_repair_and_detects_in_30_s(tmp_path):
    _, p = plan(tmp_path, "elastic", GPU_ONLY)
    _, storage = plan(tmp_path, "restart", GPU_ONLY)
    assert (p.restart.requeue_s, p.restart.repair_s) == (0.0, 0.0)
    # ByteRobust: 10-30 s against the 10-minute NCCL watchdog, a hang's too
    assert (p.restart.detection_s, p.restart.watchdog_s) == (30.0, 30.0)
    assert storage.restart.detection_s == 600.0
    # the one cause is hardware, no spares: the storage restart waits for the repair
    assert p.restart_s == pytest.approx(storage.restart_s - 120.0 - 3600.0 - (600.0 - 30.0)
                                        - storage.restart.load_s + p.restart.load_s, rel=1e-9)
    assert p.fraction_at_optimum > storage.fraction_at_optimum


def test_elastic_keeps_a_detection_and_a_watchdog_given(tmp_path):
    _, p = plan(tmp_path, "elastic", 'detection = "2min"\nwatchdog = "5min"\n' + GPU_ONLY)
    assert (p.restart.detection_s, p.restart.watchdog_s) == (120.0, 300.0)


def test_in_memory_shortens_lost_work_by_the_closed_form(tmp_path):
    lost = {}
    for mode in ("restart", "in_memory"):
        _, p = plan(tmp_path, mode)
        m = p.model
        closed = expected_lost_s(m.interval_s + m.stall_s, m.drain_s, m.rate_per_s)
        lost[mode] = lost_per_failure(m, 60, 2)
        assert lost[mode] == pytest.approx(closed, rel=0.03), mode
    closed_ratio = (expected_lost_s(*_cycle(tmp_path, "in_memory"))
                    / expected_lost_s(*_cycle(tmp_path, "restart")))
    assert lost["in_memory"] / lost["restart"] == pytest.approx(closed_ratio, rel=0.05)
    assert closed_ratio < 1


def _cycle(tmp_path, mode: str) -> tuple[float, float, float]:
    _, p = plan(tmp_path, mode)
    return p.model.interval_s + p.model.stall_s, p.model.drain_s, p.model.rate_per_s


def test_a_bad_recovery_is_one_line(capsys, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(SMALL + '\n[reliability]\nrecovery = "pray"\n')
    refused(capsys, "reliability.recovery: 'pray' is not one of restart, in_memory, elastic",
            path)
    path.write_text(SMALL + '\n[reliability]\nrecovery = "in_memory"\n'
                    'checkpoint_write = "5min"\n')
    refused(capsys, "reliability.checkpoint_write: a write to storage, but recovery = "
            "'in_memory' checkpoints to a peer's memory", path)
    path.write_text(SMALL + '\n[reliability]\nrecovery = "elastic"\nruns = 5\n')
    code, out, _ = run(capsys, path, "--days", 2)
    assert code == 0 and "recovery            elastic" in out
