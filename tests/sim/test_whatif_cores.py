"""CPU ranks sharing a host's cores (`[cluster] cores`, localhost only): a what-if target
with more ranks than cores runs its kernels and host gaps ranks/cores times as long as a
capture whose ranks each had a core; a cluster that does not state its cores is not shared."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest

from sim.cli import main
from sim.config import experiment_from_dict
from sim.settings import parse_settings
from sim.simulate import predict
from sim.whatif import load_captured, target_experiment, whatif
from sim.whatif.book import Statistic
from tests.sim.whatif_job import JOB
from topology.config import cluster_from_table
from traces.io import save
from traces.ops import OpKind, Trace


def test_ranks_beyond_the_cores_time_share_them():
    cluster = cluster_from_table({"preset": "localhost", "gpus_per_node": 8, "cores": 2})
    assert cluster.cores == 2
    assert [cluster.time_shared(n) for n in (1, 2, 3, 8)] == [1.0, 1.0, 1.5, 4.0]
    unknown = cluster_from_table({"preset": "localhost", "gpus_per_node": 8})
    assert unknown.cores == 0 and unknown.time_shared(8) == 1.0


def test_cores_on_a_gpu_cluster_is_one_line(capsys, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(JOB.replace('"localhost"', '"dgx-h100"'))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == ("parasim: error: cluster.cores: applies to the localhost preset only (CPU "
                   "ranks sharing a host's cores), not to preset 'dgx-h100'\n")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    _, times = predict(experiment_from_dict(tomllib.loads(JOB)), fold=False)
    timed = times.timed_trace()
    path = tmp_path_factory.mktemp("cores") / "dp2.json"
    save(Trace(timed.ops, replace(timed.meta, complete=True)), path)
    return load_captured([str(path)])


def _kernels(result) -> list[float]:
    return [op.end - op.start for op in result.times.plan.ops[0] if op.kind is OpKind.COMPUTE]


def test_four_ranks_on_two_cores_run_each_kernel_twice_as_long(captured):
    """DP 2 -> DP 4 on the capture's 2 cores, against the same target on 4 cores (each rank
    a core, as the capture's had): every kernel x2 exactly, every host gap too."""
    def target(cores: int):
        return whatif(captured, target_experiment(captured, settings=parse_settings(
            ["parallel.dp=4", "cluster.gpus_per_node=4", f"cluster.cores={cores}"])))

    shared, own = target(2), target(4)
    assert (shared.time_shared, own.time_shared) == (2.0, 1.0)
    assert _kernels(shared) == [2 * t for t in _kernels(own)]
    assert shared.times.plan.ops[0] != own.times.plan.ops[0]
    assert shared.step_time_s > 1.5 * own.step_time_s


def test_a_target_not_stating_its_cores_is_not_time_shared(captured, tmp_path):
    target = tmp_path / "dp4.toml"
    target.write_text(JOB.replace("cores = 2", "").replace("dp = 2", "dp = 4")
                      .replace("gpus_per_node = 2", "gpus_per_node = 4"))
    assert whatif(captured, target_experiment(captured, str(target))).time_shared == 1.0


def test_other_load_on_the_capture_s_host_shares_the_cores_too(captured):
    """The capture's probe saw each of its 2 ranks get 0.4 of a core: 2 / 0.4 = 5 threads
    were runnable, 3 of them someone else's. On that host a 4-rank target is one of 7, not
    of 4: (4 + 3) / (2 + 3) = 1.4 times the capture's time, not 2."""
    probe = {"collective": "all_reduce", "ranks": 2, "samples": [], "cpu_share": 0.4}
    loaded = replace(captured, loaded=(replace(captured.loaded[0], trace=Trace(
        captured.first.ops, replace(captured.first.meta, host_probe=probe))),))
    result = whatif(loaded, target_experiment(loaded, settings=parse_settings(
        ["parallel.dp=4", "cluster.gpus_per_node=4"])), capture_links=False)
    assert result.time_shared == pytest.approx(7 / 5, rel=1e-12)


def _probed(captured, share: float | None):
    """`captured` with a probe that read `share` of a core per rank (None: no probe)."""
    probe = None if share is None else {"collective": "all_reduce", "ranks": 2,
                                        "samples": [], "cpu_share": share}
    return replace(captured, loaded=(replace(captured.loaded[0], trace=Trace(
        captured.first.ops, replace(captured.first.meta, host_probe=probe))),))


def test_the_share_statistic_bounds_the_step_by_the_cpu_work_over_its_share(captured):
    """--statistic share, DP 2 -> DP 4 on 2 cores: the busiest rank's unpreempted work W
    takes at least W (4 + b) / 2, b the other threads the probe saw (2 / s - 2): W x 2
    unprobed, x 3 at s = 0.5, x 5 at s = 0.25; its kernels keep their medians."""
    results = [whatif(loaded, target_experiment(loaded, settings=parse_settings(
        ["parallel.dp=4", "cluster.gpus_per_node=4"])), statistic=Statistic.SHARE,
        capture_links=False) for loaded in (_probed(captured, s) for s in (None, 0.5, 0.25))]
    bounds = [r.cpu_bound_s for r in results]
    assert bounds[1] == pytest.approx(bounds[0] * 3 / 2, rel=1e-12)
    assert bounds[2] == pytest.approx(bounds[0] * 5 / 2, rel=1e-12)
    assert _kernels(results[0]) == _kernels(results[2])  # the bound scales no kernel
    assert results[2].step_time_s == bounds[2] > results[2].times.step_time_s
