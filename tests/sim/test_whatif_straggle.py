"""Stragglers among time-shared CPU ranks (`sim.whatif.straggle`): the order statistic of the
members' preemption counts, the rate and slice the capture's excesses imply, the wait each
collective of a new rank gets, and a target equal to the capture still `replay`."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import replace

import pytest

from sim.cli import main
from sim.config import experiment_from_dict
from sim.settings import parse_settings
from sim.simulate import predict
from sim.whatif import load_captured, target_experiment, whatif
from sim.whatif.book import Statistic
from sim.whatif.straggle import NONE, Straggle, expected_max_count, learn_straggle, with_straggle
from tests.sim.whatif_job import JOB
from traces.io import save
from traces.ops import Op, OpKind, Trace


def _pmf(k: int, mean: float) -> float:
    return math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1))


@pytest.mark.parametrize("mean", [0.05, 0.7, 3.0, 25.0])
def test_the_expected_maximum_is_the_order_statistic_of_the_counts(mean):
    """E[max] against the enumeration of every pair and triple of counts, sum of
    max(a, b, ..) p(a) p(b) ..; one member's is its mean."""
    top = int(mean + 14 * math.sqrt(mean) + 40)
    p = [_pmf(k, mean) for k in range(top)]
    pairs = sum(max(a, b) * p[a] * p[b] for a in range(top) for b in range(top))
    cdf = [sum(p[:k + 1]) for k in range(top)]
    triples = sum(k * (cdf[k] ** 3 - (cdf[k - 1] if k else 0.0) ** 3) for k in range(top))
    assert expected_max_count(mean, 1) == pytest.approx(mean, rel=1e-12)
    assert expected_max_count(mean, 2) == pytest.approx(pairs, rel=1e-10)
    assert expected_max_count(mean, 3) == pytest.approx(triples, rel=1e-10)


def test_a_rare_preemption_costs_each_member_beyond_the_first_a_mean_delay():
    """rate x run -> 0: the last of n is late by about n times the mean, so each waits
    (n - 1) x rate x run x slice; exactly, slice x (E[max] - mean)."""
    straggle = Straggle(rate=10.0, slice_s=4e-3)
    run = 1e-4  # mean count 1e-3
    assert straggle.wait(run, 4) == pytest.approx(3 * 10.0 * run * 4e-3, rel=5e-3)
    assert straggle.wait(run, 4) == 4e-3 * (expected_max_count(1e-3, 4) - 1e-3)
    assert straggle.wait(run, 1) == 0.0 and NONE.wait(run, 4) == 0.0


def _kernel(start: float, end: float, flops: float = 1.0) -> Op:
    return Op(kind=OpKind.COMPUTE, stream="compute", name="k", flops=flops, start=start, end=end)


def test_the_slice_and_rate_are_the_excesses_first_two_moments():
    """One shape at 1, 1, 1, 4 ms (median 1: excesses 0, 0, 0, 3 ms), another at 2, 2 ms:
    slice = 9 / 3 = 3 ms, rate = 3 ms / (3 ms x 11 ms) = 1 / 11 ms."""
    ms = 1e-3
    ops = (_kernel(0, ms), _kernel(ms, 2 * ms), _kernel(2 * ms, 3 * ms), _kernel(3 * ms, 7 * ms),
           _kernel(7 * ms, 9 * ms, flops=2.0), _kernel(9 * ms, 11 * ms, flops=2.0))
    straggle = learn_straggle([Trace({0: ops[:3], 1: ops[3:]})])
    assert straggle.slice_s == pytest.approx(3 * ms, rel=1e-12)
    assert straggle.rate == pytest.approx(1 / (11 * ms), rel=1e-12)
    assert learn_straggle([Trace({0: ops[:3]})]) == NONE  # no excess: no preemption


