"""`parasim run`'s link probe (`executor.probe`: all-reduces over the world at a few sizes,
the header's `host_probe`): `parasim whatif` fits the capture's link figures to it by default,
and several sizes pin down what a DP capture's one gradient all-reduce cannot: the cost of a
call apart from the cost of its bytes."""

from __future__ import annotations

import statistics
import tomllib
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from sim.calibrate.links import _Design, _Row, fit_links
from sim.calibrate.observe import CommSample
from sim.collectives import Algorithm
from sim.config import experiment_from_dict
from sim.settings import parse_settings
from sim.simulate import predict
from sim.whatif import load_captured, target_experiment, whatif
from sim.whatif.links import _held, group_links, probe_samples
from sim.whatif.predict import FITTED, PROBED, _communication
from tests.sim.whatif_job import LOCAL as JOB
from topology.override import link_figures, with_links
from traces.errors import ConfigError
from traces.io import save
from traces.ops import OpKind, Trace

FIGURES = (0.4e9, 1.5e-3, 0.5e-3)
"""The capture host's loopback: bandwidth, latency, per-call cost (gloo on a loaded host)."""
SIZES = (4, 64 * 2**10, 2**20, 4 * 2**20)


def _probe_times(figures: tuple[float, float, float]) -> list[float]:
    """Each probe size's all-reduce on 2 ranks of a loopback with `figures` (bandwidth,
    latency, call cost), by the lowering the fit inverts (`sim.calibrate.links._Design`)."""
    exp = experiment_from_dict(tomllib.loads(JOB))
    rows = [_Row(OpKind.ALL_REDUCE, (0, 1), float(s), 0.0, 1) for s in SIZES]
    design = _Design(exp.cluster, rows, Algorithm.AUTO)
    assert design.kinds == ["loopback"]
    c, a = design.matrix()
    bw, lat, call = figures
    return [float(t) for t in c + a @ np.array([lat, 1 / bw, call])]


def _capture(tmp_path, probe: bool, samples: list[list[float]] | None = None) -> str:
    """A DP 2 step simulated on a host whose loopback has `FIGURES`, saved as a run's, with
    (`probe`) the all-reduces a probe would time on it (`samples`, where given)."""
    exp = experiment_from_dict(tomllib.loads(JOB))
    bw, lat, call = FIGURES
    slow = with_links(exp.cluster, {"loopback": (bw, lat)}, calls={"loopback": call})
    _, times = predict(replace(exp, cluster=slow), fold=False)
    timed = times.timed_trace()
    rows = samples or [[s, t] for s, t in zip(SIZES, _probe_times(FIGURES))]
    table = {"collective": "all_reduce", "dtype": "fp32", "ranks": 2, "samples": rows}
    meta = replace(timed.meta, complete=True, host_probe=table if probe else None)
    path = tmp_path / f"dp2-{probe}-{len(rows)}.json"
    save(Trace(timed.ops, meta), path)
    return str(path)


def test_the_probe_pins_down_the_call_and_the_bytes_by_default(tmp_path):
    """DP 2 -> TP 2: the capture's one gradient all-reduce and the probe's four sizes give
    the host's bandwidth, and each size's time, within 2% (the step's own all-reduce is
    slowed a little by the compute beside it; latency and call cost, nearly collinear on one
    group, may split differently)."""
    captured = load_captured([_capture(tmp_path, probe=True)])
    assert len(probe_samples(captured.first)) == len(SIZES)
    target = target_experiment(captured, settings=parse_settings(["parallel.dp=1",
                                                                  "parallel.tp=2"]))
    result = whatif(captured, target)
    assert result.links is not None and result.links.unidentified == ()
    fitted = result.links.figures["loopback"]
    assert fitted[0] == pytest.approx(FIGURES[0], rel=0.02)
    assert _probe_times(fitted) == pytest.approx(_probe_times(FIGURES), rel=0.02)
    assert whatif(captured, target, capture_links=False).links is None


def test_without_the_probe_the_cluster_s_figures_stay_by_default(tmp_path):
    captured = load_captured([_capture(tmp_path, probe=False)])
    target = target_experiment(captured, settings=parse_settings(["parallel.dp=1",
                                                                  "parallel.tp=2"]))
    assert whatif(captured, target).links is None


def test_a_malformed_probe_is_one_line(tmp_path):
    captured = load_captured([_capture(tmp_path, probe=True)])
    bad = replace(captured.first.meta, host_probe={"collective": "all_reduce", "ranks": 2,
                                                   "samples": [[4, -1.0]]})
    with pytest.raises(ConfigError, match=r"^trace: meta.host_probe: not an all-reduce probe"):
        probe_samples(Trace(captured.first.ops, bad))


def test_a_size_stands_for_the_mean_of_its_calls(tmp_path):
    """The probe's calls are bimodal on a time-shared host: most cost their own time, some
    wait a scheduler tick more (4 ms at CONFIG_HZ=250; `executor.probe.PROBE_CALLS`). A TP
    step pays the mean per call, and the fit sees exactly that: 32 calls of a size, 8 of them
    a tick late, fit the figures one call at their mean fits."""
    tick = 4e-3
    calls = [[s, t + (tick if i % 4 == 0 else 0.0)]
             for s, t in zip(SIZES, _probe_times(FIGURES)) for i in range(32)]
    means = [[s, t + tick / 4] for s, t in zip(SIZES, _probe_times(FIGURES))]
    figures = []
    for samples in (calls, means):
        captured = load_captured([_capture(tmp_path, probe=True, samples=samples)])
        target = target_experiment(captured, settings=parse_settings(["parallel.dp=1",
                                                                      "parallel.tp=2"]))
        links = whatif(captured, target).links
        assert links is not None
        figures.append(links.figures)
    assert figures[0].keys() == figures[1].keys() == {"loopback"}
    assert figures[0]["loopback"] == pytest.approx(figures[1]["loopback"], rel=1e-9)


