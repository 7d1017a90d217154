"""`parasim replay`: simulated traces reproduce themselves, real GPU traces replay, partial
traces replay by symmetry, measured durations are kept where the trace leaves no choice, and
bad inputs are one line with exit status 2 and no output file."""

import dataclasses
import functools
import json
import tomllib
from pathlib import Path

import pytest

from sim.cli import main
from sim.collectives import Collectives
from sim.engine.lowering import lower_communication
from sim.measured import LoadedTrace, choose_cluster, load_trace, replay_trace
from sim.profile import ComputeParams, LinkParams, Profile
from sim.simulate import predict
from tests.sim.commands.test_simulate_cli import SMALL
from topology import build_cluster
from topology.config import read_cluster
from traces.errors import ConfigError
from traces.header import ClusterTable, TraceMeta
from traces.header_json import meta_from_json
from traces.io import dumps, load, save
from traces.kineto import load_kineto
from traces.ops import Op, OpKind, Trace

KINETO = Path(__file__).parents[1] / "data" / "kineto"
TWO_RANK = KINETO / "a100-2rank-nccl-rank0.json.gz"
EIGHT_RANK = KINETO / "a100-8rank-pp-rank3.json.gz"
MiB = 2**20
AR = OpKind.ALL_REDUCE


@functools.cache
def kineto(path):
    return load_kineto(path)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """A small experiment simulated with a profile of known, non-default parameters."""
    from sim.config import experiment_from_dict

    folder = tmp_path_factory.mktemp("known")
    profile = folder / "known.json"
    Profile(name="known", calibrated=True, measured_on="H100-SXM5-80GB",
            compute=ComputeParams(gemm_efficiency=0.55, memory_efficiency=0.6,
                                  launch_overhead_s=7e-6)).save(profile)
    return experiment_from_dict(tomllib.loads(SMALL), overrides={"profile": str(profile)}), profile


def scrambled(trace):
    """The trace with every communication op's measured time replaced by one second: a replay
    that re-simulates communication must not see it."""
    return Trace({r: tuple(op if op.kind is OpKind.COMPUTE else
                           dataclasses.replace(op, end=op.start + 1.0) for op in ops)
                  for r, ops in trace.ops.items()}, trace.meta)


# --- a simulated trace reproduces its step time ---------------------------------------------

@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("retime", [False, True])
def test_a_simulated_trace_replays_to_its_own_step_time(tmp_path, known, fold, retime):
    exp, profile = known
    _, times = predict(exp, fold=fold)
    path = tmp_path / "step.json"
    save(scrambled(times.timed_trace()), path)
    loaded = load_trace(path)
    assert loaded.source == "parasim" and loaded.trace.meta.folded == fold
    spec = choose_cluster(loaded.trace)  # the cluster the trace names: dgx-h100 x2 rail
    cluster = spec.build()
    assert cluster.name == exp.cluster.name
    result = replay_trace(loaded, cluster, exp.profile, retime=retime)
    assert result.step_time_predicted_s == pytest.approx(times.step_time_s, rel=1e-9, abs=1e-9)
    for rank in times.ends:  # op by op, communication included
        assert result.times.ends[rank] == pytest.approx(times.ends[rank], rel=1e-9, abs=1e-12)
    compute = sum(op.kind is OpKind.COMPUTE for ops in loaded.trace.ops.values() for op in ops)
    assert (result.retimed_compute, result.kept_measured_compute) == (
        (compute, 0) if retime else (0, compute))
    assert result.uncosted_compute == 0  # a parasim trace states every kernel's cost
    assert result.kept_measured_comm == 0


