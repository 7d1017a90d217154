"""Chakra traces from elsewhere and bad ones: a hand-made ASTRA-sim-style trace replays as the
same ops built directly do; a file that is not Chakra ET, a truncated one, missing or doubled
ranks, too many nodes, a collective parasim does not model, and a missing protobuf are each one
line with exit status 2 (`traces.chakra_read`, `parasim export`)."""

from __future__ import annotations

import shutil
import sys

import pytest

pytest.importorskip("google.protobuf")

from sim.cli import main  # noqa: E402
from sim.measured import LoadedTrace, load_trace, replay_trace  # noqa: E402
from topology import build_cluster  # noqa: E402
from traces import chakra_read, chakra_schema  # noqa: E402
from traces.chakra_schema import CommType, NodeType, messages, varint  # noqa: E402
from traces.ops import Op, OpKind, Trace  # noqa: E402

MiB = 2**20
SMALL = """
[model]
layers = 2
hidden = 256
heads = 8
seq_len = 128
vocab = 1024

[parallel]
tp = 2
pp = 2
dp = 2
global_batch = 8

[cluster]
preset = "dgx-h100"
nodes = 1
"""


def frame(message):
    body = message.SerializeToString()
    return varint(len(body)) + body


def foreign(folder, comm_type=CommType.ALL_REDUCE):
    """Two ranks as ASTRA-sim's examples write them: compute 100 us, an all-reduce of 64 MiB
    after it (a ctrl_dep: on the compute stream), compute 50 us after that, and a 1 MiB send
    0 -> 1 with no dependency (a stream of its own)."""
    m = messages()
    attr = m.AttributeProto
    folder.mkdir()
    for rank in (0, 1):
        nodes = [m.Node(id=10, name="gemm", type=NodeType.COMP_NODE, duration_micros=100,
                        attr=[attr(name="num_ops", uint64_val=10**9)]),
                 m.Node(id=11, name="grads", type=NodeType.COMM_COLL_NODE, ctrl_deps=[10],
                        attr=[attr(name="comm_type", int64_val=comm_type),
                              attr(name="comm_size", uint64_val=64 * MiB)]),
                 m.Node(id=12, name="opt", type=NodeType.COMP_NODE, duration_micros=50,
                        data_deps=[11]),
                 m.Node(id=13, name="msg", type=NodeType.COMM_SEND_NODE if rank == 0
                        else NodeType.COMM_RECV_NODE,
                        attr=[attr(name="comm_src", int32_val=0),
                              attr(name="comm_dst", uint32_val=1),
                              attr(name="comm_tag", int64_val=7),
                              attr(name="comm_size", int64_val=MiB)])]
        (folder / f"astra.{rank}.et").write_bytes(
            frame(m.GlobalMetadata(version="0.0.4")) + b"".join(map(frame, nodes)))
    return folder


def direct():
    """The same two ranks built as parasim ops."""
    def rank(me, peer, kind):
        return (Op(kind=OpKind.COMPUTE, stream="compute", name="gemm", flops=1e9, start=0.0,
                   end=100e-6),
                Op(kind=OpKind.ALL_REDUCE, stream="compute", name="grads", group=(0, 1),
                   size_bytes=64.0 * MiB),
                Op(kind=OpKind.COMPUTE, stream="compute", name="opt", deps=(1,), start=0.0,
                   end=50e-6),
                Op(kind=kind, stream="comm.3", name="msg", peer=peer, tag="7",
                   size_bytes=float(MiB)))
    return Trace({0: rank(0, 1, OpKind.SEND), 1: rank(1, 0, OpKind.RECV)})


