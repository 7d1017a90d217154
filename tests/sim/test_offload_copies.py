"""Activation CPU offloading's copies as plan ops (`traces.plan.offload`): exact bytes and
dependencies, the simulated step equal to the closed form (`traces.cpu_offload.micro_batch_s`)
where the copies outlast the compute, and no offload leaving the plan as it was."""

from __future__ import annotations

import copy
import tomllib
from typing import Any

import pytest

from sim.config import example_path, experiment_from_dict
from sim.models.host_link import cluster_host_Bps
from sim.simulate import predict
from traces.cpu_offload import NVLINK_C2C_BPS, OffloadPlan, micro_batch_s, windows
from traces.errors import ConfigError
from traces.ops import Op, Phase, Stream
from traces.plan import build
from traces.purpose import HostCopy, Unit
from traces.stored_activations import activation_bytes_per_layer

LAYERS = 8


def _config(offload: int = 0, **cluster: object) -> dict[str, Any]:
    """Llama 3 70B's shape cut to 8 layers, TP 8 without SP on one DGX H100, two
    micro-batches: no communication beside the compute stream (no SP or DP gradients), so
    a plain step is one chain of ops."""
    data = tomllib.loads(example_path("llama3-70b-h100.toml").read_text())
    data["model"]["layers"] = LAYERS
    data["parallel"].update({"tp": 8, "cp": 1, "pp": 1, "vp": 1, "dp": 1, "zero": 0,
                             "sp": False, "schedule": "1f1b", "global_batch": 2})
    if offload:
        data["parallel"]["cpu_offloading_num_layers"] = offload
    data["cluster"].update({"nodes": 1, **cluster})
    return copy.deepcopy(data)


def _copies(ops: tuple[Op, ...], stream: Stream) -> list[Op]:
    return [op for op in ops if op.stream == stream]


def test_plan_holds_each_copy_with_its_exact_bytes_and_waits() -> None:
    exp = experiment_from_dict(_config(offload=5))
    ops = build(exp.model, exp.layout, ranks=[0]).ops[0]
    size = activation_bytes_per_layer(exp.model, exp.layout)
    # Korthikanti's per-layer bytes at TP 8 without SP, SwiGLU f = 28672, GQA 8/64, no
    # dropout: s·b·h · (8 + (4 + 4·8/64 + 6·28672/8192) / 8)
    assert size == 8192 * 8192 * (8 + (4 + 0.5 + 6 * 28672 / 8192) / 8)
    d2h, h2d = _copies(ops, Stream.D2H), _copies(ops, Stream.H2D)
    assert [(op.layer, op.microbatch) for op in d2h] == [(i, m) for m in (0, 1) for i in range(5)]
    assert [(op.layer, op.microbatch) for op in h2d] == [(i, m) for m in (0, 1)
                                                        for i in reversed(range(5))]
    for op in d2h + h2d:
        assert op.size_bytes == size
        assert op.purpose == HostCopy(Unit.of_layer(op.layer), op.stream == Stream.H2D)
    w = windows(LAYERS, 5)
    assert w == (1, 3, 5, 6, 7)  # 8 // 5 = 1 layer a window, the first 8 % 5 = 3 two
    index = {id(op): i for i, op in enumerate(ops)}

    def compute(mb: int, phase: Phase, layer: int) -> list[int]:
        return [j for j, o in enumerate(ops) if o.stream == Stream.COMPUTE and
                o.layer == layer and o.phase is phase and o.microbatch == mb]

    for op in d2h:  # after layer 0's (offload 0) or layer w[j - 1]'s last forward op
        j, mb = op.layer, op.microbatch
        (dep,) = op.deps
        assert dep == compute(mb, Phase.FWD, 0 if j == 0 else w[j - 1])[-1]
        # the compute op after layer w[j]'s forward waits for it
        nxt = next(i for i in range(compute(mb, Phase.FWD, w[j])[-1] + 1, len(ops))
                   if ops[i].stream == Stream.COMPUTE)
        assert index[id(op)] in ops[nxt].deps
    for op in h2d:  # after the compute op before layer w[j]'s backward
        j, mb = op.layer, op.microbatch
        start = compute(mb, Phase.BWD, w[j])[0]
        gate = max(i for i in range(start) if ops[i].stream == Stream.COMPUTE)
        assert op.deps == (gate,)
        waiter = compute(mb, Phase.BWD, w[j - 1] if j else 0)[0]
        assert index[id(op)] in ops[waiter].deps