def test_a_parasim_trace_replays_on_exactly_the_cluster_it_was_simulated_on(capsys, tmp_path):
    """No --cluster: the trace's `cluster_spec` rebuilds its cluster, overrides included (the
    display name "dgx-h100 x2 rail" would lose nic_bandwidth and switch_latency)."""
    from sim.config import experiment_from_dict

    config = tomllib.loads(SMALL)
    config["cluster"].update(nic_bandwidth="50Gb/s", switch_latency="7us")
    exp = experiment_from_dict(config)
    _, times = predict(exp)
    path = tmp_path / "step.json"
    save(times.timed_trace(), path)
    loaded = load_trace(path)
    assert loaded.trace.meta.cluster_spec == exp.cluster.table
    rebuilt, simulated = choose_cluster(loaded.trace).build(), read_cluster(config["cluster"])
    simulated_cluster = simulated.build()
    assert rebuilt.name == simulated_cluster.name == "dgx-h100 x2 rail"
    assert (rebuilt.link_capacity, rebuilt.link_latency, rebuilt.link_kind, rebuilt.devices) == (
        simulated_cluster.link_capacity, simulated_cluster.link_latency,
        simulated_cluster.link_kind, simulated_cluster.devices)
    assert rebuilt.link_capacity != build_cluster("dgx-h100", nodes=2, fabric="rail").link_capacity
    code, out, err = run_cli(capsys, "replay", path, "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_predicted_s"] == pytest.approx(times.step_time_s,
                                                                     rel=1e-9)
    resized = choose_cluster(loaded.trace, nodes=4)  # --nodes: the same overrides, more nodes
    assert resized.num_devices == 32 and resized.server.nic_Bps == simulated.server.nic_Bps


def test_retiming_uses_the_profile_given(tmp_path, known):
    exp, profile = known
    _, times = predict(exp)
    path = tmp_path / "step.json"
    save(times.timed_trace(), path)
    kept = replay_trace(load_trace(path), exp.cluster, None)  # default profile: durations kept
    retimed = replay_trace(load_trace(path), exp.cluster, None, retime=True)
    assert kept.step_time_predicted_s == pytest.approx(times.step_time_s, rel=1e-9)
    # The default H100 profile's GEMMs run at 70% of peak, the known profile's at 55%.
    assert retimed.step_time_predicted_s < 0.95 * times.step_time_s


def test_the_command_line_replays_a_simulated_trace(capsys, tmp_path, known):
    exp, profile = known
    _, times = predict(exp)
    path, out_trace = tmp_path / "step.json", tmp_path / "again.json"
    save(times.timed_trace(), path)
    code, out, err = run_cli(capsys, "replay", path, "--profile", profile, "--json",
                             "--trace", out_trace)
    assert code == 0 and err == ""
    r = json.loads(out)
    assert r["step_time_predicted_s"] == pytest.approx(times.step_time_s, rel=1e-9)
    # simulate's own times are a prediction, labelled so (issue 22, item 14)
    assert r["step_time_measured_s"] is None and r["trace_times"] == "predicted"
    assert r["step_time_in_trace_s"] == pytest.approx(times.step_time_s, rel=1e-12)
    assert r["num_ranks"] == 2 and r["source"] == "parasim"
    assert r["cluster"] == "dgx-h100 x2 rail" and r["network"] == "flow"
    plan_ops = [op for ops in times.plan.ops.values() for op in ops]
    assert r["ops"]["by_kind"]["compute"] == sum(op.kind is OpKind.COMPUTE for op in plan_ops)
    assert r["parasim"]["profile"] == {"name": "known", "calibrated": True}
    assert load(out_trace).timed
    code, text, _ = run_cli(capsys, "replay", path, "--profile", profile)
    assert code == 0 and "step time predicted" in text and "step time in the trace" in text


def test_a_run_folder_replays_as_the_union_of_its_rank_files(capsys, tmp_path, known):
    exp, _ = known
    _, times = predict(exp, fold=False)
    timed = times.timed_trace()
    for rank in timed.ranks:  # as `parasim run` writes it: rank<r>.json and chrome.json
        save(Trace({rank: timed.ops[rank]}, timed.meta), tmp_path / f"rank{rank}.json")
    (tmp_path / "chrome.json").write_text('{"traceEvents": []}')
    code, out, _ = run_cli(capsys, "replay", tmp_path, "--json")
    r = json.loads(out)
    assert code == 0 and r["num_ranks"] == 16 and r["files_skipped"] == ["chrome.json"]
    assert r["step_time_predicted_s"] == pytest.approx(times.step_time_s, rel=1e-9)