def test_latency_held_the_call_and_the_bytes_are_fitted_to_the_sizes():
    """One group's all-reduces pay latency and call cost alike, once per call: where the
    full fit names all three figures unidentified, whatif holds the latency at the
    cluster's and fits the call cost and the bandwidth to the sizes' means, which the probe
    pins down (`sim.whatif.links._held`); from probe times made by the lowering itself it
    gives the figures back. One size pins down no more than the bandwidth."""
    exp = experiment_from_dict(tomllib.loads(JOB))
    base = {kind: (bw, lat, 0.0) for kind, (bw, lat) in link_figures(exp.cluster).items()}
    truth = (FIGURES[0], base["loopback"][1], FIGURES[2])
    samples = [CommSample(OpKind.ALL_REDUCE, (0, 1), float(s), t)
               for s, t in zip(SIZES, _probe_times(truth)) for _ in range(3)]
    fit = fit_links(samples, exp.cluster, base=base)
    held = _held(fit, samples, exp.cluster, base, hold_call=False)
    assert held is not None
    (link,) = held.links
    assert (link.bandwidth_Bps, link.latency_s, link.call_s) == pytest.approx(truth, rel=1e-9)
    assert link.call_unidentified is None and link.bandwidth_unidentified is None
    assert _held(fit, samples[:1], exp.cluster, base, hold_call=False) is None
    only_bytes = _held(fit, samples[:1], exp.cluster, base, hold_call=True)
    assert only_bytes is not None and only_bytes.links[0].call_s == 0.0


TP_SIZES = (4, 16384, 2**20, 4 * 2**20)
"""The probe at the test job's TP 2 activation all-reduce (16 KiB) in place of 64 KiB."""


def _tp2_from_probed(tmp_path):
    """DP 2 -> TP 2 from a capture whose probe ran the TP step's 4 B and 16 KiB
    all-reduces, each size's calls bimodal (every fourth a 4 ms scheduler tick late)."""
    tick = 4e-3
    rows = [[s, t + (tick if i % 4 == 0 else 0.0)]
            for s, t in zip(TP_SIZES, (2e-4, 3e-4, 2e-3, 6e-3)) for i in range(8)]
    captured = load_captured([_capture(tmp_path, probe=True, samples=rows)])
    target = target_experiment(captured, settings=parse_settings(["parallel.dp=1",
                                                                  "parallel.tp=2"]))
    means = {s: statistics.fmean(t for b, t in rows if b == s) for s in TP_SIZES}
    return captured, target, means


def test_an_all_reduce_the_probe_ran_takes_its_mean(tmp_path):
    """The TP group is the probe's world (2 ranks, loopback): its 16 KiB and 4 B all-reduces
    take the probe's mean for the size exactly, from their last member's arrival; its 256 B
    and 512 B ones (no probed size) are simulated on the fitted links."""
    captured, target, means = _tp2_from_probed(tmp_path)
    result = whatif(captured, target)
    assert result.links is not None and result.links.probe is not None
    assert result.links.probe.means == tuple(sorted((float(s), m) for s, m in means.items()))
    assert result.communication_by_source == {PROBED: 2 * 41, FITTED: 2 * 8}
    plan, seen = result.times.plan, Counter()
    for i, op in enumerate(plan.ops[0]):
        if op.kind is not OpKind.ALL_REDUCE:
            continue
        began = max(result.times.starts[r][i] for r in (0, 1))  # both run the same ops
        took = result.times.ends[0][i] - began
        if op.size_bytes == 0.0:
            seen[op.end] += 1
            assert took == pytest.approx(op.end, rel=1e-12, abs=1e-15)
        else:
            assert op.size_bytes in (256, 512)
    assert seen == {means[4]: 1, means[16384]: 40}


def test_other_sizes_and_groups_keep_the_fit(tmp_path):
    """An all-reduce of a size the probe did not run, a group of another size than the
    probe's world, another collective, and a group a rank kept as captured is in, stay
    sized: the links time them."""
    captured, target, means = _tp2_from_probed(tmp_path)
    links = whatif(captured, target).links
    assert links is not None and links.probe is not None
    probe, cluster = links.probe, target.cluster
    op = next(o for o in captured.first.ops[0] if o.kind is OpKind.ALL_REDUCE)
    probed = replace(op, group=(0, 1), size_bytes=16384.0, start=None, end=None)
    assert probe.seconds(probed, cluster) == means[16384]
    assert _communication(probed, links, cluster, set()) == \
        (replace(probed, size_bytes=0.0, start=0.0, end=means[16384]), PROBED)
    for other in (replace(probed, size_bytes=16385.0), replace(probed, size_bytes=512.0),
                  replace(probed, kind=OpKind.ALL_GATHER)):
        assert probe.seconds(other, cluster) is None
        assert _communication(other, links, cluster, set()) == (other, FITTED)
    assert _communication(probed, links, cluster, {1}) == (probed, FITTED)
    four = JOB.replace("gpus_per_node = 2", "gpus_per_node = 4").replace("dp = 2", "dp = 4")
    wide = experiment_from_dict(tomllib.loads(four))
    three = replace(probed, group=(0, 1, 2))
    assert group_links(wide.cluster, (0, 1, 2)) == probe.links  # the same loopback
    assert probe.seconds(three, wide.cluster) is None
    assert _communication(three, links, wide.cluster, set()) == (three, FITTED)
    assert probe.seconds(probed, wide.cluster) == means[16384]
