"""Folding over CP (`traces.cp_fold`, `sim.engine.cp_symmetry`) against the unfolded run:
the representatives' every op starts and ends as unfolded, and the step is the same."""

import pytest

from sim.config import experiment_from_dict
from sim.engine.cp_symmetry import cp_fold_step
from sim.report.words import words_for
from sim.simulate import predict


def experiment(tp: int, cp: int, pp: int, dp: int, *, cp_comm: str = "p2p",
               experts: int = 0, ep: int = 1, dropout: float = 0.0,
               network: str | None = None, per_node: int = 8):
    world = tp * cp * pp * dp
    model = {"layers": 4, "hidden": 512, "heads": 16, "seq_len": 1024, "vocab": 4096,
             "dropout": dropout}
    if experts:
        model |= {"experts": experts, "top_k": 2}
    config = {"model": model,
              "parallel": {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "micro_batch": 1,
                           "global_batch": 4 * dp, "cp_comm": cp_comm, "ep": ep,
                           "sp": tp > 1},
              "cluster": {"preset": "dgx-h100", "nodes": max(1, world // per_node),
                          "gpus_per_node": min(per_node, world), "fabric": "rail"}}
    if network is not None:
        config["sim"] = {"network": network}
    return experiment_from_dict(config)


CASES = [  # (experiment's arguments, the representatives)
    (dict(tp=1, cp=2, pp=1, dp=1), [0]),                          # in one server: one rank
    (dict(tp=2, cp=4, pp=2, dp=1), [0, 8]),                       # one per pipeline stage
    (dict(tp=1, cp=4, pp=1, dp=2, cp_comm="all_gather"), [0]),
    (dict(tp=2, cp=2, pp=2, dp=2), [0, 8]),
    (dict(tp=4, cp=4, pp=1, dp=1), [0, 4]),                       # TP·CP 16 over 2 servers
    (dict(tp=4, cp=4, pp=2, dp=1, cp_comm="all_gather"), [0, 4, 16, 20]),
    (dict(tp=2, cp=8, pp=1, dp=1), [0, 2, 4, 6]),                 # shift by 4 only
    (dict(tp=1, cp=4, pp=2, dp=1, network="analytic"), [0, 4]),
    (dict(tp=4, cp=4, pp=1, dp=2, network="analytic"), [0, 4]),
    (dict(tp=1, cp=4, pp=1, dp=2, experts=8, ep=4), [0]),          # EP over CP x DP
    (dict(tp=2, cp=4, pp=2, dp=1, experts=8, ep=8), [0, 8]),
    (dict(tp=1, cp=4, pp=1, dp=1, dropout=0.1), [0]),  # draws are counts, alike on CP ranks
    (dict(tp=2, cp=4, pp=1, dp=1, experts=8, ep=4), [0, 2, 4, 6]),  # EP groups not cp-closed
]


@pytest.mark.parametrize(("kwargs", "reps"), CASES)
def test_folded_over_cp_equals_the_unfolded_run(kwargs, reps):
    exp = experiment(**kwargs)
    unfolded, every = predict(exp, fold=False)
    folded, some = predict(exp, fold=True)
    assert sorted(some.plan.ops) == reps
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    for r in reps:
        for mine, theirs in ((some.starts[r], every.starts[r]), (some.ends[r], every.ends[r])):
            assert len(mine) == len(theirs)
            for a, b in zip(mine, theirs, strict=True):
                assert a == pytest.approx(b, rel=1e-9, abs=1e-15)
    assert some.plan.num_ops() == sum(len(every.plan.ops[r]) for r in reps)


def test_a_ring_over_servers_of_their_own_keeps_folding_by_cp():
    """TP 8 · CP 2: the cp shift by one moves whole servers; not folded (cp_symmetry)."""
    exp = experiment(8, 2, 1, 1)
    assert cp_fold_step(exp.cluster, exp.layout) == 0
    _, some = predict(exp)
    assert sorted(some.plan.ops) == [0, 8]


@pytest.mark.parametrize(("tp", "cp", "per_node", "nodes", "step"), [
    (2, 4, 8, 1, 1),    # the ring in one server
    (2, 8, 8, 2, 4),    # two servers: the shift by one server, 4 CP ranks
    (4, 4, 8, 2, 2),
    (1, 3, 8, 3, 0),    # TP·CP 3 cuts servers of 8
    (8, 2, 8, 2, 0),    # a server per CP rank (docstring)
])
def test_the_cp_step_moves_by_whole_servers(tp, cp, per_node, nodes, step):
    exp = experiment_from_dict({
        "model": {"layers": 2, "hidden": 512, "heads": 16, "seq_len": 1536, "vocab": 4096},
        "parallel": {"tp": tp, "cp": cp, "dp": per_node * nodes // (tp * cp),
                     "global_batch": 64},
        "cluster": {"preset": "dgx-h100", "nodes": nodes, "gpus_per_node": per_node,
                    "fabric": "rail"}})
    assert cp_fold_step(exp.cluster, exp.layout) == step


@pytest.mark.parametrize(("kwargs", "stands_for", "fold"), [
    (dict(tp=2, cp=4, pp=2, dp=1), 8, "tp 2 × cp 4 × dp 1"),
    (dict(tp=2, cp=8, pp=1, dp=1), 4, "tp 2 × cp 2 × dp 1"),   # step 4: cp 0 and 4 alike
])
def test_the_report_says_what_a_rank_folded_over_cp_stands_for(kwargs, stands_for, fold):
    exp = experiment(**kwargs)
    summary, times = predict(exp)
    words = words_for(exp, times)
    assert (words.stands_for, words.fold) == (stands_for, fold)
    assert set(times.fold.class_sizes().values()) == {stands_for}


def fat_tree(tp: int, cp: int, pp: int, dp: int, gpus: int, per_leaf: int, **fabric):
    """A small fat tree of `gpus`-GPU servers (a NIC each GPU), `per_leaf` servers a leaf."""
    world = tp * cp * pp * dp
    return experiment_from_dict({
        "model": {"layers": 4, "hidden": 512, "heads": 16, "seq_len": 1024, "vocab": 4096},
        "parallel": {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "micro_batch": 1,
                     "global_batch": 4 * dp, "sp": tp > 1},
        "cluster": {"preset": "dgx-h100", "nodes": world // gpus, "gpus_per_node": gpus,
                    "nics_per_node": gpus, "fabric": "fat-tree", "nodes_per_leaf": per_leaf,
                    **fabric}})


def same_ops(exp, reps) -> None:
    """Folded, `exp` simulates `reps`, whose ops start and end exactly as unfolded."""
    unfolded, every = predict(exp, fold=False)
    folded, some = predict(exp, fold=True)
    assert sorted(some.plan.ops) == reps
    assert folded.step_time_s == unfolded.step_time_s
    for r in reps:
        assert (some.starts[r], some.ends[r]) == (every.starts[r], every.ends[r])


@pytest.mark.parametrize(("args", "fabric", "step", "reps"), [
    # CP 8 over 4 servers of 2 GPUs, 2 a leaf: the block spans 2 leaves; a leaf is 4 CP ranks
    ((1, 8, 1, 1, 2, 2), {}, 4, [0, 1, 2, 3]),
    ((1, 8, 1, 2, 2, 2), {}, 4, [0, 1, 2, 3]),                     # DP across the blocks
    ((1, 4, 2, 1, 2, 1), {}, 2, [0, 1, 4, 5]),                     # a leaf per server
    # three tiers, pods of 2 leaves: the pipeline and DP cross pods by the cores
    ((1, 4, 2, 2, 2, 1), {"tiers": 3, "leaves_per_pod": 2}, 2, [0, 1, 8, 9]),
])
def test_a_block_over_whole_leaves_folds_by_a_leaf(args, fabric, step, reps):
    """Leaves that do not hold a TP·CP block: the shift by a leaf's CP ranks, exact."""
    exp = fat_tree(*args, **fabric)
    assert cp_fold_step(exp.cluster, exp.layout) == step
    same_ops(exp, reps)


@pytest.mark.parametrize("fabric", [
    {"routing": "ecmp"},            # a hash of the NICs' numbers: no shift of routes
    {"routing": "adaptive"},        # routes by the loads placed before
    {"oversubscription": 4 / 3},    # 3 uplinks: g mod 3 moves under a shift by 4 NICs
    {"nodes_per_leaf": 3},          # leaves of 3 servers cut the block of 4
])
def test_a_fat_tree_not_alike_under_the_leaf_shift_is_not_folded_by_it(fabric):
    exp = fat_tree(1, 8, 1, 1, 2, **{"per_leaf": 2, **fabric})
    assert cp_fold_step(exp.cluster, exp.layout) == 0
    unfolded, _ = predict(exp, fold=False)
    folded, _ = predict(exp)
    assert folded.step_time_s == unfolded.step_time_s


def test_the_leaf_shift_forced_where_leaves_cut_the_block_is_wrong(monkeypatch):
    """Why the fold is refused: servers 0-2 on leaf 0 and 3 on leaf 1; forced to fold by 4,
    the step differs from the unfolded run's."""
    exp = fat_tree(1, 8, 1, 1, 2, 3)
    unfolded, _ = predict(exp, fold=False)
    monkeypatch.setattr("sim.simulate.cp_fold_step", lambda cluster, layout: 4)
    forced, some = predict(exp)
    assert sorted(some.plan.ops) == [0, 1, 2, 3]
    assert forced.step_time_s != unfolded.step_time_s


@pytest.mark.parametrize(("tp", "cp", "nodes", "step"), [
    (2, 8, 2, 4),     # 2 servers in a leaf of 4: the shift by one server
    (4, 16, 8, 8),    # Folding Table 5 128K's block: 8 servers, 2 leaves; a leaf is 8 CP ranks
    (2, 16, 4, 4),    # 4 servers, one leaf: the shift by one server still
    (8, 8, 8, 0),     # a server per CP rank: refused (module docstring)
])
def test_the_cp_step_on_dgx_h100_leaves(tp, cp, nodes, step):
    """The dgx-h100 fat tree (4 servers a leaf, destination-mod-k)."""
    exp = experiment_from_dict({
        "model": {"layers": 2, "hidden": 512, "heads": 16, "seq_len": 2048, "vocab": 4096},
        "parallel": {"tp": tp, "cp": cp, "dp": 8 * nodes // (tp * cp), "global_batch": 64},
        "cluster": {"preset": "dgx-h100", "nodes": nodes, "fabric": "fat-tree"}})
    assert exp.cluster.fabric.spec.nodes_per_leaf == 4
    assert cp_fold_step(exp.cluster, exp.layout) == step