# --- the real GPU traces -----------------------------------------------------------------------

@pytest.mark.parametrize(("path", "collectives", "mirrored"), [
    (TWO_RANK, {"all_reduce": 15, "broadcast": 6}, 1),
    (EIGHT_RANK, {"all_reduce": 18, "all_to_all": 42}, 7),
])
def test_real_gpu_traces_replay_on_dgx_a100(capsys, path, collectives, mirrored):
    code, out, err = run_cli(capsys, "replay", path, "--cluster", "dgx-a100", "--json")
    assert code == 0 and err == ""
    r = json.loads(out)
    (ops,) = kineto(path).ops.values()
    assert r["num_ranks"] == 1 and r["num_ranks_mirrored"] == mirrored
    assert r["ops"]["by_collective"] == collectives  # each NCCL collective once, by our names
    by_kind = {str(k): sum(op.kind is k for op in ops) for k in {op.kind for op in ops}}
    assert r["ops"]["by_kind"] == dict(sorted(by_kind.items()))
    assert sum(collectives.values()) == sum(n for k, n in by_kind.items() if k != "compute")
    assert r["collective_bytes"] == {
        name: sum(op.size_bytes for op in ops if str(op.kind) == name) for name in collectives}
    assert r["kept_measured"] == {"compute": by_kind["compute"], "communication": 0}
    assert r["step_time_measured_s"] == pytest.approx(
        max(op.end for op in ops) - min(op.start for op in ops))
    # Measured compute durations are kept and a stream runs its ops one after another: the
    # step is at least the busiest stream's compute.
    busy: dict[str, float] = {}
    for op in ops:
        if op.kind is OpKind.COMPUTE:
            busy[op.stream] = busy.get(op.stream, 0.0) + op.duration
    assert max(busy.values()) <= r["step_time_predicted_s"] < float("inf")
    assert r["cluster"] == "dgx-a100 x1 fat-tree"
    # --retime cannot re-time a profiler's compute (no FLOPs or bytes), and says so.
    code, out, err = run_cli(capsys, "replay", path, "--cluster", "dgx-a100", "--retime",
                             "--json")
    retimed = json.loads(out)
    assert code == 0 and err.count("\n") == 1 and err.startswith("parasim: warning: --retime: ")
    assert f"{by_kind['compute']} of {by_kind['compute']} compute ops kept their measured" in err
    assert "states no FLOPs or bytes" in err
    assert retimed["retimed_compute"] == 0
    assert retimed["kept_measured_compute"] == by_kind["compute"] == \
        retimed["kept_measured_compute_no_flops_bytes"]
    assert retimed["step_time_predicted_s"] == r["step_time_predicted_s"]


def test_a_folder_of_profiler_files_replays_like_its_file(capsys, tmp_path):
    (tmp_path / TWO_RANK.name).write_bytes(TWO_RANK.read_bytes())
    code, out, _ = run_cli(capsys, "replay", tmp_path, "--cluster", "dgx-a100", "--json")
    _, alone, _ = run_cli(capsys, "replay", TWO_RANK, "--cluster", "dgx-a100", "--json")
    folder, single = json.loads(out), json.loads(alone)
    assert code == 0 and folder["source"] == "kineto"
    for key in ("step_time_predicted_s", "step_time_measured_s", "ops", "collective_bytes"):
        assert folder[key] == single[key]


# --- partial traces, by symmetry ---------------------------------------------------------------

def timed_compute(start, seconds, stream="compute", deps=()):
    return Op(kind=OpKind.COMPUTE, stream=stream, name="k", start=start, end=start + seconds,
              deps=deps)