def test_a_trace_from_elsewhere_replays_as_the_same_ops_built_directly(tmp_path):
    loaded = load_trace(foreign(tmp_path / "astra"))
    assert loaded.source == "chakra" and len(loaded.files) == 2
    assert loaded.trace.ops == direct().ops
    cluster = build_cluster("dgx-h100", nodes=1)
    got = replay_trace(loaded, cluster)
    want = replay_trace(LoadedTrace(tmp_path, direct(), "parasim", ()), cluster)
    assert got.step_time_predicted_s == want.step_time_predicted_s
    assert got.step_time_predicted_s > 150e-6  # both kernels, and the all-reduce between


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv):
    """The one error line of a refused command line."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1, (code, err)
    assert err.startswith("parasim: error: ")
    return err


@pytest.fixture
def export(capsys, tmp_path):
    """An every-rank export (8 ranks, TP 2 x PP 2 x DP 2) and a folded one (ranks 0 and 4)."""
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    for flag, name in (("--no-fold", "every"), (None, "folded")):
        argv = ["export", "--chakra", tmp_path / name, "--config", config,
                *([flag] if flag else [])]
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, err
    return tmp_path / "every", tmp_path / "folded"


def test_a_file_that_is_not_chakra_is_refused(capsys, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "x.0.et").write_text('{"schema": "parasim.trace"}\n')
    assert "x.0.et: not a Chakra ET file" in refused(capsys, "replay", folder)
    (folder / "x.0.et").write_bytes(varint(3) + b"\xff\xff\xff")
    assert "is not a GlobalMetadata" in refused(capsys, "replay", folder)
    m = messages()
    (folder / "x.0.et").write_bytes(b"")
    assert "empty: a Chakra ET file starts with its GlobalMetadata" in refused(
        capsys, "replay", folder)
    (folder / "x.0.et").write_bytes(frame(m.GlobalMetadata(attr=[m.AttributeProto(name="x")])))
    assert "states no version" in refused(capsys, "replay", folder)


def test_a_truncated_file_is_refused(capsys, export):
    every, _ = export
    path = every / "small.3.et"
    path.write_bytes(path.read_bytes()[:-100])
    assert "small.3.et: truncated: a message at byte" in refused(capsys, "replay", every)


def test_missing_and_doubled_ranks_are_refused(capsys, export):
    every, folded = export
    shutil.copy(every / "small.0.et", every / "other.0.et")
    assert "rank 0 again" in refused(capsys, "replay", every)
    (every / "other.0.et").unlink()
    (every / "small.5.et").unlink()
    assert "no file for rank 5 (1 of 8 ranks missing)" in refused(capsys, "replay", every)
    (folded / "small.4.et").unlink()
    assert "no file for rank 4 (1 of 2 ranks missing)" in refused(capsys, "replay", folded)


def test_nodes_are_counted_before_ops_are_built(capsys, monkeypatch, export):
    every, _ = export
    monkeypatch.setattr(chakra_read, "MAX_TRACE_OPS", 500)
    assert "more than 500 nodes" in refused(capsys, "replay", every)


def test_a_collective_parasim_does_not_model_is_refused(capsys, tmp_path):
    folder = foreign(tmp_path / "astra", CommType.GATHER)
    assert "comm_type GATHER is a collective parasim does not model" in refused(
        capsys, "replay", folder, "--cluster", "dgx-h100")


def test_an_edited_export_is_refused(capsys, export):
    every, _ = export
    m, path = messages(), every / "small.1.et"
    bodies = chakra_schema.frames(path.read_bytes(), "x")
    node = m.Node.FromString(bodies[5])
    node.data_deps.append(0)
    bodies[5] = node.SerializeToString()
    path.write_bytes(b"".join(varint(len(b)) + b for b in bodies))
    assert "data_deps disagree with its parasim.op" in refused(capsys, "replay", every)


def test_without_protobuf_both_commands_say_what_to_install(capsys, monkeypatch, export):
    every, _ = export
    chakra_schema.messages.cache_clear()
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    try:
        for argv in (("replay", every), ("export", "--chakra", every.parent / "again")):
            assert "pip install parasim[chakra]" in refused(capsys, *argv)
    finally:
        chakra_schema.messages.cache_clear()
    assert not (every.parent / "again").exists()  # refused before anything was made


def test_export_refuses_a_bad_name_and_a_folder_of_another_export(capsys, tmp_path, export):
    every, _ = export
    config = tmp_path / "small.toml"
    assert "--name: '../x' is not a plain file name" in refused(
        capsys, "export", "--chakra", tmp_path / "n", "--config", config, "--name", "../x")
    assert "holds small.0.et of another export" in refused(
        capsys, "export", "--chakra", every, "--config", config, "--name", "other")
    assert "is not a folder" in refused(capsys, "export", "--chakra", config, "--config",
                                        config)
