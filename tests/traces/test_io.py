"""Trace JSON files: lossless round trips, compact deterministic output, one-line errors on load,
atomic saves. Run: pytest tests/traces/test_io.py -q
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import io, json_chunks
from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.header_json import meta_to_json
from traces.layout import Layout
from traces.ops import Op, OpKind, Phase, Trace
from traces.units import MAX_OP_BYTES, MAX_OP_FLOPS, MAX_SIZE_BYTES, MAX_STEP_SECONDS

MiB = 2**20


def plan_trace() -> Trace:
    """Two ranks, every op kind and every phase, every field type set somewhere."""
    rank0 = (
        Op(kind=OpKind.COMPUTE, stream="compute", name="attn", layer=0, microbatch=0,
           phase=Phase.FWD, flops=1.5e12, mem_bytes=3.0e8),
        Op(kind=OpKind.SEND, stream="p2p", deps=(0,), peer=1, size_bytes=4 * MiB, tag="act"),
        Op(kind=OpKind.RECV, stream="p2p", deps=(1,), peer=1, size_bytes=4 * MiB, tag="grad"),
        Op(kind=OpKind.COMPUTE, stream="compute", name="attn", layer=0, microbatch=0,
           phase=Phase.RECOMPUTE, deps=(2,), flops=1.5e12),
        Op(kind=OpKind.COMPUTE, stream="compute", name="attn", layer=0, microbatch=0,
           phase=Phase.BWD, deps=(2, 3), flops=3.0e12, mem_bytes=6.0e8),
        Op(kind=OpKind.ALL_REDUCE, stream="comm", deps=(4,), group=(0, 1),
           size_bytes=12 * MiB, dtype="fp32"),
        Op(kind=OpKind.REDUCE_SCATTER, stream="comm", group=(0, 1), size_bytes=8 * MiB),
        Op(kind=OpKind.ALL_GATHER, stream="comm", group=(0, 1), size_bytes=8 * MiB),
        Op(kind=OpKind.BROADCAST, stream="comm", group=(1, 0), size_bytes=1024.0),
        Op(kind=OpKind.ALL_TO_ALL, stream="comm", group=(0, 1), size_bytes=2 * MiB),
        Op(kind=OpKind.COMPUTE, stream="compute", name="adam", phase=Phase.OPT, deps=(5, 9),
           flops=1e9),
    )
    rank1 = (
        Op(kind=OpKind.RECV, stream="p2p", peer=0, size_bytes=4 * MiB, tag="act"),
        Op(kind=OpKind.COMPUTE, stream="compute", name="mlp", layer=1, microbatch=0,
           phase=Phase.FWD, deps=(0,), flops=2e12),
        Op(kind=OpKind.SEND, stream="p2p", deps=(1,), peer=0, size_bytes=4 * MiB, tag="grad"),
        Op(kind=OpKind.COMPUTE, stream="compute", name="mlp", layer=1, microbatch=0,
           phase=Phase.WGRAD, deps=(1,), flops=2e12),
    )
    meta = TraceMeta(experiment="gpt-tiny", layout=Layout(pp=2, global_batch=2), ranks=(0, 1),
                     extras={"mfu": 0.41})
    return Trace(ops={0: rank0, 1: rank1}, meta=meta)


def timed_trace() -> Trace:
    """The plan with start/end on every op, using floats that print with many digits."""
    ops = {}
    for rank, rank_ops in plan_trace().ops.items():
        timed = []
        for index, op in enumerate(rank_ops):
            start = index * 0.1 + rank / 3  # 0.30000000000000004 and friends
            timed.append(dataclasses.replace(op, start=start, end=start + 1e-9 + index * 7e-5))
        ops[rank] = tuple(timed)
    return Trace(ops=ops, meta=plan_trace().meta)


def _dump(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


# --- round trips -----------------------------------------------------------------------------

def test_fixture_covers_every_kind_and_phase():
    ops = [op for rank_ops in plan_trace().ops.values() for op in rank_ops]
    assert {op.kind for op in ops} == set(OpKind)
    assert {op.phase for op in ops} - {None} == set(Phase)


def test_plan_round_trip_is_lossless_and_restores_types():
    plan = plan_trace()
    back = io.from_json(io.to_json(plan))
    assert back == plan
    assert not back.timed
    op = back.ops[0][4]
    assert type(op.kind) is OpKind and type(op.phase) is Phase
    assert type(op.deps) is tuple and op.deps == (2, 3)
    assert type(back.ops[0][5].group) is tuple
    assert type(back.ops[0]) is tuple
    assert back.meta.ranks == (0, 1) and back.meta.extras == {"mfu": 0.41}
    assert back.ops[0][3].phase is Phase.RECOMPUTE


def test_timed_round_trip_through_a_file_keeps_every_float_bit(tmp_path):
    trace = timed_trace()
    assert trace.timed
    io.save(trace, tmp_path / "t.json")
    back = io.load(tmp_path / "t.json")
    assert back == trace
    pairs = zip(back.ops[1], trace.ops[1])
    assert all(a.start == b.start and a.end == b.end for a, b in pairs)  # exact, not approx
    assert list(back.ops) == [0, 1]


def test_round_trip_through_json_text_equals_dict_round_trip():
    trace = timed_trace()
    assert io.from_json(json.loads(io.dumps(trace))) == io.from_json(io.to_json(trace))


def test_integers_and_nulls_in_a_file_load_as_the_op_values(tmp_path):
    document = {"schema": io.SCHEMA, "version": 1, "ranks": {"3": [
        {"kind": "compute", "stream": "compute", "flops": 5, "layer": None, "phase": None,
         "start": 0, "end": 2},
    ]}}
    trace = io.load(_dump(tmp_path / "ints.json", document))
    op = trace.ops[3][0]
    assert op == Op(kind=OpKind.COMPUTE, stream="compute", flops=5.0, start=0.0, end=2.0)
    assert type(op.flops) is float and type(op.start) is float
    assert trace.meta == TraceMeta()


_ints = st.integers(min_value=0, max_value=4096)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
_flops = st.floats(min_value=0, max_value=MAX_OP_FLOPS)
_bytes = st.floats(min_value=0, max_value=MAX_OP_BYTES)
_sizes = st.just(0.0) | st.floats(min_value=1, max_value=MAX_SIZE_BYTES)
_times = st.floats(min_value=0, max_value=MAX_STEP_SECONDS / 2)
_text = st.text(max_size=8)


@st.composite
def _ops(draw: st.DrawFn, index: int, rank: int) -> Op:
    """Any op the loader accepts: counts >= 0, a peer on send/recv that is another rank, a
    non-empty group of distinct ranks holding its own on a collective, a send's size that of
    the receive it meets (a function of source, destination and tag), every number in bound."""
    start = draw(st.none() | _times)
    end = None if start is None else start + draw(_times)
    kind = draw(st.sampled_from(OpKind))
    others = _ints.filter(lambda r: r != rank)
    peer = draw(others) if kind.is_p2p else draw(st.none() | others)
    group = draw(st.lists(others, max_size=4, unique=True))
    if kind.is_collective:
        group.insert(draw(st.integers(0, len(group))), rank)
    tag = draw(_text)
    size = draw(_sizes)
    if kind.is_p2p:
        assert peer is not None
        src, dst = (rank, peer) if kind is OpKind.SEND else (peer, rank)
        size = float((src * 4097 + dst) * 16 + len(tag))
    return Op(kind=kind, stream=draw(_text), name=draw(_text),
              deps=tuple(draw(st.lists(st.integers(0, index - 1), max_size=3))) if index else (),
              layer=draw(st.none() | _ints), microbatch=draw(st.none() | _ints),
              phase=draw(st.none() | st.sampled_from(Phase)), flops=draw(_flops),
              mem_bytes=draw(_bytes), group=tuple(group), size_bytes=size,
              dtype=draw(_text), peer=peer, tag=tag, start=start, end=end)


@st.composite
def _traces(draw: st.DrawFn) -> Trace:
    ranks = draw(st.lists(_ints, max_size=3, unique=True))
    ops = {rank: tuple(draw(_ops(i, rank)) for i in range(draw(st.integers(0, 4))))
           for rank in ranks}
    return Trace(ops=ops, meta=TraceMeta(extras={"seed": draw(_text)}))


@settings(max_examples=60, deadline=None)
@given(_traces())
def test_any_trace_survives_the_json_text_round_trip(trace):
    assert io.from_json(json.loads(io.dumps(trace))) == trace


# --- layout and determinism ------------------------------------------------------------------

def test_a_transfer_of_unstated_size_meets_any_receive(tmp_path):
    timed = {"start": 0.0, "end": 1.0}
    trace = Trace({0: (Op(kind=OpKind.SEND, stream="p", peer=1, size_bytes=0.0, **timed),),
                   1: (Op(kind=OpKind.RECV, stream="p", peer=0, size_bytes=MiB, **timed),)})
    io.save(trace, tmp_path / "t.json")
    assert io.load(tmp_path / "t.json") == trace


def test_file_layout_has_schema_version_meta_and_string_rank_keys(tmp_path):
    io.save(plan_trace(), tmp_path / "p.json")
    document = json.loads((tmp_path / "p.json").read_text())
    assert list(document) == ["schema", "version", "meta", "ranks"]
    assert document["schema"] == "parasim.trace" and document["version"] == 3
    assert document["meta"] == meta_to_json(plan_trace().meta)
    assert document["meta"]["ranks"] == [0, 1] and document["meta"]["mfu"] == 0.41
    assert list(document["ranks"]) == ["0", "1"]
    assert document["ranks"]["0"][5] == {"kind": "all_reduce", "stream": "comm", "deps": [4],
                                         "group": [0, 1], "size_bytes": 12 * MiB,
                                         "dtype": "fp32"}


def test_defaults_are_omitted_but_falsy_non_defaults_are_kept():
    ops = (Op(kind=OpKind.COMPUTE, stream="compute"),
           Op(kind=OpKind.COMPUTE, stream="compute", layer=0, microbatch=0, start=0.0, end=0.0))
    ranks = io.to_json(Trace(ops={0: ops}))["ranks"]["0"]
    assert ranks[0] == {"kind": "compute", "stream": "compute"}
    assert ranks[1] == {"kind": "compute", "stream": "compute", "layer": 0, "microbatch": 0,
                        "start": 0.0, "end": 0.0}


def test_enums_and_tuples_are_written_as_plain_strings_and_lists():
    op = io.to_json(plan_trace())["ranks"]["0"][4]
    assert type(op["kind"]) is str and type(op["phase"]) is str and op["phase"] == "bwd"
    assert type(op["deps"]) is list


def test_two_saves_of_equal_traces_are_byte_identical(tmp_path):
    trace = timed_trace()
    shuffled = Trace(ops={1: trace.ops[1], 0: trace.ops[0]}, meta=trace.meta)
    io.save(trace, tmp_path / "a.json")
    io.save(shuffled, tmp_path / "b.json")
    first = (tmp_path / "a.json").read_bytes()
    assert first == (tmp_path / "b.json").read_bytes()
    assert b", " not in first and b": " not in first  # compact separators
    assert first.count(b"\n") == 1


def test_a_large_plan_stays_compact():
    op = Op(kind=OpKind.COMPUTE, stream="compute", name="mlp", layer=7, microbatch=3,
            phase=Phase.FWD, flops=1e12)
    text = io.dumps(Trace(ops={0: (op,) * 1000}))
    one = ('{"kind":"compute","stream":"compute","name":"mlp","layer":7,"microbatch":3,'
           '"phase":"fwd","flops":1000000000000.0}')
    # Each op costs its own 113 bytes and a comma; the header and the defaults cost nothing.
    assert text.count(one) == 1000
    assert len(text) < 1000 * (len(one) + 1) + 100


# --- bad files -------------------------------------------------------------------------------

def _valid() -> dict[str, Any]:
    return json.loads(io.dumps(plan_trace()))


def _set_op(rank: str, index: int, **changes: Any) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        document["ranks"][rank][index].update(changes)
    return mutate


def _del_op_field(rank: str, index: int, field: str) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        del document["ranks"][rank][index][field]
    return mutate


def _set(key: str, value: Any) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        document[key] = value
    return mutate


def _del(key: str) -> Callable[[dict], None]:
    return lambda document: document.pop(key)


def _rank_key(old: str, new: str) -> Callable[[dict], None]:
    def mutate(document: dict) -> None:
        document["ranks"][new] = document["ranks"].pop(old)
    return mutate


BAD_DOCUMENTS = {
    "schema missing": (_del("schema"), r"expected schema 'parasim\.trace', found no 'schema'"),
    "schema wrong": (_set("schema", "chrome.trace"), r"found schema string \"chrome\.trace\""),
    "version newer": (_set("version", 4), r"unsupported trace version int 4 \(supported: 1, 2, "
                                          r"3\)"),
    "version missing": (_del("version"), r"no trace 'version' \(supported: 1, 2, 3\)"),
    "version text": (_set("version", "1"), r"unsupported trace version string \"1\""),
    "version bool": (_set("version", True), r"unsupported trace version boolean true"),
    "meta not object": (_set("meta", [1]), r"'meta' must be an object, got list \[1\]"),
    "ranks missing": (_del("ranks"), r"'ranks' must be an object of rank -> op list, got null$"),
    "unknown top key": (_set("rank", {}), r"unknown top-level key 'rank'"),
    "rank key word": (_rank_key("1", "one"), r"rank key 'one' is not a non-negative decimal"),
    "rank key negative": (_rank_key("1", "-1"), r"rank key '-1' is not"),
    "rank key padded": (_rank_key("1", "01"), r"rank key '01' is not"),
    "ops not list": (lambda d: d["ranks"].update({"1": {"0": {}}}),
                     r"rank 1: ops must be a list, got object"),
    "op not object": (lambda d: d["ranks"]["1"].__setitem__(2, "send"),
                      r"rank 1, op 2: an op must be an object, got string \"send\""),
    "unknown field": (_set_op("0", 3, flop=1.0), r"rank 0, op 3, field 'flop': unknown op field"),
    "kind missing": (_del_op_field("1", 1, "kind"), r"rank 1, op 1, field 'kind': missing"),
    "stream missing": (_del_op_field("1", 1, "stream"), r"rank 1, op 1, field 'stream': missing"),
    "kind unknown": (_set_op("0", 5, kind="allreduce"),
                     r"rank 0, op 5, field 'kind': unknown OpKind value string \"allreduce\" "
                     r"\(expected one of: compute, all_reduce"),
    "kind not text": (_set_op("0", 5, kind=3), r"op 5, field 'kind': unknown OpKind value int 3"),
    "phase unknown": (_set_op("0", 0, phase="forward"),
                      r"rank 0, op 0, field 'phase': unknown Phase value string \"forward\""),
    "flops text": (_set_op("0", 0, flops="1e12"),
                   r"rank 0, op 0, field 'flops': must be a number, got string \"1e12\""),
    "flops bool": (_set_op("0", 0, flops=True), r"field 'flops': must be a number, got boolean"),
    "flops huge": (_set_op("0", 0, flops=10**400), r"field 'flops': must be a finite number"),
    "size null": (_set_op("0", 5, size_bytes=None),
                  r"field 'size_bytes': must be a number, got null$"),
    "layer float": (_set_op("0", 0, layer=1.5), r"field 'layer': must be an integer, got float"),
    "peer text": (_set_op("0", 1, peer="1"), r"rank 0, op 1, field 'peer': must be an integer"),
    "stream number": (_set_op("0", 1, stream=2), r"field 'stream': must be a string, got int 2"),
    "dtype list": (_set_op("0", 5, dtype=["bf16"]), r"field 'dtype': must be a string"),
    "deps not list": (_set_op("0", 4, deps=2),
                      r"rank 0, op 4, field 'deps': must be a list of integers, got int 2"),
    "deps floats": (_set_op("0", 4, deps=[2.0]), r"field 'deps': must be a list of integers"),
    "deps bools": (_set_op("0", 4, deps=[True]), r"field 'deps': must be a list of integers"),
    "group texts": (_set_op("0", 5, group=["0", "1"]),
                    r"rank 0, op 5, field 'group': must be a list of integers"),
    "dep forward": (_set_op("0", 4, deps=[2, 7]),
                    r"rank 0, op 4, field 'deps': dep 7 is not an earlier op of this rank "
                    r"\(deps point backwards: 0 <= dep < 4\)"),
    "dep self": (_set_op("1", 1, deps=[1]), r"rank 1, op 1, field 'deps': dep 1 is not an earlier"),
    "dep negative": (_set_op("1", 1, deps=[-1]), r"field 'deps': dep -1 is not an earlier"),
    "start alone": (_set_op("1", 2, start=1.0),
                    r"rank 1, op 2, field 'start': start and end must be given together"),
    "end alone": (_set_op("1", 2, end=1.0), r"field 'end': start and end must be given together"),
    "end early": (_set_op("1", 2, start=2.0, end=1.5),
                  r"rank 1, op 2, field 'end': end 1\.5 is before start 2\.0"),
    # issue 6: the loader accepted these, and a 5001-digit key raised a bare ValueError
    "rank key 5001 digits": (_rank_key("1", "1" * 5001), r"rank key '1111.*of at most 9 digits"),
    "rank key 10 digits": (_rank_key("1", "1" * 10), r"rank key '1111111111' is not"),
    "peer negative": (_set_op("0", 1, peer=-1), r"rank 0, op 1, field 'peer': must not be neg"),
    "peer self": (_set_op("0", 1, peer=0), r"field 'peer': 0 is this op's own rank"),
    "start negative": (_set_op("1", 2, start=-1.0, end=1.0), r"'start': must not be negative"),
    "send without peer": (_set_op("1", 2, peer=None), r"rank 1, op 2, field 'peer': a send needs"),
    "group empty": (_set_op("0", 5, group=[]), r"field 'group': a all_reduce needs a non-empty"),
    "group negative": (_set_op("0", 5, group=[0, -1]), r"field 'group': list \[0, -1\] must list"),
    "group duplicate": (_set_op("0", 5, group=[0, 1, 1]), r"'group': list \[0, 1, 1\] must list"),
    "flops negative": (_set_op("0", 0, flops=-1.0), r"'flops': must not be negative, got float"),
    "bytes negative": (_set_op("0", 0, mem_bytes=-5), r"'mem_bytes': must not be negative"),
    "size negative": (_set_op("0", 5, size_bytes=-1e6), r"'size_bytes': must not be negative"),
    "layer negative": (_set_op("0", 0, layer=-2), r"'layer': must not be negative, got int -2"),
    # the audit of issue 6: a collective on a group without its rank, a send and its receive
    # of different sizes (the replay ran them silently)
    "group without its rank": (_set_op("1", 0, kind="all_reduce", group=[0, 2], peer=None),
                               r"rank 1, op 0, field 'group': list \[0, 2\] does not hold this "
                               r"op's rank 1 \(a rank issues a collective only on a group it is "
                               r"in\)$"),
    "recv larger than its send": (_set_op("1", 0, size_bytes=8 * MiB),
                                  r"rank 1, op 0: recv of 8,388,608 B from rank 0 \(tag "
                                  r"'act', call #0\) meets rank 0's op 1, a send of 4,194,304 "
                                  r"B; a send and its receive move the same bytes$"),
    "send smaller than its recv": (_set_op("1", 2, size_bytes=1.0),
                                   r"rank 0, op 2: recv of 4,194,304 B from rank 1 \(tag "
                                   r"'grad', call #0\) meets rank 1's op 2, a send of 1 B"),
    # issue 22 item 4: a subnormal size divided by zero in the NCCL cost, a 1e300 size or a
    # 1e308 s duration answered 1e288 s; sizes, FLOPs, bytes and times now have physical bounds
    "size subnormal": (_set_op("0", 5, size_bytes=5e-324),
                       r"rank 0, op 5, field 'size_bytes': must be 0 \(unstated\) or 1 to "
                       r"1,099,511,627,776 bytes \(1 TiB\), got float 5e-324$"),
    "size half a byte": (_set_op("0", 5, size_bytes=0.5), r"'size_bytes': must be 0 \(unstated"),
    "size 1e300": (_set_op("0", 5, size_bytes=1e300), r"'size_bytes': must be 0 .* got float 1e"),
    "size past 1 TiB": (_set_op("0", 5, size_bytes=2**40 + 1), r"bytes \(1 TiB\), got int 10995"),
    "flops past a day": (_set_op("0", 0, flops=1e308),
                         r"rank 0, op 0, field 'flops': must be at most 1e\+22 \(a day at 1e17 "
                         r"FLOP/s\), got float 1e\+308$"),
    "bytes past a day": (_set_op("0", 0, mem_bytes=1e20),
                         r"field 'mem_bytes': must be at most 1e\+19 bytes \(a day at 1e14"),
    "end past a day": (_set_op("0", 0, start=0.0, end=1e308),
                       r"rank 0, op 0, field 'end': must be at most 86,400 s \(a day; a trace's "
                       r"times count from its start\), got float 1e\+308$"),
    "start past a day": (_set_op("0", 0, start=1e5, end=1e5), r"'start': must be at most 86,"),
}


@pytest.mark.parametrize("case", list(BAD_DOCUMENTS))
def test_bad_file_is_one_config_error_naming_file_and_place(tmp_path, case):
    mutate, message = BAD_DOCUMENTS[case]
    document = _valid()
    mutate(document)
    path = _dump(tmp_path / "bad.json", document)
    with pytest.raises(ConfigError, match=message) as caught:
        io.load(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


def test_a_trace_past_the_op_bound_is_refused_before_its_ops_are_built(tmp_path, monkeypatch):
    # issue 22 item 4: a 30 M-op file ran out of memory after 102 s; the count is checked on the
    # text before parsing, and exactly on the parsed ranks (an escaped key evades the first)
    from traces import op_rules
    document = _valid()
    total = sum(len(ops) for ops in document["ranks"].values())
    path = _dump(tmp_path / "big.json", document)
    monkeypatch.setattr(op_rules, "MAX_TRACE_OPS", total)
    assert sum(map(len, io.load(path).ops.values())) == total
    monkeypatch.setattr(op_rules, "MAX_TRACE_OPS", total - 1)
    with pytest.raises(ConfigError, match=rf"^{path}: the trace holds at least {total} ops, "
                                          rf"more than the {total - 1} parasim loads"):
        io.load(path)
    escaped = path.read_text().replace('"stream":', '"\\u0073tream":')
    path.write_text(escaped)
    with pytest.raises(ConfigError, match=rf"^{path}: the trace holds {total} ops, more than"):
        io.load(path)


@pytest.mark.parametrize(("content", "message"), [
    (b"{not json", r"bad\.json: not a JSON file: Expecting property name"),
    (b"", r"bad\.json: not a JSON file"),
    (b"\xff\xfe\xfa", r"bad\.json: not a JSON file"),
    (b'{"schema": "parasim.trace", "version": 1, "ranks": {"0": '
     b'[{"kind": "compute", "stream": "c", "flops": NaN}]}}',
     r"rank 0, op 0, field 'flops': must be a finite number, got float NaN"),
    (b"[1, 2]", r"bad\.json: expected a JSON object at the top, got list \[1, 2\]"),
])
def test_unreadable_content_is_a_config_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        io.load(path)


def test_missing_file_and_directory_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.json: cannot read: No such file"):
        io.load(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"cannot read: Is a directory"):
        io.load(tmp_path)


def test_from_json_names_its_source():
    with pytest.raises(ConfigError, match=r"^step 3: rank 0, op 0, field 'kind'"):
        io.from_json({"schema": io.SCHEMA, "version": 1, "ranks": {"0": [{"kind": "x"}]}},
                     source="step 3")


# --- atomic saves ----------------------------------------------------------------------------

def _boom(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")


def test_failed_serialization_leaves_no_file(tmp_path, monkeypatch):
    def broken_dumps(*args: object, **kwargs: object) -> str:
        raise ValueError("disk full of NaNs")

    monkeypatch.setattr(json_chunks.json, "dumps", broken_dumps)  # the writing encodes there
    with pytest.raises(ConfigError, match="cannot be written as JSON"):
        io.save(plan_trace(), tmp_path / "t.json")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_failed_write_leaves_no_file_and_no_temp_file(tmp_path, monkeypatch, step):
    monkeypatch.setattr(os, step, _boom)
    with pytest.raises(ConfigError, match=r"t\.json: cannot write: No space left on device"):
        io.save(plan_trace(), tmp_path / "t.json")
    assert os.listdir(tmp_path) == []


def test_interrupted_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    io.save(plan_trace(), path)
    before = path.read_bytes()

    real_fdopen = os.fdopen

    def half_then_interrupt(fd: int, *args: Any, **kwargs: Any) -> Any:
        handle = real_fdopen(fd, *args, **kwargs)
        real_write = handle.write

        def write(text: str) -> int:
            real_write(text[: len(text) // 2])
            raise KeyboardInterrupt

        handle.write = write
        return handle

    monkeypatch.setattr(os, "fdopen", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        io.save(timed_trace(), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["t.json"]


def test_saving_into_a_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"missing/t\.json: cannot write"):
        io.save(plan_trace(), tmp_path / "missing" / "t.json")


def test_saving_a_non_finite_number_is_refused_before_writing(tmp_path):
    op = Op(kind=OpKind.COMPUTE, stream="compute", flops=float("inf"))
    with pytest.raises(ConfigError, match="Out of range float"):
        io.save(Trace(ops={0: (op,)}), tmp_path / "t.json")
    assert os.listdir(tmp_path) == []
