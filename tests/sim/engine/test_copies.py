"""The folded copies' shortcuts (`sim.engine.copies`) against lowering every copy one by one."""

import pytest

import sim.engine.lowering as lowering_module
from sim.config import experiment_from_dict
from sim.engine.copies import with_copies
from sim.engine.lowering import lower_communication
from traces.plan import build

CASES = {
    # TP 8 fills a server: its copies on other servers skip; DP and pipeline sends cross leaves
    "tp8-pp2-dp4-fat-tree": ({"tp": 8, "pp": 2, "dp": 4},
                             {"preset": "dgx-h100", "nodes": 8, "nodes_per_leaf": 2}),
    # TP 4: two TP groups per server (different local GPUs: lowered), pipeline inside a server
    "tp4-pp2-dp4-rail": ({"tp": 4, "pp": 2, "dp": 4},
                         {"preset": "dgx-h100", "nodes": 4, "fabric": "rail"}),
    # three tiers, pipeline stages on other pods
    "tp2-pp4-dp8-three-tier": ({"tp": 2, "pp": 4, "dp": 8},
                               {"preset": "dgx-a100", "nodes": 8, "nodes_per_leaf": 1,
                                "tiers": 3, "leaves_per_pod": 2}),
}


def _config(parallel, cluster):
    model = {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 32000}
    layout = {**parallel, "micro_batch": 1, "global_batch": 4 * parallel["dp"]}
    return experiment_from_dict({"model": model, "parallel": layout, "cluster": cluster})


@pytest.mark.parametrize("case", CASES)
def test_shortcuts_equal_every_copy_lowered(case, monkeypatch):
    exp = _config(*CASES[case])
    plan = build(exp.model, exp.layout, ranks=exp.layout.representatives())
    copied = []
    real_copy = lowering_module._copy
    monkeypatch.setattr(lowering_module, "_copy",
                        lambda *args: copied.append(args[-1]) or real_copy(*args))
    fast = lower_communication(plan, exp.cluster, exp.layout)
    fast_copies = len(copied)
    lowered, collective_images = [], []

    def every_collective(used, group, lowering, images, lower):
        lowered.append(len(images))
        collective_images.append(len(images))
        return with_copies(lowering, [lower(g) for g in images], used.links, used.capacity)

    def every_transfer(used, lowering, pairs, lower):
        lowered.append(len(pairs))
        return with_copies(lowering, [lower(a, b) for a, b in pairs], used.links,
                           used.capacity)

    monkeypatch.setattr(lowering_module, "collective_copies", every_collective)
    monkeypatch.setattr(lowering_module, "transfer_copies", every_transfer)
    slow = lower_communication(plan, exp.cluster, exp.layout)
    assert sum(lowered) > 0  # the case has copies to add ...
    if case.startswith("tp8"):  # TP groups filling servers the representatives do not use
        assert fast_copies < sum(collective_images)  # ... are not lowered
    assert fast.lowered == slow.lowered  # the same flows, counts, latencies and rates