def step_of(ops_by_rank, cluster, network=None):
    loaded = LoadedTrace(Path("hand.json"), Trace(ops_by_rank), "parasim", ())
    return replay_trace(loaded, cluster, network=network)


def test_one_rank_of_a_two_rank_all_reduce_replays_like_both(h100):
    ar = Op(kind=AR, stream="comm", group=(0, 1), size_bytes=64 * MiB, deps=(0,),
            start=1e-3, end=9e-3)
    rank = (timed_compute(0.0, 1e-3), ar, timed_compute(9e-3, 5e-4, deps=(1,)))
    both = step_of({0: rank, 1: rank}, h100)
    alone = step_of({0: rank}, h100)
    assert alone.times.starts[0] == both.times.starts[0]
    assert alone.times.ends[0] == both.times.ends[0]
    assert alone.step_time_predicted_s == both.step_time_predicted_s > 1.5e-3
    assert alone.num_ranks_mirrored == 1 and both.num_ranks_mirrored == 0
    assert alone.collective_counts == both.collective_counts == {"all_reduce": 1}


def test_a_partial_group_is_lowered_whole_and_needs_only_its_present_members(h100):
    ar = Op(kind=AR, stream="comm", group=(0, 1, 2, 3), size_bytes=64 * MiB)
    comm = lower_communication(Trace({0: (ar,), 2: (ar,)}), h100, None, algo="ring_flows")
    assert comm.lowered[0].lowering == Collectives(h100).lowering(AR, (0, 1, 2, 3), "ring")
    assert comm.ops[0][0].need == comm.ops[2][0].need == 2
    assert comm.algorithms == {"ring_flows": 1}


def test_a_send_whose_receiver_is_absent_runs_its_flow_alone(h100):
    send = Op(kind=OpKind.SEND, stream="pp", peer=1, size_bytes=64 * MiB, tag="a")
    recv = Op(kind=OpKind.RECV, stream="pp", peer=0, size_bytes=64 * MiB, tag="a")
    both = step_of({0: (send,), 1: (recv,)}, h100)
    assert step_of({0: (send,)}, h100).step_time_predicted_s == both.step_time_predicted_s
    assert step_of({1: (recv,)}, h100).step_time_predicted_s == both.step_time_predicted_s
    assert step_of({1: (recv,)}, h100).times.algorithms == {"p2p": 1}


def test_absent_members_arrive_with_the_last_present_one(h100):
    # Ranks 0 and 1 of a 4-rank all-reduce; rank 1 issues it 2 ms late. The collective is
    # lowered over all four GPUs: the same time as the full group issuing it together.
    ar = Op(kind=AR, stream="comm", group=(0, 1, 2, 3), size_bytes=64 * MiB)
    late = dataclasses.replace(ar, deps=(0,))
    partial = step_of({0: (ar,), 1: (timed_compute(0.0, 2e-3), late)}, h100)
    full = step_of({r: (ar,) for r in range(4)}, h100)
    assert partial.times.starts[0][0] == partial.times.starts[1][1] == 2e-3
    assert partial.times.ends[0][0] == pytest.approx(2e-3 + full.step_time_predicted_s,
                                                     rel=1e-12)


def test_a_collective_of_unstated_size_keeps_the_last_arrivals_measured_duration(h100):
    # Rank 1 arrives last (after 2 ms of compute); its kernel measured 3 ms, rank 0's 5 ms
    # (it waited for rank 1): the replay starts it at 2 ms and keeps rank 1's 3 ms.
    ar0 = Op(kind=AR, stream="comm", group=(0, 1), start=1e-3, end=6e-3, deps=(0,))
    ar1 = Op(kind=AR, stream="comm", group=(0, 1), start=2e-3, end=5e-3, deps=(0,))
    ranks = {0: (timed_compute(0.0, 1e-3), ar0), 1: (timed_compute(0.0, 2e-3), ar1)}
    result = step_of(ranks, h100)
    assert result.times.starts[0][1] == result.times.starts[1][1] == 2e-3
    assert result.step_time_predicted_s == pytest.approx(5e-3, rel=1e-12)
    assert result.kept_measured_comm == 1 and result.times.algorithms == {"measured": 1}
    assert result.step_time_measured_s == pytest.approx(6e-3)
    analytic = step_of(ranks, h100, network="analytic")
    assert analytic.step_time_predicted_s == result.step_time_predicted_s
    assert step_of(ranks, h100, network="ideal").step_time_predicted_s == 2e-3  # free


