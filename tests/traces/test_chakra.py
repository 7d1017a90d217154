"""Chakra execution traces (`parasim export --chakra`, `traces.chakra_*`): a plan written as
Chakra ET and read back is the same trace op for op; Chakra's own fields alone (what ASTRA-sim
reads) state the same kinds, sizes, peers, groups, dependencies and stream order; the framing is
protobuf's varint-delimited stream as Chakra's reader walks it; replaying the exported folder
gives simulate's step."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("google.protobuf")

from google.protobuf.internal.decoder import _DecodeVarint  # noqa: E402

from sim.cli import main  # noqa: E402
from sim.config import experiment_from_dict  # noqa: E402
from sim.measured import load_trace  # noqa: E402
from sim.simulate import predict  # noqa: E402
from traces.chakra_read import load_chakra  # noqa: E402
from traces.chakra_schema import NodeType, messages  # noqa: E402
from traces.chakra_write import (  # noqa: E402
    COMM_TYPES,
    GROUPS_FILE,
    META_ATTR,
    OP_ATTR,
    encode_trace,
    et_name,
    groups_json,
    process_groups,
)
from traces.ops import OpKind  # noqa: E402

MODEL = {"layers": 4, "hidden": 256, "heads": 16, "seq_len": 128, "vocab": 1024}
MOE = {"layers": 2, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1024, "ffn": "swiglu",
       "ffn_hidden": 512, "experts": 4, "top_k": 2, "moe_ffn_hidden": 128, "bias": False}
LAYOUTS = {
    "dp": (MODEL, {"dp": 8, "global_batch": 16}, {"nodes": 2, "gpus_per_node": 4}),
    "tp+pp": (MODEL, {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "recompute": "full"},
              {"nodes": 1}),
    "moe": (MOE, {"dp": 4, "ep": 4, "global_batch": 8}, {"nodes": 1, "gpus_per_node": 4}),
    "cp": (MODEL, {"tp": 2, "cp": 2, "pp": 2, "dp": 2, "sp": True, "global_batch": 8},
           {"nodes": 2}),
}
"""name -> (model, parallel, cluster size): a layout each of DP across nodes, TP with PP, MoE,
and CP (which `simulate` folds over CP too: its export holds fewer ranks than one per stage)."""


def experiment(name):
    return experiment_from_dict(config(name))


def config(name):
    model, parallel, size = LAYOUTS[name]
    return {"model": model, "parallel": parallel,
            "cluster": {"preset": "dgx-h100", **size, "fabric": "rail"}}


def write(trace, folder, name="job"):
    folder.mkdir(exist_ok=True)
    for rank, data in encode_trace(trace):
        (folder / et_name(name, rank)).write_bytes(data)
    (folder / GROUPS_FILE).write_text(groups_json(process_groups(trace)))
    return folder


def strip(folder):
    """The folder's files without parasim's own attributes: what another tool wrote."""
    m = messages()
    for path in folder.glob("*.et"):
        data, at, out = path.read_bytes(), 0, []
        first = True
        while at < len(data):
            size, at = _DecodeVarint(data, at)
            message = (m.GlobalMetadata if first else m.Node)()
            message.ParseFromString(data[at:at + size])
            at += size
            kept = [a for a in message.attr if not a.name.startswith("parasim.")]
            del message.attr[:]
            message.attr.extend(kept)
            body = message.SerializeToString()
            out.append(bytes(_varint(len(body))) + body)
            first = False
        path.write_bytes(b"".join(out))


def _varint(n):
    out = bytearray()
    while n > 0x7F:
        out.append(0x80 | n & 0x7F)
        n >>= 7
    out.append(n)
    return out


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def simulated(request):
    exp = experiment(request.param)
    return exp, *predict(exp, fold=False)  # every rank, as another tool needs


def test_a_plan_comes_back_from_chakra_op_for_op(tmp_path, simulated):
    _, _, times = simulated
    trace = times.timed_trace()
    back, files = load_chakra(write(trace, tmp_path / "et"))
    assert back.meta == trace.meta
    assert back.ops == trace.ops  # every field: kind, sizes, deps, stream, purpose, times
    assert len(files) == len(trace.ops)


def test_chakras_own_fields_state_the_ops_sizes_groups_and_dependencies(tmp_path, simulated):
    _, _, times = simulated
    trace = times.timed_trace()
    folder = write(trace, tmp_path / "et")
    strip(folder)
    theirs = load_trace(folder).trace  # read as any Chakra trace: Chakra's fields only
    assert theirs.meta.layout is None  # parasim's header went with its attributes
    assert sorted(theirs.ops) == sorted(trace.ops)
    for rank, ops in trace.ops.items():
        read = theirs.ops[rank]
        assert [o.kind for o in read] == [o.kind for o in ops]
        assert [o.deps for o in read] == [o.deps for o in ops]
        assert [o.size_bytes for o in read] == [float(round(o.size_bytes)) for o in ops]
        assert [o.flops for o in read] == [float(round(o.flops)) for o in ops]
        assert [o.group for o in read] == [o.group for o in ops]
        assert [o.peer for o in read] == [o.peer for o in ops]
        assert [o.name for o in read] == [o.name or str(o.kind) for o in ops]
        assert [o.stream for o in read] == [o.stream for o in ops]
        for op, got in zip(ops, read, strict=True):  # compute durations to the microsecond
            if str(op.kind) != "compute":
                assert got.end is None  # communication is for the replay to time
            elif got.end is None:  # 0 us in Chakra: left for the compute model to time
                assert op.end - op.start < 0.5e-6
            else:
                assert got.end - got.start == pytest.approx(op.end - op.start, abs=0.5e-6)


def test_the_files_are_varint_delimited_messages_as_chakras_reader_reads_them(tmp_path,
                                                                               simulated):
    """Walk a file as Chakra's `protolib.decodeMessage` does, with protobuf's own varint
    decoder: a GlobalMetadata, then one Node per op with the Chakra type and attributes."""
    _, _, times = simulated
    trace = times.timed_trace()
    rank = trace.ranks[-1]
    data = dict(encode_trace(trace))[rank]
    m, at, bodies = messages(), 0, []
    while at < len(data):
        size, at = _DecodeVarint(data, at)
        bodies.append(data[at:at + size])
        at += size
    assert at == len(data)
    header = m.GlobalMetadata.FromString(bodies[0])
    assert header.version == "0.0.4" and {a.name for a in header.attr} >= {META_ATTR}
    nodes = [m.Node.FromString(b) for b in bodies[1:]]
    assert len(nodes) == len(trace.ops[rank])
    types = {"compute": NodeType.COMP_NODE, "send": NodeType.COMM_SEND_NODE,
             "recv": NodeType.COMM_RECV_NODE}
    for i, (node, op) in enumerate(zip(nodes, trace.ops[rank], strict=True)):
        assert node.id == i and list(node.data_deps) == list(op.deps)
        assert node.type == types.get(str(op.kind), NodeType.COMM_COLL_NODE)
        attrs = {a.name: a for a in node.attr}
        assert OP_ATTR in attrs and attrs["is_cpu_op"].bool_val is False
        # the value fields Chakra's feeder (ASTRA-sim's reader) reads each attribute from
        if op.kind is OpKind.COMPUTE:
            assert attrs["num_ops"].int64_val == round(op.flops)
            assert attrs["tensor_size"].uint64_val == round(op.mem_bytes)
        else:
            assert attrs["comm_size"].int64_val == round(op.size_bytes)
        if op.kind.is_collective:
            assert attrs["comm_type"].int64_val == COMM_TYPES[op.kind]
            assert attrs["pg_name"].string_val
        if op.kind.is_p2p:
            src, dst = (rank, op.peer) if str(op.kind) == "send" else (op.peer, rank)
            assert (attrs["comm_src"].int32_val, attrs["comm_dst"].int32_val) == (src, dst)
        assert node.duration_micros == round((op.end - op.start) * 1e6)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_replaying_an_export_gives_simulates_step(capsys, tmp_path, name):
    path = tmp_path / f"{name.replace('+', '-')}.toml"  # the files' default name: the stem
    path.write_text(_toml(config(name)))
    code, out, err = run_cli(capsys, "simulate", path, "--json")
    assert code == 0, err
    simulated = json.loads(out)["step_time_s"]
    folder = tmp_path / "et"
    code, out, err = run_cli(capsys, "export", "--chakra", folder, "--config", path, "--json")
    assert code == 0, err
    exported = json.loads(out)
    assert exported["step_time_s"] == simulated
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [GROUPS_FILE, *(f"{path.stem}.{r}.et" for r in exported["ranks"])])
    code, out, err = run_cli(capsys, "replay", folder, "--json")
    assert code == 0, err
    replayed = json.loads(out)
    assert replayed["source"] == "chakra" and replayed["trace_times"] == "predicted"
    assert replayed["step_time_predicted_s"] == pytest.approx(simulated, rel=1e-9)


def _toml(tables):
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def test_an_export_is_the_same_bytes_every_time(simulated):
    _, _, times = simulated
    trace = times.timed_trace()
    assert dict(encode_trace(trace)) == dict(encode_trace(trace))


def test_the_simulator_loads_without_protobuf():
    """protobuf is the optional extra: importing the commands and the readers never loads it
    (only writing or reading a Chakra file does)."""
    import subprocess
    import sys

    code = ("import sys, sim.cli, sim.measured, sim.commands.export, traces.chakra_read; "
            "assert 'google.protobuf' not in sys.modules, 'protobuf loaded'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
