"""DualPipe's overlapped pairs simulated (issue 33, items 1-2): under dualpipev with
overlap_moe_comm a forward chunk and another micro-batch's backward chunk run as one step
(DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1, Fig. 4), each one's EP
all-to-all beside the other's compute, the compute beside it on the SMs the communication
leaves (20 of 132, section 3.2.2). A pair's time in closed form: its first piece, then per
component the longer of the compute piece (each kernel's time on 112 of 132 SMs) and the
all-to-all beside it."""

from __future__ import annotations

import copy

import pytest

from sim.config import experiment_from_dict
from sim.models.compute import ComputeModel
from sim.models.reserved_sms import ReservedSms, Spared, beside_ep_comm, reserved_sms, spared
from sim.models.sharing import interference_for
from sim.simulate import predict
from traces.errors import ConfigError
from traces.layout import Schedule
from traces.moe_overlap import DEEPSEEK_COMM_SMS, comm_sms, dualpipe_pairs, groups
from traces.ops import Phase, Stream
from traces.pipeline import layout_schedule
from traces.purpose import ExpertAllToAll
from traces.stack import launch_counts

CONFIG = {
    "model": {"layers": 4, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 4096, "experts": 16, "top_k": 4,
              "moe_ffn_hidden": 1024, "shared_experts": 1, "dense_layers": 0, "bias": False},
    "parallel": {"pp": 2, "vp": 2, "schedule": "dualpipev", "dp": 8, "ep": 8,
                 "global_batch": 32, "overlap_moe_comm": True},
    "cluster": {"preset": "dgx-h800", "nodes": 2},
}


def _experiment(**parallel: object):
    config = copy.deepcopy(CONFIG)
    config["parallel"].update(parallel)
    return experiment_from_dict(config)


@pytest.fixture(scope="module")
def on():
    exp = _experiment()
    return exp, *predict(exp, fold=True)


def test_dualpipev_pairs_are_a_forward_and_the_other_chunks_full_backward() -> None:
    """pp 2, m 4: rank 0 overlaps (0F3, 3B1 3W1), (3F2, 0B0 0W0), (3F3, 0B1 0W1); rank 1
    (the V's turn) skips its first pair (1F2, 2B0 2W0), as deepseek-ai/DualPipe's middle
    ranks do, and overlaps the next three."""
    schedule = layout_schedule(_experiment().layout)
    shown = {r: [" ".join(str(actions[i]) for i in g)
                 for g in groups(Schedule.DUALPIPEV, actions)]
             for r, actions in schedule.items()}
    assert shown == {0: ["0F3 3B1 3W1", "3F2 0B0 0W0", "3F3 0B1 0W1"],
                     1: ["2F2 1B0 1W0", "1F3 2B1 2W1", "2F3 1B1 1W1"]}
    assert dualpipe_pairs(schedule[1])[0] == (7, 8, 9)


def test_the_comm_sms_default_is_deepseeks_under_dualpipe_only() -> None:
    assert comm_sms(_experiment().layout) == DEEPSEEK_COMM_SMS == 20
    assert comm_sms(_experiment(comm_sms=24).layout) == 24
    assert comm_sms(_experiment(overlap_moe_comm=False).layout) == 0
    with pytest.raises(ConfigError, match=r"^parallel.comm_sms: 132 must be below the 132 SMs"):
        _experiment(comm_sms=132)


def test_only_the_other_actions_pieces_are_beside_an_all_to_all(on) -> None:
    """On 112 SMs: the ops of the pairs' pieces that run beside the other action's
    all-to-all; none of an action alone (it waits for its all-to-all at once)."""
    exp, _, times = on
    compute = ComputeModel(exp.cluster.accelerator, exp.profile, launch_counts(exp.model))
    durations = reserved_sms(times.plan, compute, comm_sms(exp.layout))
    assert isinstance(durations, ReservedSms) and durations.units == 132 - 20
    assert reserved_sms(times.plan, compute, 0) is compute
    off = _experiment(overlap_moe_comm=False)
    plan = predict(off, fold=True)[1].plan
    assert not any(beside_ep_comm(ops) for ops in plan.ops.values())


