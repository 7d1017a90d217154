"""schedule = "dualpipe" built directly (issue 33): pp ranks, each holding stage r of the
first copy and stage pp - 1 - r of the second (deepseek-ai/DualPipe's
examples/example_dualpipe.py, commit 7cb1e5e6), micro-batches both ways, sends between real
neighbours (the middle pair's too), gradients summed over the pair (r, pp - 1 - r) x DP.

Against the stand-in it replaces (DualPipeV on pp/2 ranks and 2 dp replicas, vp = 2, which
ran, rank for rank, the same steps: tests/traces/test_dualpipe.py): the same compute ops and
the same gradient collectives on every rank, the middle pair's 2m messages more and nothing
else, and a step longer by no more than those messages take. The executor runs it:
tests/executor/test_dualpipe_run.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from sim.config import Experiment, experiment_from_dict
from sim.models.memory import memory_by_pp_rank, peak_in_flight
from sim.simulate import predict
from traces.dualpipe_order import dualpipe_model_order, dualpipe_order
from traces.errors import ConfigError
from traces.layout import Layout, Schedule
from traces.moe_overlap import dualpipe_pairs
from traces.ops import Op, OpKind, Stream
from traces.pipeline import Action, layout_schedule
from traces.plan import build
from traces.zero_bubble import idle_and_end

CONFIG = {
    "model": {"layers": 8, "hidden": 1024, "heads": 8, "seq_len": 1024, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 2048, "experts": 8, "top_k": 2,
              "moe_ffn_hidden": 512, "dense_layers": 0, "bias": False,
              "tied_embeddings": False},
    "parallel": {"pp": 4, "schedule": "dualpipe", "dp": 2, "ep": 2, "global_batch": 16,
                 "zero": 1},
    "cluster": {"preset": "dgx-h800", "nodes": 1},
}
PP, DP = 4, 2


def _config(**parallel: object) -> dict:
    config = copy.deepcopy(CONFIG)
    config["parallel"].update(parallel)
    return config


def _stand_in(layout: Layout) -> Layout:
    """The DualPipeV layout main simulated DualPipe as (pp/2 ranks, 2 dp replicas, vp 2)."""
    return replace(layout, pp=layout.pp // 2, dp=2 * layout.dp, vp=2,
                   schedule=Schedule.DUALPIPEV)


def _both() -> tuple[Experiment, Experiment]:
    direct = experiment_from_dict(_config())
    return direct, replace(direct, layout=_stand_in(direct.layout))


def _stand_in_rank(direct: Layout, stand_in: Layout, rank: int) -> int:
    """The stand-in rank running `rank`'s steps: rank h = min(r, pp - 1 - r) of the replica
    dp (first half of the ranks) or dp + DP (second half)."""
    c = direct.coords(rank)
    second = c.pp >= direct.pp // 2
    return stand_in.rank(tp=c.tp, cp=c.cp, dp=c.dp + direct.dp * second,
                         pp=min(c.pp, direct.pp - 1 - c.pp))


@pytest.mark.parametrize(("layers", "parallel", "message"), [
    (6, {"pp": 3, "global_batch": 12}, "parallel.pp: 3; dualpipe (deepseek-ai/DualPipe) needs"),
    (8, {"pp": 8, "dp": 1, "global_batch": 14}, "parallel: 14 micro-batches; dualpipe"),
    (8, {"global_batch": 14}, "parallel: 7 micro-batches; dualpipe"),
    (8, {"vp": 2}, "parallel.vp: 2; dualpipe holds two copies"),
    (8, {"pp_first_layers": 1}, "parallel.schedule: \"dualpipe\" needs an even split"),
    (8, {"zero": 3, "dp": 1, "ep": 1, "global_batch": 8}, "parallel.zero: 3 with schedule"),
])
def test_deepseeks_rules_in_one_line(layers: int, parallel: dict, message: str) -> None:
    config = _config(**parallel)
    config["model"]["layers"] = layers
    with pytest.raises(ConfigError) as err:
        experiment_from_dict(config)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_layout_is_as_written_and_each_stage_is_summed_over_its_pair() -> None:
    """pp ranks, no stand-in and no note; the gradient group of rank r is the DP group of r
    and of pp - 1 - r (the example's `p0.grad += p1all[pp_size - 1 - rank]`), 2 dp ranks."""
    exp = experiment_from_dict(_config())
    layout = exp.layout
    assert (layout.pp, layout.dp, layout.schedule, exp.warnings) == (
        PP, DP, Schedule.DUALPIPE, ())
    assert layout.data_degree == 2 * DP
    for rank in range(layout.world):
        r = layout.coords(rank).pp
        assert layout.stages_of_rank(r) == sorted((r, PP - 1 - r))
        assert sorted({layout.coords(g).pp for g in layout.data_group(rank)}) == sorted(
            {r, PP - 1 - r}) and len(layout.data_group(rank)) == 2 * DP


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 10), (8, 16), (8, 20)])
def test_the_order_by_model_stage_is_the_repositorys(pp: int, m: int) -> None:
    """The plan's order is `dualpipe_order` (the repository's, re-enacted in
    tests/traces/test_dualpipe.py) with direction 1's stage pp + s named s: rank r runs model
    stage r on micro-batches 0 .. m/2 - 1 and pp - 1 - r on the rest; every rank holds pp + 1
    chunk passes at its peak, the README's."""
    model = dualpipe_model_order(pp, m)
    for r, steps in dualpipe_order(pp, m).items():
        assert model[r] == [(s % pp, k, i) for s, k, i in steps]
        assert {(s, i < m // 2) for s, _, i in model[r]} == {(r, True), (pp - 1 - r, False)}
        assert peak_in_flight([Action(*s) for s in model[r]]) == pp + 1


@pytest.mark.parametrize("pp", [4, 6, 8])
@pytest.mark.parametrize("ratio", [2.5, 3.0])
def test_the_bubble_by_model_stage_is_the_readmes(pp: int, ratio: float) -> None:
    """(PP/2 - 1)(F&B + B - 3W) with F = B = W = 1 (B the full backward, 2) and F&B = ratio,
    the middle ranks' first pair not overlapped (dualpipe.py's step 4): DualPipe's README."""
    m = 2 * pp + 2 * (pp % 4 == 2)
    schedule = {r: [Action(*s) for s in steps]
                for r, steps in dualpipe_model_order(pp, m).items()}
    groups = {r: dualpipe_pairs(actions) for r, actions in schedule.items()}
    assert [len(groups[r]) for r in range(pp)] == [len(groups[pp - 1 - r]) for r in range(pp)]
    busy, end = idle_and_end(schedule, {"F": 1.0, "B": 1.0, "W": 1.0, "FB": ratio},
                             (frozenset({0}), frozenset({pp - 1})), groups)
    bubble = max(max(end.values()) - b for b in busy.values())
    assert bubble == pytest.approx((pp / 2 - 1) * (ratio + 2 - 3), rel=1e-12)


def _compute(ops: tuple[Op, ...]) -> list[tuple[object, ...]]:
    return [(o.name, o.layer, o.flops, o.mem_bytes, o.phase) for o in ops
            if o.kind is OpKind.COMPUTE and o.stream is Stream.COMPUTE]


def _collectives(ops: tuple[Op, ...]) -> list[tuple[object, ...]]:
    return [(str(o.kind), o.name, o.size_bytes, len(o.group)) for o in ops
            if o.group and len(o.group) > 1]


def _messages(ops: tuple[Op, ...]) -> list[Op]:
    return [o for o in ops if o.kind in (OpKind.SEND, OpKind.RECV)]


def test_the_plan_is_the_stand_ins_but_the_middle_pairs_messages() -> None:
    """Every rank: the stand-in's compute ops and gradient collectives in the same order
    (the pair x DP group has the stand-in's 2 dp ranks); the same messages but on the middle
    ranks pp/2 - 1 and pp/2, which send each other m/2 activations and m/2 gradients each way
    (2m messages more, of b·s·h/t bytes each) where the stand-in's V turned on one GPU."""
    direct, stand_in = _both()
    d, s = direct.layout, stand_in.layout
    plan_d, plan_s = build(direct.model, d), build(stand_in.model, s)
    m = d.num_microbatches
    size = direct.model.activation_bytes(d.micro_batch) / d.tp
    for rank in range(d.world):
        mine, theirs = plan_d.ops[rank], plan_s.ops[_stand_in_rank(d, s, rank)]
        assert _compute(mine) == _compute(theirs)
        assert _collectives(mine) == _collectives(theirs)
        r = d.coords(rank).pp
        middle = r in (PP // 2 - 1, PP // 2)
        mirror = PP - 1 - r
        extra = [o for o in _messages(mine) if d.coords(o.peer).pp == mirror and middle]
        assert len(_messages(mine)) - len(_messages(theirs)) == (2 * m if middle else 0)
        assert Counter(o.kind for o in extra) == (
            {OpKind.SEND: m, OpKind.RECV: m} if middle else {})
        assert all(o.size_bytes == size for o in extra)


def test_each_rank_holds_two_copies_stages_states_and_the_stand_ins_memory() -> None:
    """Parameters: 1F1B's ranks r and pp - 1 - r together (the README's 2x); ZeRO-1 shards
    them over the pair x DP as the stand-in over its 2 dp; activations, the stand-in's."""
    direct, stand_in = _both()
    one = experiment_from_dict(_config(schedule="1f1b", zero=0))
    flat = experiment_from_dict(_config(zero=0))
    single = memory_by_pp_rank(one.model, one.layout, layout_schedule(one.layout))
    dual = memory_by_pp_rank(flat.model, flat.layout, layout_schedule(flat.layout))
    assert [m.params_bytes for m in dual] == [
        single[r].params_bytes + single[PP - 1 - r].params_bytes for r in range(PP)]
    mine = memory_by_pp_rank(direct.model, direct.layout, layout_schedule(direct.layout))
    theirs = memory_by_pp_rank(stand_in.model, stand_in.layout,
                               layout_schedule(stand_in.layout))
    for r in range(PP):
        h = theirs[min(r, PP - 1 - r)]
        assert (mine[r].params_bytes, mine[r].grads_bytes, mine[r].optimizer_bytes,
                mine[r].activations_bytes) == (h.params_bytes, h.grads_bytes,
                                               h.optimizer_bytes, h.activations_bytes)


def test_the_step_is_the_stand_ins_plus_at_most_the_middle_messages() -> None:
    """The step exceeds the stand-in's, by no more than the middle messages of one middle
    rank take end to end (the compute and the collectives being the same)."""
    direct, stand_in = _both()
    mine, times = predict(direct)
    theirs, _ = predict(stand_in)
    d = direct.layout
    rank = d.rank(pp=PP // 2 - 1)
    middle = sum(e - s for op, s, e in zip(times.plan.ops[rank], times.starts[rank],
                                           times.ends[rank], strict=True)
                 if op.kind is OpKind.SEND and d.coords(op.peer).pp == PP // 2)
    assert 0 < mine.step_time_s - theirs.step_time_s <= middle


def test_the_command_line_simulates_it_as_written(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    config = tmp_path / "dualpipe.toml"
    config.write_text("".join(f"[{table}]\n" + "".join(f"{k} = {_toml(v)}\n"
                                                       for k, v in CONFIG[table].items())
                              for table in ("model", "parallel", "cluster")))
    done = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--json"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0 and done.stderr == ""
    layout = json.loads(done.stdout)["layout"]
    assert (layout["schedule"], layout["pp"], layout["dp"]) == ("dualpipe", PP, DP)


def _toml(value: object) -> str:
    return f"\"{value}\"" if isinstance(value, str) else str(value).lower() \
        if isinstance(value, bool) else str(value)


def test_the_shipped_deepseek_example_is_dualpipe_on_2048_h800() -> None:
    """sim/examples/deepseek-v3-2048-h800.toml: the report's PP16 DualPipe, EP64, DP128 on
    256 nodes of 8 H800, as written; its pairs' all-to-all holds DeepSeek's 20 SMs."""
    from sim.config import load_experiment
    from traces.moe_overlap import comm_sms

    exp = load_experiment(Path(__file__).parents[2] / "sim" / "examples"
                          / "deepseek-v3-2048-h800.toml")
    layout = exp.layout
    assert (layout.pp, layout.dp, layout.ep, layout.schedule, exp.cluster.num_devices) == (
        16, 128, 64, Schedule.DUALPIPE, 2048)
    assert exp.warnings == () and comm_sms(layout) == 20


@pytest.mark.parametrize("parallel", [
    {}, {"pp": 8, "dp": 1, "ep": 1, "global_batch": 16, "zero": 0}, {"zero": 2},
    {"overlap_moe_comm": True}, {"tp": 2, "sp": True, "dp": 1, "ep": 1, "global_batch": 8},
    {"cp": 2, "dp": 1, "ep": 1, "global_batch": 8}])
def test_folded_equals_unfolded(parallel: dict) -> None:
    """One rank per pipeline rank stands for its DP replicas: the pair x DP gradient group
    joins two representatives, as the tied-embedding group does elsewhere."""
    exp = experiment_from_dict(_config(**parallel))
    assert predict(exp)[0].step_time_s == pytest.approx(
        predict(exp, fold=False)[0].step_time_s, rel=1e-9)


def test_tied_embeddings_are_one_matrix_per_rank_and_summed_over_the_pair() -> None:
    """Tied: ranks 0 and pp - 1 hold the embedding and the output layer on one GPU (DeepSeek-V3
    report §2.2's shared placement), so no embedding all-reduce; their gradient is summed
    over the pair x DP with the buckets; the states equal the stand-in's (its rank 0 holds
    the same two stages)."""
    config = _config(zero=0)
    config["model"]["tied_embeddings"] = True
    direct = experiment_from_dict(config)
    stand_in = replace(direct, layout=_stand_in(direct.layout))
    plan = build(direct.model, direct.layout)
    assert not any(o.name == "embedding_grads" for ops in plan.ops.values() for o in ops)
    mine = memory_by_pp_rank(direct.model, direct.layout)
    theirs = memory_by_pp_rank(stand_in.model, stand_in.layout)
    assert [m.params_bytes for m in mine] == [
        theirs[min(r, PP - 1 - r)].params_bytes for r in range(PP)]
    assert mine[0].params_bytes == mine[PP - 1].params_bytes
