"""An overlap never lengthens a step (issue 32, must show; issue 33), over a small grid of
layouts (dp, tp with sp, pp with and without virtual stages, cp, ep, ZeRO 0-3) on one and two
DGX H100, with the interference model on: turning on each overlap key a layout allows gives a
step no longer than the same step without it (1e-9 relative), and exposes no more
communication. It holds because a kernel runs slower only while a transfer of its rank is in
flight (`sim.engine.running`): what an overlap costs the compute beside it is less than the
communication it stops exposing.

The rule, precisely, where it does not hold as a bare "never longer":
  - tp_comm_overlap cuts each GEMM into chunks, each its own kernel launch and its own
    collective: on these small models the chunks cost more than the overlap hides, so the
    step may grow, but by no more than the most kernel time it adds to a rank, and the
    exposed communication never grows;
  - one gradient bucket under a pipeline (25 MiB here): reducing it beside the last stage's
    last backward slows those kernels, on the pipeline's critical path, while without the
    overlap the reduction ran in the drain's bubble; the step grows by less than the kernel
    time the overlap adds to that stage, never without the interference model, and the
    exposed communication shrinks. A legitimate interference effect, not a scheduling one.
"""

from __future__ import annotations

import copy
from unittest.mock import patch

import pytest

from sim.config import experiment_from_dict
from sim.metrics import StepSummary
from sim.models.interference import NO_INTERFERENCE
from sim.simulate import predict

DENSE = {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 8192,
         "ffn": "swiglu", "ffn_hidden": 2816, "bias": False}
MOE = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 4096,
       "ffn": "swiglu", "ffn_hidden": 1024, "experts": 16, "top_k": 4,
       "moe_ffn_hidden": 256, "shared_experts": 1, "dense_layers": 1, "bias": False}
INTERLEAVED = {"schedule": "interleaved", "vp": 2}
BUCKET = 2**20
"""Gradient buckets of 1 MiB: several per stage of these small models, so that reducing
them during the backward (overlap_grad_reduce) or gathering them during the forward
(overlap_param_gather) has something to overlap."""

LAYOUTS: dict[str, tuple[dict, dict, int]] = {
    # name: (model, parallel, nodes)
    "dp8": (DENSE, {"dp": 8}, 1),
    "dp8-zero1": (DENSE, {"dp": 8, "zero": 1}, 1),
    "dp16-zero2-2-nodes": (DENSE, {"dp": 16, "zero": 2}, 2),
    "dp8-zero3": (DENSE, {"dp": 8, "zero": 3}, 1),
    "tp2-sp-dp4-zero1": (DENSE, {"tp": 2, "sp": True, "dp": 4, "zero": 1}, 1),
    "tp8-sp-dp2-zero1-2-nodes": (DENSE, {"tp": 8, "sp": True, "dp": 2, "zero": 1}, 2),
    "pp2-dp4": (DENSE, {"pp": 2, "dp": 4}, 1),
    "tp2-sp-pp2-vp2-dp2-zero1": (DENSE, {"tp": 2, "sp": True, "pp": 2, **INTERLEAVED,
                                         "dp": 2, "zero": 1}, 1),
    "tp2-sp-pp2-vp2-dp4-zero1-2-nodes": (DENSE, {"tp": 2, "sp": True, "pp": 2,
                                                 **INTERLEAVED, "dp": 4, "zero": 1}, 2),
    "cp2-dp4-zero1": (DENSE, {"cp": 2, "dp": 4, "zero": 1}, 1),
    "ep8": (MOE, {"dp": 8, "ep": 8}, 1),
    "ep16-zero1-2-nodes": (MOE, {"dp": 16, "ep": 16, "zero": 1}, 2),
    "tp2-sp-ep4": (MOE, {"tp": 2, "sp": True, "dp": 4, "ep": 4}, 1),
    "pp2-vp2-ep4": (MOE, {"pp": 2, **INTERLEAVED, "dp": 4, "ep": 4}, 1),
}


