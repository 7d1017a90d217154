"""Issue 22, item 14: replaying `simulate`'s own trace gives `simulate`'s step, op by op, on
the localhost example, whose profile slows kernels beside transfers (comm_interference 1):
a kept duration already holds the stretch that slowed it, so the replay never stretches it
again (it did: rank 2's cross-entropy took 639.2 us against simulate's 319.6, the step 8%
longer).

    pytest tests/sim/engine/test_replay_own_trace.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import load_experiment
from sim.measured import choose_cluster, load_trace, replay_trace
from sim.simulate import predict
from traces.io import save
from traces.ops import OpKind

EXAMPLE = Path(__file__).parents[3] / "sim" / "examples" / "gpt-tiny-localhost.toml"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    exp = load_experiment(EXAMPLE)
    assert exp.profile.compute.comm_interference > 0  # the case: kernels slowed beside data
    _, times = predict(exp)
    path = tmp_path_factory.mktemp("own") / "trace.json"
    save(times.timed_trace(), path)
    return exp, times, load_trace(path), path


@pytest.mark.parametrize("retime", [False, True])
@pytest.mark.parametrize("host_gaps", [True, False])
def test_replaying_simulates_own_trace_is_simulate_op_by_op(simulated, retime, host_gaps):
    exp, times, loaded, _ = simulated
    cluster = choose_cluster(loaded.trace).build()
    again = replay_trace(loaded, cluster, exp.profile, retime=retime, host_gaps=host_gaps).times
    assert again.step_time_s == pytest.approx(times.step_time_s, rel=1e-12)
    for rank in times.plan.ranks:
        assert again.starts[rank] == pytest.approx(times.starts[rank], rel=1e-9, abs=1e-12)
        assert again.ends[rank] == pytest.approx(times.ends[rank], rel=1e-9, abs=1e-12)


def test_a_kept_kernel_keeps_its_duration_beside_a_transfer(simulated):
    """Some kernel of the step started beside a transfer and was stretched by simulate; the
    replay gives it the trace's duration, not twice that."""
    exp, times, loaded, _ = simulated
    stretch = 1 + exp.profile.compute.comm_interference
    cluster = choose_cluster(loaded.trace).build()
    again = replay_trace(loaded, cluster, exp.profile).times
    kernels = [(r, i) for r in times.plan.ranks for i, op in enumerate(times.plan.ops[r])
               if op.kind is OpKind.COMPUTE]
    for r, i in kernels:
        kept = loaded.trace.ops[r][i].end - loaded.trace.ops[r][i].start
        assert again.ends[r][i] - again.starts[r][i] == pytest.approx(kept, rel=1e-9)
    assert stretch == 2.0


def test_the_replay_command_agrees_with_simulate(simulated, capsys):
    _, times, _, path = simulated
    assert main(["replay", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_predicted_s"] == pytest.approx(times.step_time_s, rel=1e-12)