def test_a_pairs_time_in_closed_form(on) -> None:
    """Rank 0's pair (0F3, 3B1 3W1): its ops in program order are pieces, each closed by an
    all-to-all but the last two (the backward's with its W, the forward's); piece j + 1
    starts with all-to-all j beside it, so the pair takes
    C_0 + sum_j max(C_{j+1}, A_j) + C_last, C_{j+1} the sum of its kernels' times on 112 SMs,
    C_0 (nothing beside it yet) and C_last (after its own all-to-all) on all 132, A_j the
    all-to-all's time."""
    exp, _, times = on
    rank = times.plan.ranks[0]
    ops, starts, ends = times.plan.ops[rank], times.starts[rank], times.ends[rank]
    # from 3B1's first op to 0B0's (the next pair's first piece)
    first = _first_of(ops, 1, Phase.BWD)
    last = _first_of(ops, 0, Phase.BWD, after=first)
    region = [i for i in range(first, last)
              if ops[i].stream in (Stream.COMPUTE, Stream.EP_COMM)]
    assert {(ops[i].microbatch, ops[i].phase) for i in region} == {
        (1, Phase.BWD), (1, Phase.WGRAD), (3, Phase.FWD)}
    pieces: list[list[int]] = [[]]
    a2a: list[int] = []
    for i in region:
        if isinstance(ops[i].purpose, ExpertAllToAll):
            a2a.append(i)
            pieces.append([])
        else:
            if pieces[-1] and ops[pieces[-1][-1]].microbatch != ops[i].microbatch:
                pieces.append([])  # the forward's last piece, after the backward's W
            pieces[-1].append(i)
    assert len(a2a) == 4 and all(pieces)  # a layer's dispatch and combine, both ways
    compute = ComputeModel(exp.cluster.accelerator, exp.profile, launch_counts(exp.model))
    slowed = [sum(compute.shared_duration(ops[i], 112, 1.0) for i in piece)
              for piece in pieces[1:-1]]
    first, last = (sum(compute.duration(ops[i]) for i in p) for p in (pieces[0], pieces[-1]))
    expected = first + sum(max(c, ends[j] - starts[j])
                           for c, j in zip(slowed, a2a, strict=True)) + last
    # the next pipeline receive may start before the last kernel ends: that kernel's work
    # left runs from then on the SMs NCCL leaves (`sim.engine.running`)
    end, tail = starts[region[0]] + expected, region[-1]
    recv = min((starts[i] for i, op in enumerate(ops) if op.kind != "compute"
                and not op.inline and starts[tail] < starts[i] < end), default=None)
    if recv is not None:
        scale = interference_for(exp.cluster, exp.profile, compute).kernel_scale(ops[tail])
        end = recv + (end - recv) * scale
    assert ends[tail] == pytest.approx(end, rel=1e-9)
    alone = sum(compute.duration(ops[i]) for piece in pieces[1:-1] for i in piece)
    assert sum(slowed) > 1.05 * alone  # the SMs the all-to-all holds are felt


def test_the_reserved_sms_and_the_interference_model_count_once(on) -> None:
    """An op on the SMs the all-to-all leaves is not slowed again by the interference model
    while a transfer is in flight; every other op is, by the model's own figure."""
    exp, _, times = on
    compute = ComputeModel(exp.cluster.accelerator, exp.profile, launch_counts(exp.model))
    durations = reserved_sms(times.plan, compute, comm_sms(exp.layout))
    model = interference_for(exp.cluster, exp.profile, compute)
    both = spared(model, durations)
    assert isinstance(both, Spared) and spared(model, compute) is model
    assert isinstance(durations, ReservedSms)
    ops = [op for r in times.plan.ranks for op in times.plan.ops[r] if op.kind == "compute"]
    reserved = [op for op in ops if id(op) in durations.beside]
    others = [op for op in ops if id(op) not in durations.beside and op.gemm]
    assert reserved and others
    assert all(both.kernel_scale(op) == 1.0 for op in reserved)
    assert all(both.kernel_scale(op) == model.kernel_scale(op) > 1.0 for op in others)


def _first_of(ops, microbatch: int, phase: Phase, after: int = 0) -> int:
    return next(i for i, op in enumerate(ops) if i > after and op.microbatch == microbatch
                and op.phase is phase)


def test_overlap_never_lengthens_a_dualpipev_step(on) -> None:
    _, summary, _ = on
    off = predict(_experiment(overlap_moe_comm=False), fold=True)[0]
    assert summary.step_time_s < off.step_time_s


@pytest.mark.parametrize("value", [-1, "20", True, 1.5, 1025])
def test_a_bad_comm_sms_is_refused_in_one_line(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^parallel\.comm_sms: ") as err:
        _experiment(comm_sms=value)
    assert "\n" not in str(err.value)


def test_the_command_line_refuses_too_many_comm_sms(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    shipped = Path(__file__).parents[2] / "sim" / "examples" / "deepseek-v3-2048-h800.toml"
    config = tmp_path / "sms.toml"
    config.write_text(shipped.read_text().replace("zero = 1\n", "zero = 1\ncomm_sms = 200\n"))
    done = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(shipped.parents[2])})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("parasim: error: parallel.comm_sms: 200 must be below the "
                                  "132 SMs of the ")
    assert done.stderr.endswith("(compute needs some)\n") and done.stderr.count("\n") == 1


def test_hybridep_overlap_runs_the_compute_beside_it_on_the_sms_hybridep_leaves() -> None:
    """Megatron-Core's 1f1b overlap with HybridEP: the step equals the one with its default
    16 SMs stated (`parallel.comm_sms`), and each op beside an all-to-all takes its time on
    132 - 16 SMs."""
    config = copy.deepcopy(CONFIG)
    config["model"]["dispatch"] = "hybridep"
    config["parallel"].update(pp=1, dp=16, schedule="1f1b", global_batch=64)
    config["parallel"].pop("vp")
    default = experiment_from_dict(config)
    config["parallel"]["comm_sms"] = 16
    stated = experiment_from_dict(config)
    summary, times = predict(default, fold=True)
    assert summary.step_time_s == predict(stated, fold=True)[0].step_time_s
    compute = ComputeModel(default.cluster.accelerator, default.profile,
                           launch_counts(default.model))
    durations = reserved_sms(times.plan, compute, comm_sms(default.layout, "hybridep"))
    assert isinstance(durations, ReservedSms) and durations.units == 132 - 16