def allowed(parallel: dict) -> list[str]:
    """The overlap keys that change something in `parallel` (each key's own rule)."""
    keys = ["overlap_grad_reduce"] if parallel.get("dp", 1) > 1 else []
    if parallel.get("zero", 0) in (1, 2) and parallel.get("dp", 1) > 1:
        keys.append("overlap_param_gather")
    if parallel.get("sp"):
        keys.append("tp_comm_overlap")
    if parallel.get("schedule") == "interleaved":
        keys.append("overlap_p2p_comm")
    if parallel.get("ep", 1) > 1:
        keys.append("overlap_moe_comm")
    return keys


CASES = [(name, key) for name, (_, parallel, _) in LAYOUTS.items() for key in allowed(parallel)]


def summary(name: str, key: str, on: bool, *, interference: bool = True,
            bucket: int = BUCKET) -> StepSummary:
    """The step of layout `name` with `key` on or off."""
    model, parallel, nodes = LAYOUTS[name]
    config = {"model": copy.deepcopy(model),
              "parallel": {**parallel, "global_batch": parallel["dp"] * 4,
                           "bucket_bytes": bucket, key: on},
              "cluster": {"preset": "dgx-h100", "nodes": nodes}}
    exp = experiment_from_dict(config)
    assert exp.layout.world == 8 * nodes
    if interference:
        return predict(exp, fold=True)[0]
    with patch("sim.simulate.interference_for", lambda *_: NO_INTERFERENCE):
        return predict(exp, fold=True)[0]


def added_kernel_time(off: StepSummary, on: StepSummary) -> float:
    """The most kernel time the overlap adds to one rank."""
    before = {r.rank: r.compute_s for r in off.ranks}
    return max(r.compute_s - before[r.rank] for r in on.ranks)


def test_the_grid_covers_every_key_on_one_and_two_nodes() -> None:
    keys = {key for _, key in CASES}
    assert keys == {"overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                    "overlap_p2p_comm", "overlap_moe_comm"}
    for key in keys:
        assert {LAYOUTS[name][2] for name, k in CASES if k == key} == {1, 2}, key


@pytest.mark.parametrize(("name", "key"), [c for c in CASES if c[1] != "tp_comm_overlap"])
def test_an_overlap_never_lengthens_a_step(name: str, key: str) -> None:
    off, on = summary(name, key, False), summary(name, key, True)
    assert on.step_time_s <= off.step_time_s * (1 + 1e-9), (off.step_time_s, on.step_time_s)
    assert on.exposed_comm_s <= off.exposed_comm_s * (1 + 1e-9)


@pytest.mark.parametrize(("name", "key"), [c for c in CASES if c[1] == "tp_comm_overlap"])
def test_tp_comm_overlap_lengthens_a_step_by_no_more_than_its_chunks_kernel_time(
        name: str, key: str) -> None:
    off, on = summary(name, key, False), summary(name, key, True)
    assert on.exposed_comm_s <= off.exposed_comm_s * (1 + 1e-9)
    assert on.step_time_s - off.step_time_s <= max(0.0, added_kernel_time(off, on)) + \
        1e-9 * off.step_time_s


def test_one_bucket_under_a_pipeline_pays_the_interference_on_the_critical_path() -> None:
    """pp2-dp4, one 25 MiB bucket (module docstring): longer with the interference model, by
    less than the kernel time the overlap adds to the last stage; never longer without it;
    less exposed communication either way."""
    name, key, bucket = "pp2-dp4", "overlap_grad_reduce", 25 * 2**20
    off, on = (summary(name, key, v, bucket=bucket) for v in (False, True))
    assert off.step_time_s < on.step_time_s < off.step_time_s + added_kernel_time(off, on)
    assert on.exposed_comm_s < off.exposed_comm_s
    plain_off, plain_on = (summary(name, key, v, bucket=bucket, interference=False)
                           for v in (False, True))
    assert plain_on.step_time_s <= plain_off.step_time_s