def test_each_collective_waits_for_the_run_since_the_rank_s_last_communication():
    """Kernels of 2 and 1 ms with a 0.5 ms host gap, a TP all-reduce, a 1 ms kernel, a
    send (it ends the run, adds nothing), a 3 ms kernel, a DP all-reduce of 4 members."""
    ms = 1e-3
    ar = Op(kind=OpKind.ALL_REDUCE, stream="tp", name="ar", group=(0, 1))
    ops = [_kernel(0, 2 * ms), _kernel(0, ms), ar, _kernel(0, ms),
           Op(kind=OpKind.SEND, stream="pp", name="s", peer=1), _kernel(0, 3 * ms),
           replace(ar, group=(0, 1, 2, 3))]
    gaps = [0.0, 0.5 * ms, 0.1 * ms, 0.0, 0.0, 0.0, 0.0]
    straggle = Straggle(rate=50.0, slice_s=5 * ms)
    out = with_straggle(ops, gaps, straggle)
    assert out[2] == pytest.approx(0.1 * ms + straggle.wait(3.6 * ms, 2), rel=1e-12)
    assert out[6] == pytest.approx(straggle.wait(3 * ms, 4), rel=1e-12)
    assert out[6] > 0.0
    assert [out[i] for i in (0, 1, 3, 4, 5)] == [gaps[i] for i in (0, 1, 3, 4, 5)]


@pytest.fixture(scope="module")
def capture_path(tmp_path_factory):
    """A DP 2 step on 2 time-shared cores, every fifth kernel of rank 1 preempted for 2 ms."""
    _, times = predict(experiment_from_dict(tomllib.loads(JOB)), fold=False)
    timed = times.timed_trace()
    ops = dict(timed.ops)
    ops[1] = tuple(replace(op, end=op.end + 2e-3) if op.kind is OpKind.COMPUTE and i % 5 == 0
                   else op for i, op in enumerate(ops[1]))
    path = tmp_path_factory.mktemp("straggle") / "dp2.json"
    save(Trace(ops, replace(timed.meta, complete=True)), path)
    return path


@pytest.fixture(scope="module")
def captured(capture_path):
    return load_captured([str(capture_path)])


def test_a_target_equal_to_the_capture_is_still_its_replay(captured):
    same = target_experiment(captured)
    on, off = whatif(captured, same, stragglers=True), whatif(captured, same, stragglers=False)
    assert on.ranks_kept == on.ranks == 2 and on.straggle != NONE and on.straggle_s == 0.0
    assert on.step_time_s == off.step_time_s


def test_new_ranks_collectives_wait_for_the_last_member_by_default(captured, tmp_path):
    """DP 2 -> TP 2 on the capture's host: each TP all-reduce waits; off, none does; a
    median statistic or a host that does not state its cores leaves them out."""
    tp2 = parse_settings(["parallel.dp=1", "parallel.tp=2"])
    exp = target_experiment(captured, settings=tp2)
    on = whatif(captured, exp, capture_links=False)
    off = whatif(captured, exp, capture_links=False, stragglers=False)
    assert on.straggle == learn_straggle(captured.traces) != NONE
    assert on.straggle_s > 0.0 and off.straggle_s == 0.0
    assert on.step_time_s > off.step_time_s
    median = whatif(captured, exp, capture_links=False, statistic=Statistic.MEDIAN)
    assert median.straggle == NONE
    plain = tmp_path / "tp2.toml"
    plain.write_text(JOB.replace("cores = 2", "").replace("dp = 2", "tp = 2"))
    assert whatif(captured, target_experiment(captured, str(plain)),
                  capture_links=False).straggle == NONE


def test_the_cli_reports_the_waits_and_turns_them_off(capsys, capture_path, captured):
    """JSON `stragglers`: the rate, the slice and the waits of the rank with the most, as
    `whatif` gives them; `--stragglers off`: no key, and the step without them."""
    tp2 = ["--set", "parallel.dp=1", "--set", "parallel.tp=2", "--links", "cluster"]
    outs = []
    for flag in ("auto", "off"):
        assert main(["whatif", str(capture_path), *tp2, "--stragglers", flag, "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    result = whatif(captured, target_experiment(captured, settings=parse_settings(
        ["parallel.dp=1", "parallel.tp=2"])), capture_links=False)
    assert outs[0]["stragglers"] == {"preemptions_per_s": result.straggle.rate,
                                     "slice_s": result.straggle.slice_s,
                                     "waits_s": result.straggle_s}
    assert outs[0]["step_time_predicted_s"] == result.step_time_s
    assert "stragglers" not in outs[1]
    assert outs[1]["step_time_predicted_s"] < outs[0]["step_time_predicted_s"]
