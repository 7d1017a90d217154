"""overlap_moe_comm simulated (issue 33, item 2): over several small layouts the step is never
longer than without it (and shorter where all-to-alls were exposed); the all-to-alls of the
actions that run alone (warm-up and cool-down) stay exposed to the last second; what is hidden
is never more than the compute of the paired actions that could hide it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.config import experiment_from_dict
from sim.models.memory import memory_timeline, pp_rank_memory
from sim.report.timeline import pipeline_passes, timed_actions
from sim.search.analytic import Analytic
from sim.simulate import predict
from traces.moe_overlap import pairs
from traces.ops import Phase, Stream
from traces.pipeline import layout_schedule
from traces.purpose import ExpertAllToAll

CONFIG = {
    "model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 1024, "experts": 16, "top_k": 4,
              "moe_ffn_hidden": 256, "shared_experts": 1, "dense_layers": 1, "bias": False},
    "parallel": {"dp": 8, "ep": 8, "global_batch": 32},
    "cluster": {"preset": "dgx-h100", "nodes": 1},
}
LAYOUTS = {
    "ep8": {},
    "ep16-2-nodes": {"dp": 16, "ep": 16, "global_batch": 64, "nodes": 2},
    "tp2-sp-ep4": {"tp": 2, "sp": True, "dp": 4, "ep": 4, "global_batch": 16},
    "pp2-vp2-ep4": {"pp": 2, "vp": 2, "schedule": "interleaved", "dp": 4, "ep": 4,
                    "global_batch": 16},
    "pp2-vp2-ep8-2-nodes": {"pp": 2, "vp": 2, "schedule": "interleaved", "dp": 8, "ep": 8,
                            "global_batch": 32, "nodes": 2},
}


def _run(layout: dict, on: bool):
    config = copy.deepcopy(CONFIG)
    parallel = dict(layout)
    config["cluster"]["nodes"] = parallel.pop("nodes", 1)
    config["parallel"].update(parallel, overlap_moe_comm=on)
    exp = experiment_from_dict(config)
    return exp, predict(exp, fold=True)[1]


@pytest.fixture(scope="module")
def runs() -> dict:
    return {name: (_run(layout, False), _run(layout, True)) for name, layout in LAYOUTS.items()}


def _measure(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _exposed(a2a: list[tuple[float, float]], busy: list[tuple[float, float]]) -> float:
    """The time inside `a2a` during which the compute stream runs nothing."""
    return _measure(a2a) - _measure([(max(s, a), min(e, b)) for a, b in _merged(a2a)
                                     for s, e in busy if min(e, b) > max(s, a)])


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_overlap_never_lengthens_a_step(runs: dict, name: str) -> None:
    (_, off), (_, on) = runs[name]
    assert on.step_time_s <= off.step_time_s * (1 + 1e-9)


def test_overlap_shortens_a_step_whose_all_to_alls_were_exposed(runs: dict) -> None:
    shorter = [name for name, ((_, off), (_, on)) in runs.items()
               if on.step_time_s < 0.97 * off.step_time_s]
    assert len(shorter) >= 3, shorter


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_hidden_all_to_all_time_is_at_most_the_paired_compute(runs: dict, name: str) -> None:
    """Per rank: exposed a2a >= a2a - compute of the paired actions (the only compute that
    runs beside an all-to-all); with no pipeline, the all-to-alls of the actions alone
    (F0 and the last B) are exposed whole."""
    (exp, on) = runs[name][1]
    layout = exp.layout
    schedule = layout_schedule(layout)
    for rank in on.plan.ranks:
        ops, starts, ends = on.plan.ops[rank], on.starts[rank], on.ends[rank]
        actions = schedule[layout.coords(rank).pp]
        paired = {(a.microbatch, a.kind) for i, j in pairs(actions)
                  for a in (actions[i], actions[j])}

        def in_pair(op, paired: set = paired) -> bool:
            return (op.microbatch, "F" if op.phase is Phase.FWD else "B") in paired

        a2a = [(starts[i], ends[i]) for i, op in enumerate(ops)
               if isinstance(op.purpose, ExpertAllToAll)]
        busy = [(starts[i], ends[i]) for i, op in enumerate(ops) if op.stream == Stream.COMPUTE]
        paired_compute = sum(ends[i] - starts[i] for i, op in enumerate(ops)
                             if op.stream == Stream.COMPUTE and op.microbatch is not None
                             and in_pair(op))
        assert a2a and all(op.stream == Stream.EP_COMM for op in ops
                           if isinstance(op.purpose, ExpertAllToAll))
        exposed = _exposed(a2a, busy)
        assert exposed >= _measure(a2a) - paired_compute - 1e-12
        if layout.pp == 1:
            alone = [(starts[i], ends[i]) for i, op in enumerate(ops)
                     if isinstance(op.purpose, ExpertAllToAll) and not in_pair(op)]
            assert alone and _exposed(alone, busy) == pytest.approx(_measure(alone),
                                                                    rel=1e-9, abs=1e-15)


def test_folded_equals_unfolded_with_overlap() -> None:
    exp, folded = _run(LAYOUTS["pp2-vp2-ep4"], True)
    unfolded = predict(exp, fold=False)[1]
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)


@pytest.mark.parametrize("name", ["ep8", "pp2-vp2-ep4"])
def test_the_search_screen_costs_the_all_to_alls_exposed_an_upper_bound(runs: dict,
                                                                         name: str) -> None:
    """The analytic screen builds its reduced plan with the all-to-alls inline (its reduced
    1F1B pipeline cannot pair): its step equals the estimate without the key, and bounds the
    simulated step with it from above no less than it bounds the one without; its memory
    holds the extra warm-up forward's activations (a pair holds two micro-batches)."""
    (exp_off, off), (exp_on, on) = runs[name]
    screen = Analytic(exp_on.model, exp_on.cluster, exp_on.profile)
    with_key, without = screen.estimate(exp_on.layout), screen.estimate(exp_off.layout)
    assert with_key.step_time_s == without.step_time_s
    assert with_key.step_time_s - on.step_time_s >= without.step_time_s - off.step_time_s
    assert with_key.peak_memory_bytes > without.peak_memory_bytes