# --- bad input: one line, exit 2, no output file -----------------------------------------------

def small_trace():
    ar = Op(kind=AR, stream="comm", group=(0, 1), size_bytes=MiB, start=0.0, end=1e-3)
    table = ClusterTable(preset="dgx-h100", nodes=1, fabric="fat-tree")
    return Trace({0: (ar,), 1: (ar,)}, TraceMeta(cluster_name="dgx-h100 x1 fat-tree",
                                                 cluster_spec=table))


def edited(tmp_path, change):
    data = json.loads(dumps(small_trace()))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


def truncated_parasim(tmp_path):
    path = tmp_path / "cut.json"
    text = dumps(small_trace())
    path.write_text(text[:len(text) // 2])
    return path


def truncated_kineto(tmp_path):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(TWO_RANK.read_bytes()[:50_000])
    return path


def bad_kineto_version(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 99, "traceEvents": [], "distributedInfo": {
        "rank": 0, "world_size": 2, "backend": "nccl"}}))
    return path


def op_field(field, value):
    def change(data):
        op = data["ranks"]["0"][0]
        if value is None:
            del op[field]
        else:
            op[field] = value
    return change


def send_without_peer(data):
    data["ranks"]["0"] = [{"kind": "send", "stream": "pp", "size_bytes": 8.0}]


def send_to_nobody(data):
    data["ranks"]["0"] = [{"kind": "send", "stream": "pp", "size_bytes": 8.0, "peer": 99}]


@pytest.mark.parametrize(("make", "flags", "needle"), [
    (truncated_parasim, [], "not a JSON file"),
    (truncated_kineto, ["--cluster", "dgx-a100"], "corrupt or truncated gzip"),
    (lambda p: edited(p, lambda d: d.update(version=99)), [],
     "unsupported trace version int 99 (supported: 1, 2, 3)"),
    (bad_kineto_version, ["--cluster", "dgx-a100"], "unsupported kineto schemaVersion 99"),
    (lambda p: edited(p, op_field("group", None)), [], "needs a non-empty group of ranks"),
    (lambda p: edited(p, send_without_peer), [], "a send needs a peer rank"),
    (lambda p: edited(p, send_to_nobody), [], "trace: rank 99 does not fit dgx-h100 x1 "
                                              "fat-tree (8 accelerators); give --nodes 13"),
    (lambda p: edited(p, op_field("group", [0, 1, 64])), [], "rank 64 does not fit"),
    (lambda p: edited(p, lambda d: d["meta"].clear()), [], "names no cluster to replay on"),
    (lambda p: edited(p, lambda d: (d["meta"].update(cluster="my lab"),
                                    d["meta"].pop("cluster_spec"))), [],
     "its cluster 'my lab' is not a preset parasim can rebuild; give --cluster"),
    (lambda p: TWO_RANK, [], "its meta names no cluster to replay on (a profiler trace"),
    (lambda p: p / "missing.json", [], "missing.json: no such file or folder"),
    (lambda p: EIGHT_RANK, ["--cluster", "localhost", "--nodes", "1", "--fabric", "rail",
                            "--algo", "magic"], "--algo: 'magic' is not an algorithm"),
    (lambda p: edited(p, lambda d: d["ranks"].update({"1": [{"kind": "compute",
                                                             "stream": "c"}]})), [],
     "the step cannot finish: rank 0 op 0 (all_reduce on [0, 1]"),
])
def test_bad_input_is_one_line_exit_2_and_no_output_file(capsys, tmp_path, make, flags, needle):
    out_trace = tmp_path / "out" / "replayed.json"
    out_trace.parent.mkdir()
    code, out, err = run_cli(capsys, "replay", make(tmp_path), *flags, "--json",
                             "--trace", out_trace)
    assert code == 2 and out == ""
    assert err.startswith("parasim: error: ") and len(err.strip().splitlines()) == 1
    assert needle in err
    assert list(out_trace.parent.iterdir()) == []