def test_zero_offload_leaves_the_plan_as_it_was() -> None:
    plain = experiment_from_dict(_config())
    zero = experiment_from_dict(_config(offload=0))
    a = build(plain.model, plain.layout, ranks=[0]).ops[0]
    assert not any(op.stream in (Stream.D2H, Stream.H2D) for op in a)
    assert a == build(zero.model, zero.layout, ranks=[0]).ops[0]


def test_host_link_of_the_presets() -> None:
    h100 = experiment_from_dict(_config())
    assert cluster_host_Bps(h100.cluster) == 64e9  # PCIe 5.0 x16 per direction (preset)
    data = _config()
    data["cluster"].update({"preset": "gb200-nvl72", "nodes": 1})
    data["cluster"].pop("fabric", None)
    data["parallel"].update({"dp": 9, "global_batch": 9})  # 72 GPUs of one NVL72 rack
    assert cluster_host_Bps(experiment_from_dict(data).cluster) == NVLINK_C2C_BPS


def _points(ops: tuple[Op, ...], starts: list[float], ends: list[float], mb: int
            ) -> tuple[list[float], list[float], tuple[float, float], tuple[float, float]]:
    """A plain run's per-layer forward and backward seconds, the head's and the embedding's,
    of micro-batch `mb`, read off its compute stream (one chain: world 1 per TP group)."""
    compute = [i for i, op in enumerate(ops) if op.stream == Stream.COMPUTE and
               op.microbatch == mb and op.phase in (Phase.FWD, Phase.BWD)]

    def span(phase: Phase, layer: int | None = None) -> tuple[float, float]:
        chosen = [i for i in compute if ops[i].phase is phase and
                  (layer is None or ops[i].layer == layer)]
        return starts[chosen[0]], ends[chosen[-1]]

    f0, f1 = span(Phase.FWD)
    b0, b1 = span(Phase.BWD)
    lf = [span(Phase.FWD, i) for i in range(LAYERS)]
    lb = [span(Phase.BWD, i) for i in range(LAYERS)]
    for i in range(LAYERS - 1):  # the layers follow each other on the stream
        assert lf[i][1] == pytest.approx(lf[i + 1][0], abs=1e-12)
        assert lb[i + 1][1] == pytest.approx(lb[i][0], abs=1e-12)
    fwd = [b - a for a, b in lf]
    bwd = [b - a for a, b in lb]
    return fwd, bwd, (f1 - lf[-1][1], lb[-1][0] - b0), (lf[0][0] - f0, b1 - lb[0][1])


@pytest.mark.parametrize("offload,link", [(5, "2GB/s"), (7, "8GB/s"), (3, "4GB/s")])
def test_exposed_copy_time_is_the_closed_form(offload: int, link: str) -> None:
    plain = experiment_from_dict(_config(pcie_bandwidth=link))
    off = experiment_from_dict(_config(offload=offload, pcie_bandwidth=link))
    s0, t0 = predict(plain)
    s1, _ = predict(off)
    rank = t0.plan.ranks[0]
    ops = t0.plan.ops[rank]
    size = activation_bytes_per_layer(off.model, off.layout)
    host = OffloadPlan(offload, size, cluster_host_Bps(off.cluster))
    assert host.transfer_s > 0.01  # a layer's copy outlasts a layer's compute
    exposed = 0.0
    for mb in (0, 1):
        fwd, bwd, head, embed = _points(ops, t0.starts[rank], t0.ends[rank], mb)
        assert fwd[0] < host.transfer_s
        exposed += (micro_batch_s(fwd, bwd, host, head, embed)
                    - micro_batch_s(fwd, bwd, OffloadPlan(0, size, 1.0), head, embed))
    assert exposed > 0.05
    assert s1.step_time_s - s0.step_time_s == pytest.approx(exposed, rel=1e-9)
    # the copies stall compute with data moving: exposed communication, not compute
    assert s1.exposed_comm_s - s0.exposed_comm_s == pytest.approx(exposed, rel=1e-9)
    assert s1.compute_s == pytest.approx(s0.compute_s, rel=1e-12)