@pytest.mark.parametrize("name", ["ep8", "pp2-vp2-ep4"])
def test_the_memory_curve_takes_each_paired_action_once(runs: dict, name: str) -> None:
    """A pair's actions run in alternating pieces; the report's memory curve counts each once,
    from its first piece to its last, and peaks at the memory model's figure for the
    schedule's actions."""
    exp, on = runs[name][1]
    schedule = layout_schedule(exp.layout)
    for rank in on.plan.ranks:
        pp = exp.layout.coords(rank).pp
        passes = pipeline_passes(on, rank)
        timed = timed_actions(passes)
        assert len({p.action for p in passes if p.action}) == len(timed) < len(passes)
        assert sorted(map(str, (a for a, _, _ in timed))) == sorted(map(str, schedule[pp]))
        peak = max(b for _, b in memory_timeline(exp.model, exp.layout, pp, timed))
        want = pp_rank_memory(exp.model, exp.layout, pp, schedule[pp]).total_bytes
        assert peak == pytest.approx(want, rel=1e-12)


def test_the_command_line_refuses_the_shipped_deepseek_example_with_the_key(tmp_path) -> None:
    """PP 16 under plain 1F1B: Megatron-Core needs virtual stages; one line, exit 2."""
    shipped = Path(__file__).parents[2] / "sim" / "examples" / "deepseek-v3-1024-h100.toml"
    text = shipped.read_text().replace('schedule = "1f1b"',
                                       'schedule = "1f1b"\noverlap_moe_comm = true')
    config = tmp_path / "on.toml"
    config.write_text(text)
    done = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(shipped.parents[2])})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("parasim: error: parallel.overlap_moe_comm: true at pp = 16 needs "
                           "schedule = \"interleaved\" (Megatron-Core requires virtual pipeline "
                           "stages when pp > 1) or \"dualpipev\" / \"dualpipe\" (DualPipe's "
                           "overlapped pairs)\n")


def test_the_compute_beside_an_all_to_all_pays_for_the_sms_it_holds(runs: dict) -> None:
    """A kernel runs on the SMs NCCL leaves it while an all-to-all moves (the interference
    model's one per channel, `GpuInterference.kernel_stretch` > 1 here): the same kernels take
    longer in all with the key, where all-to-alls now run beside compute, in every layout
    (issue 33: the compute a pair issues at the instant of its all-to-all, the whole of
    tp2-sp-ep4's, ran at full speed before)."""
    longer = []
    for name, ((exp, off), (_, on)) in runs.items():
        assert Analytic(exp.model, exp.cluster, exp.profile).interference.kernel_stretch > 1

        def busy(times) -> float:
            return sum(e - s for r in times.plan.ranks for op, s, e in
                       zip(times.plan.ops[r], times.starts[r], times.ends[r])
                       if op.kind == "compute")
        if busy(on) > busy(off) * (1 + 1e-6):
            longer.append(name)
    assert longer == list(runs), longer
