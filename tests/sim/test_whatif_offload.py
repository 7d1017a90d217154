"""`parasim whatif` to a target with activation CPU offloading (`cpu_offloading_num_layers`):
its copies are no kernel the capture could have run, so they take their bytes over the target
cluster's host link as `simulate` times them (`sim.models.host_link`); it used to be refused
with "kernel offload never ran in the capture" (and with --profile, "the cluster has no host
link" on a cluster that has PCIe). The capture is a simulated step saved as a trace, every op
timed, so whatif's step must equal simulate's for the same target."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sim.config import experiment_from_dict
from sim.settings import apply_settings, parse_settings
from sim.simulate import predict
from tests.sim.test_whatif import captured_step, job, run_json
from traces.io import save
from traces.ops import OpKind
from traces.plan import build
from traces.purpose import HostCopy

OFFLOAD = ["parallel.cpu_offloading_num_layers=1", "cluster.pcie_bandwidth=20e6"]
"""One of the two layers offloaded over a 20 MB/s host link: the copies outlast the compute."""


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("whatif-offload") / "dp2.json"
    save(captured_step(job(tp=1, dp=2)), path)
    return path


def test_offload_target_is_timed_over_the_host_link(capsys, capture) -> None:
    sets = [a for s in OFFLOAD for a in ("--set", s)]
    mine = run_json(capsys, "whatif", capture, *sets)
    data = apply_settings(tomllib.loads(job(tp=1, dp=2)), parse_settings(OFFLOAD))
    exp = experiment_from_dict(data)
    _, times = predict(exp, fold=False)
    plan = build(exp.model, exp.layout)
    copies = [op for op in plan.ops[0] if type(op.purpose) is HostCopy]
    assert copies, "the target offloads"
    _, plain = predict(experiment_from_dict(tomllib.loads(job(tp=1, dp=2))), fold=False)
    assert times.step_time_s > 1.5 * plain.step_time_s  # the copies are exposed
    assert mine["step_time_predicted_s"] == pytest.approx(times.step_time_s, rel=1e-12)
    assert mine["compute_ops_by_source"] == {"measured": sum(
        op.kind is OpKind.COMPUTE and type(op.purpose) is not HostCopy
        for ops in plan.ops.values() for op in ops)}