def test_fast_link_hides_the_copies() -> None:
    """At NVLink-C2C's 450 GB/s a layer's copy (1.7 ms) is shorter than its forward (4.6 ms):
    the copies overlap compute entirely and the step is the plain one, to the bit."""
    link = {"pcie_bandwidth": "450GB/s"}
    plain = experiment_from_dict(_config(**link))
    off = experiment_from_dict(_config(offload=6, **link))
    assert predict(off)[0].step_time_s == predict(plain)[0].step_time_s


def test_no_host_link_is_refused_in_one_line() -> None:
    from sim.models.compute import ComputeModel
    exp = experiment_from_dict(_config(offload=2))
    op = next(o for o in build(exp.model, exp.layout, ranks=[0]).ops[0]
              if o.stream == Stream.D2H)
    with pytest.raises(ConfigError, match="cpu_offloading_num_layers: the cluster has no host"):
        ComputeModel(exp.cluster.accelerator, exp.profile).duration(op)


SMALL = """
[model]
layers = 8
hidden = 4096
heads = 32
seq_len = 4096
vocab = 32000
ffn = "swiglu"
ffn_hidden = 11008
norm = "rmsnorm"
position = "rope"
bias = false

[parallel]
tp = 8
sp = true
global_batch = 2
cpu_offloading_num_layers = 4

[cluster]
preset = "dgx-h100"
nodes = 1
"""


def test_report_and_trace_show_the_copies(tmp_path) -> None:
    """The report renders the copy lanes (a copy has no collective to look up: it failed on
    the lookup before), and the Chrome trace holds the copy streams."""
    from sim.cli import main
    config = tmp_path / "offload.toml"
    config.write_text(SMALL)
    report, trace = tmp_path / "step.html", tmp_path / "step.json"
    assert main(["simulate", str(config), "--report", str(report), "--trace", str(trace)]) == 0
    assert report.stat().st_size > 0
    text = trace.read_text()
    assert "d2h" in text and "h2d" in text


def test_copies_run_on_copy_engines_unstretched() -> None:
    """A slow rank's kernels take longer (`[cluster] jitter`), its host copies do not: they
    run on the copy engines at the host link's rate, whatever the SMs do."""
    exp = experiment_from_dict(_config(offload=3, pcie_bandwidth="8GB/s", jitter=0.05))
    plain = experiment_from_dict(_config(offload=3, pcie_bandwidth="8GB/s"))
    _, slow = predict(exp)
    _, ideal = predict(plain)
    rank = slow.plan.ranks[0]
    ops = slow.plan.ops[rank]
    size = activation_bytes_per_layer(exp.model, exp.layout)
    kernels = [i for i, op in enumerate(ops) if op.stream == Stream.COMPUTE and op.gemm][:1]
    for i in kernels:  # the kernels are stretched ...
        assert slow.ends[rank][i] - slow.starts[rank][i] > \
            1.01 * (ideal.ends[rank][i] - ideal.starts[rank][i])
    copies = [i for i, op in enumerate(ops) if op.stream in (Stream.D2H, Stream.H2D)]
    assert len(copies) == 2 * 2 * 3
    for i in copies:  # ... the copies are not
        assert slow.ends[rank][i] - slow.starts[rank][i] == pytest.approx(size / 8e9,
                                                                          rel=1e-12)