def test_a_rank_that_does_not_fit_names_the_nodes_it_needs():
    trace = Trace({0: (), 15: (Op(kind=OpKind.COMPUTE, stream="c"),)})
    with pytest.raises(ConfigError, match="rank 15 does not fit dgx-a100 x1 fat-tree "
                                          r"\(8 accelerators\); give --nodes 2"):
        choose_cluster(trace, "dgx-a100")
    assert choose_cluster(trace, "dgx-a100", nodes=2).num_devices == 16
    with pytest.raises(ConfigError, match="its world of 16 ranks does not fit dgx-a100 x1 "
                                          r"fat-tree \(8 accelerators\); give --nodes 2"):
        choose_cluster(Trace({3: ()}, TraceMeta(world_size=16)), "dgx-a100")


def test_the_cluster_is_rebuilt_from_the_trace_or_taken_from_flags():
    trace = Trace({0: ()}, TraceMeta(cluster_spec=build_cluster("dgx-h100", nodes=2,
                                                                fabric="rail").table))
    assert choose_cluster(trace).build().name == "dgx-h100 x2 rail"
    assert choose_cluster(trace, nodes=4).nodes == 4
    assert choose_cluster(trace, "dgx-a100").build().name == "dgx-a100 x1 fat-tree"
    torus = Trace({0: ()}, TraceMeta(cluster_spec=build_cluster("tpu-v4").table))
    assert choose_cluster(torus).num_devices == 64
    # a version-2 file states its cluster by its display name only: read back on load
    old = Trace({0: ()}, meta_from_json({"cluster": build_cluster("tpu-v4").name}, 2))
    assert choose_cluster(old).num_devices == 64
    named = Trace({0: ()}, TraceMeta(cluster_name="dgx-h100 x2 rail"))  # a label, not a spec
    with pytest.raises(ConfigError, match="its cluster 'dgx-h100 x2 rail' is not a preset "):
        choose_cluster(named)
    bad = Trace({0: ()}, TraceMeta(cluster_spec=ClusterTable(preset="dgx-h100", nodes=2,
                                                             fabric="rail",
                                                             overrides=(("dims", (4, 4)),))))
    with pytest.raises(ConfigError, match=r"^trace: meta\.cluster_spec\.dims: applies to a "
                                          "torus preset only"):
        choose_cluster(bad)


def test_a_profiles_measured_links_replace_the_clusters_in_a_replay(capsys, tmp_path, known):
    exp, _ = known
    _, times = predict(exp)
    path = tmp_path / "step.json"
    save(times.timed_trace(), path)
    slow = tmp_path / "slow.json"
    Profile(name="slow", compute=ComputeParams(gemm_efficiency=0.7), links={
        kind: LinkParams(bandwidth_Bps=1e9, latency_s=1e-4) for kind in ("nvlink", "ib", "pcie")
    }).save(slow)
    code, out, _ = run_cli(capsys, "replay", path, "--profile", slow, "--json")
    assert code == 0
    # 1 GB/s links with 100 us hops instead of NVLink and InfiniBand: far slower communication.
    assert json.loads(out)["step_time_predicted_s"] > 1.5 * times.step_time_s


