"""Chrome trace-event (Perfetto) export: one "X" event per op at the right time and place, named
processes and threads, valid JSON, plans refused. Run: pytest tests/traces/test_chrome.py -q
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from typing import Any

import pytest

from traces import chrome
from traces.errors import ConfigError
from traces.gzipped import text_or_gzip
from traces.header import TraceMeta
from traces.header_json import meta_from_json
from traces.io import VERSION
from traces.ops import Op, OpKind, Phase, Trace

MiB = 2**20


def step_trace() -> Trace:
    """Two ranks of a pipeline: compute (incl. recompute), a DP all-reduce, send and recv."""
    rank0 = [
        (Op(kind=OpKind.COMPUTE, stream="compute", name="attn", layer=3, microbatch=5,
            phase=Phase.FWD, flops=2e12, mem_bytes=4e8), 0.0, 1.25e-3),
        (Op(kind=OpKind.SEND, stream="p2p", deps=(0,), peer=5, size_bytes=4 * MiB, tag="act"),
         1.25e-3, 1.5e-3),
        (Op(kind=OpKind.COMPUTE, stream="compute", name="attn", layer=3, microbatch=5,
            phase=Phase.RECOMPUTE, flops=2e12), 1.25e-3, 2.5e-3),
        (Op(kind=OpKind.ALL_REDUCE, stream="dp", deps=(2,), group=(0, 4), size_bytes=12 * MiB,
            dtype="fp32"), 2.5e-3, 4.1e-3),
    ]
    rank5 = [
        (Op(kind=OpKind.RECV, stream="p2p", peer=4, size_bytes=4 * MiB, tag="act"), 0.0, 1.5e-3),
        (Op(kind=OpKind.COMPUTE, stream="compute", name="mlp", layer=0, microbatch=0,
            phase=Phase.BWD, deps=(0,)), 1.5e-3, 3.0e-3),
        (Op(kind=OpKind.RECV, stream="p2p", peer=4, tag="act"), 3.0e-3, 3.0e-3),
    ]
    ops = {rank: tuple(dataclasses.replace(op, start=start, end=end) for op, start, end in ops)
           for rank, ops in ((5, rank5), (0, rank0))}
    return Trace(ops=ops, meta=TraceMeta(experiment="gpt-tiny", extras={"pp": 2}))


def _complete(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [event for event in document["traceEvents"] if event["ph"] == "X"]


def _metadata(document: dict[str, Any], name: str) -> dict[tuple[int, int], Any]:
    return {(e["pid"], e["tid"]): e["args"] for e in document["traceEvents"]
            if e["ph"] == "M" and e["name"] == name}


def test_one_complete_event_per_op_in_rank_order_with_times_in_microseconds():
    trace = step_trace()
    events = _complete(chrome.to_chrome(trace))
    assert len(events) == trace.num_ops() == 7
    ops = [(rank, op) for rank in sorted(trace.ops) for op in trace.ops[rank]]
    for event, (rank, op) in zip(events, ops):
        assert event["pid"] == rank
        assert event["cat"] == str(op.kind)
        assert event["ts"] == pytest.approx(op.start * 1e6, abs=1e-3)
        assert event["dur"] == pytest.approx((op.end - op.start) * 1e6, abs=1e-3)
    assert events[3]["ts"] == 2500.0 and events[3]["dur"] == pytest.approx(1600.0)


def test_every_event_is_complete_or_metadata():
    document = chrome.to_chrome(step_trace())
    assert {event["ph"] for event in document["traceEvents"]} == {"X", "M"}
    assert document["displayTimeUnit"] == "ms"
    assert document["otherData"] == {"experiment": "gpt-tiny", "pp": 2}


def test_export_is_valid_json_that_round_trips():
    document = chrome.to_chrome(step_trace())
    assert json.loads(json.dumps(document, allow_nan=False)) == document


def test_streams_become_threads_in_a_stable_order_compute_first():
    trace = step_trace()
    document = chrome.to_chrome(trace)
    names = _metadata(document, "thread_name")
    # the plan's streams in Stream order (compute, ..., dp), then others ("p2p") by name
    assert names == {(0, 0): {"name": "compute"}, (0, 1): {"name": "dp"},
                     (0, 2): {"name": "p2p"}, (5, 0): {"name": "compute"},
                     (5, 1): {"name": "p2p"}}
    ops = [op for rank in sorted(trace.ops) for op in trace.ops[rank]]
    for event, op in zip(_complete(document), ops):
        assert names[event["pid"], event["tid"]]["name"] == op.stream


def test_thread_ids_do_not_depend_on_the_order_of_ops():
    assert chrome.stream_ids(["zero_rs", "p2p", "compute", "send_prev", "dp"]) == \
        chrome.stream_ids(["dp", "compute", "send_prev", "zero_rs", "p2p"]) == \
        {"compute": 0, "send_prev": 1, "dp": 2, "zero_rs": 3, "p2p": 4}


def test_ranks_become_named_processes():
    names = _metadata(chrome.to_chrome(step_trace()), "process_name")
    assert sorted(args["name"] for args in names.values()) == ["rank 0", "rank 5"]
    assert {pid for pid, _ in names} == {0, 5}


def test_event_names_say_what_the_op_is():
    names = [event["name"] for event in _complete(chrome.to_chrome(step_trace()))]
    assert names == ["attn fwd L3 mb5", "send->5", "attn recompute L3 mb5", "all_reduce 12.0MiB",
                     "recv<-4", "mlp bwd L0 mb0", "recv<-4"]


def test_sizes_in_names_use_binary_units():
    assert chrome.binary_size(512) == "512B"
    assert chrome.binary_size(1536) == "1.5KiB"
    assert chrome.binary_size(3 * 2**30) == "3.0GiB"


def test_args_hold_only_the_non_default_fields():
    events = _complete(chrome.to_chrome(step_trace()))
    assert events[0]["args"] == {"layer": 3, "microbatch": 5, "phase": "fwd", "flops": 2e12,
                                 "mem_bytes": 4e8}
    assert events[1]["args"] == {"peer": 5, "size_bytes": 4 * MiB, "tag": "act"}
    assert events[3]["args"] == {"group": [0, 4], "size_bytes": 12 * MiB, "dtype": "fp32"}
    assert events[5]["args"] == {"layer": 0, "microbatch": 0, "phase": "bwd"}  # zeros are kept
    assert type(events[0]["args"]["phase"]) is str


def test_back_to_back_ops_still_touch_after_nanosecond_rounding():
    # Perfetto turns ts and dur into integer nanoseconds with llround(x * 1000); an op that
    # ends where the next starts must not overlap it or leave a gap on the track.
    ops = []
    start = 0.1
    for index in range(50):
        end = start + 1e-6 / 3 + index * 1.1e-7
        ops.append(Op(kind=OpKind.COMPUTE, stream="compute", start=start, end=end))
        start = end
    events = _complete(chrome.to_chrome(Trace(ops={0: tuple(ops)})))
    for first, second in zip(events, events[1:]):
        first_end_ns = round(first["ts"] * 1000) + round(first["dur"] * 1000)
        assert first_end_ns == round(second["ts"] * 1000)


def test_a_plan_is_refused():
    plan = Trace(ops={0: (Op(kind=OpKind.COMPUTE, stream="compute"),)})
    with pytest.raises(ConfigError, match=r"trace is not timed: rank 0 op 0 has no start/end"):
        chrome.to_chrome(plan)


def test_a_partly_timed_trace_is_refused_naming_the_first_untimed_op():
    trace = step_trace()
    ops = {**trace.ops, 5: (*trace.ops[5], Op(kind=OpKind.COMPUTE, stream="compute"))}
    with pytest.raises(ConfigError, match=r"is not timed: rank 5 op 3 "):
        chrome.to_chrome(Trace(ops=ops))


def test_save_chrome_writes_the_document(tmp_path):
    path = tmp_path / "step.json"
    chrome.save_chrome(step_trace(), path)
    assert json.loads(path.read_text()) == chrome.to_chrome(step_trace())
    assert os.listdir(tmp_path) == ["step.json"]


def test_failed_save_chrome_leaves_no_file(tmp_path, monkeypatch):
    def no_space(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(ConfigError, match=r"step\.json: cannot write: No space left"):
        chrome.save_chrome(step_trace(), tmp_path / "step.json")
    assert os.listdir(tmp_path) == []


def test_save_chrome_of_a_plan_writes_nothing(tmp_path):
    plan = Trace(ops={0: (Op(kind=OpKind.COMPUTE, stream="compute"),)})
    with pytest.raises(ConfigError, match="is not timed"):
        chrome.save_chrome(plan, tmp_path / "step.json")
    assert os.listdir(tmp_path) == []


# --- what a simulated step adds: names, flows, memory, gzip ----------------------------------

LAYOUT = {"tp": 2, "cp": 1, "pp": 2, "dp": 2, "vp": 1, "sp": False, "zero": 0,
          "schedule": "1f1b", "micro_batch": 1, "global_batch": 4, "recompute": "none",
          "bucket_bytes": 26214400, "overlap_grad_reduce": True, "fp32_main_grads": False}


def pipeline_trace(meta: dict[str, Any]) -> Trace:
    """Ranks 0 and 4 (pp 0 and pp 1 of tp 2 x dp 2 x pp 2), `meta` as a file states it: two
    activations sent 0 -> 4, a gradient back, and a send whose receive is not in the trace."""
    def op(kind: OpKind, stream: str, peer: int, tag: str, start: float, end: float) -> Op:
        return Op(kind=kind, stream=stream, peer=peer, tag=tag, size_bytes=MiB, start=start,
                  end=end)

    compute = Op(kind=OpKind.COMPUTE, stream="compute", name="fc1", start=0.0, end=1e-3)
    rank0 = (compute, op(OpKind.SEND, "send_next", 4, "act", 1e-3, 2e-3),
             op(OpKind.SEND, "send_next", 4, "act", 2e-3, 3e-3),
             op(OpKind.RECV, "recv_next", 4, "grad", 5e-3, 6e-3),
             op(OpKind.SEND, "send_next", 6, "act", 6e-3, 7e-3))
    rank4 = (op(OpKind.RECV, "recv_prev", 0, "act", 1e-3, 2e-3),
             op(OpKind.RECV, "recv_prev", 0, "act", 2e-3, 3e-3),
             op(OpKind.SEND, "send_prev", 0, "grad", 5e-3, 6e-3))
    return Trace(ops={0: rank0, 4: rank4}, meta=meta_from_json(meta, VERSION))


def test_processes_say_their_pipeline_rank_and_what_they_stand_for():
    folded = pipeline_trace({"layout": LAYOUT, "devices": "GPUs",
                             "fold": {"axes": ["tp", "dp"], "layout": LAYOUT}})
    names = _metadata(chrome.to_chrome(folded), "process_name")
    assert names[0, 0]["name"] == "pp 0 · rank 0 (stands for 4 GPUs: tp 2 × dp 2)"
    assert names[4, 0]["name"] == "pp 1 · rank 4 (stands for 4 GPUs: tp 2 × dp 2)"
    unfolded = _metadata(chrome.to_chrome(pipeline_trace({"layout": LAYOUT})), "process_name")
    assert unfolded[4, 0]["name"] == "rank 4 (pp 1, tp 0, dp 0)"


def test_a_flow_arrow_joins_each_send_to_its_receive():
    document = chrome.to_chrome(pipeline_trace({"layout": LAYOUT}))
    flows = [e for e in document["traceEvents"] if e["ph"] in ("s", "f")]
    slices = _complete(document)
    tids = {(e["pid"], e["tid"]): n["name"] for (e, n) in
            ((e, e["args"]) for e in document["traceEvents"] if e["name"] == "thread_name")}
    pairs = {}
    for e in flows:
        pairs.setdefault(e["id"], {})[e["ph"]] = e
    # the k-th send 0 -> 4 "act" meets the k-th receive; the grad goes back; the send to 6
    # has no receive in the trace, so no arrow
    assert len(pairs) == 3
    for pair in pairs.values():
        start, finish = pair["s"], pair["f"]
        assert start["cat"] == finish["cat"] == "p2p" and finish["bp"] == "e"
        # each end sits inside a slice of its thread: the send's and the receive's
        for end, kind in ((start, "send"), (finish, "recv")):
            inside = [s for s in slices if s["pid"] == end["pid"] and s["tid"] == end["tid"]
                      and s["ts"] < end["ts"] < s["ts"] + s["dur"]]
            assert len(inside) == 1 and inside[0]["name"].startswith(kind)
        assert tids[start["pid"], start["tid"]].startswith("send")
    acts = sorted((p["s"]["ts"], p["f"]["ts"]) for p in pairs.values() if p["s"]["name"] == "act")
    assert acts == [(1500.0, 1500.0), (2500.0, 2500.0)]


def test_memory_becomes_a_counter_track_per_rank():
    memory = {"0": [[0.0, 2**30], [1e-3, 3 * 2**30]], "4": [[0.0, 2**29]]}
    document = chrome.to_chrome(pipeline_trace({"memory": memory}))
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    assert [(e["pid"], e["ts"], e["args"]) for e in counters] == [
        (0, 0.0, {"GiB": 1.0}), (0, 1000.0, {"GiB": 3.0}), (4, 0.0, {"GiB": 0.5})]
    assert {e["name"] for e in counters} == {"memory"}


def test_malformed_memory_is_a_user_error():
    with pytest.raises(ConfigError, match=r"meta.memory must map ranks"):
        chrome.to_chrome(pipeline_trace({"memory": {"0": [1, 2]}}))


def test_a_gz_path_gets_gzip_with_the_same_document(tmp_path):
    trace = pipeline_trace({"layout": LAYOUT})
    plain, packed = tmp_path / "step.json", tmp_path / "step.json.gz"
    chrome.save_chrome(trace, plain)
    chrome.save_chrome(trace, packed)
    raw = packed.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw) == plain.read_bytes()
    chrome.save_chrome(trace, tmp_path / "again.json.gz")
    assert (tmp_path / "again.json.gz").read_bytes() == raw  # mtime 0: same bytes
    assert text_or_gzip("{}", "a.json") == "{}"