def test_a_replay_on_a_varied_cluster_stretches_like_simulate(tmp_path, known):
    """`[cluster] jitter` applies to a retimed replay as to `simulate`: a plan simulated on the
    ideal cluster and replayed (retimed) on the varied one takes the varied simulation's step;
    kept measured kernels are not stretched again."""
    from sim.config import experiment_from_dict

    exp, _ = known
    _, times = predict(exp)
    path = tmp_path / "step.json"
    save(times.timed_trace(), path)
    varied = {"preset": "dgx-h100", "nodes": 2, "fabric": "rail", "jitter": 0.03}
    cluster = read_cluster(varied).build()
    result = replay_trace(load_trace(path), cluster, exp.profile, retime=True)
    data = tomllib.loads(SMALL)
    data["cluster"] = varied
    expected, _ = predict(experiment_from_dict(data, overrides={"profile": str(known[1])}))
    assert result.step_time_predicted_s == pytest.approx(expected.step_time_s, rel=1e-9)
    assert result.step_time_predicted_s > times.step_time_s
    kept = replay_trace(load_trace(path), cluster, exp.profile)  # measured kernels: as they ran
    assert kept.step_time_predicted_s == pytest.approx(times.step_time_s, rel=1e-9)
    bare = dataclasses.replace(load_trace(path).trace.meta, layout=None)
    loaded = load_trace(path)
    with pytest.raises(ConfigError, match="variability needs the trace's parallel layout"):
        replay_trace(dataclasses.replace(loaded, trace=Trace(loaded.trace.ops, bare)), cluster,
                     retime=True)


def test_an_eager_plan_replays_to_its_own_step_time_with_its_launches(tmp_path, known):
    """A plan of `kernels = "eager"` launches several kernels for one op (a norm's aten ops):
    re-timed from its trace, each op is charged its stack's launches as `predict` charged
    them, so the replay gives the predicted step (it was one launch an op short)."""
    from sim.config import experiment_from_dict

    config = tomllib.loads(SMALL)
    config["model"]["kernels"] = "eager"
    exp = experiment_from_dict(config, overrides={"profile": str(known[1])})
    _assert_retimed_replay_is_predict(exp, tmp_path)


def _assert_retimed_replay_is_predict(exp, tmp_path):
    """`exp` predicted, its trace saved and replayed with every kernel re-costed: the
    replay re-costs some kernels and gives the predicted step."""
    _, times = predict(exp)
    path = tmp_path / "step.json"
    save(times.timed_trace(), path)
    loaded = load_trace(path)
    result = replay_trace(loaded, choose_cluster(loaded.trace).build(), exp.profile,
                          retime=True)
    assert result.retimed_compute > 0
    assert result.step_time_predicted_s == pytest.approx(times.step_time_s, rel=1e-9)


def test_a_retimed_mxfp8_trace_costs_its_gemms_at_the_recipes_rate(tmp_path):
    """Re-costing a parasim plan's kernels uses its model's FP8 GEMM rate, as `simulate`
    does: an MXFP8 step on B200 replays to simulate's step (at the per-tensor FP8 rate its
    GEMMs would run 1/0.951 faster)."""
    from sim.config import experiment_from_dict

    text = SMALL.replace('preset = "dgx-h100"', 'preset = "dgx-b200"').replace(
        "vocab = 1024\n", 'vocab = 1024\ndtype = "fp8"\nfp8_recipe = "mxfp8"\n')
    _assert_retimed_replay_is_predict(experiment_from_dict(tomllib.loads(text)), tmp_path)


def test_a_retimed_moe_trace_runs_its_stacks_expert_gemm_streams(tmp_path):
    """Re-costing a parasim MoE plan's expert GEMMs uses the streams its stack runs them on
    (`traces.moe_spec.gemm_streams`: unset under fused, TE's 4), as `simulate` does: 8 local
    experts, two rounds of 4, replay to simulate's step."""
    from sim.config import experiment_from_dict

    text = SMALL.replace("vocab = 1024\n", "vocab = 1024\nexperts = 16\ntop_k = 2\n").replace(
        "dp = 4\n", "dp = 4\nep = 2\nsp = true\n")
    _assert_retimed_replay_is_predict(experiment_from_dict(tomllib.loads(text)), tmp_path)
