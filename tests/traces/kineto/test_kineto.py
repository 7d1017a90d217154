"""traces.kineto: torch.profiler traces read as parasim traces.

A profile recorded here (DDP and plain collectives on 2 gloo processes), the two real GPU traces
in tests/data/kineto (read independently here to know what they hold), small hand-written
traces for the dependency rule, and broken files. Run: pytest tests/traces/kineto/test_kineto.py -q
"""

from __future__ import annotations

import datetime
import gc
import gzip
import json
import math
import os
import socket
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from traces import io
from traces.errors import ConfigError
from traces.kineto import load_kineto
from traces.kineto.comms import Facts, dtype_name, from_issue, from_record
from traces.ops import Op, OpKind, Trace

DATA = Path(__file__).parents[2] / "data" / "kineto"
TWO_RANK = DATA / "a100-2rank-nccl-rank0.json.gz"
EIGHT_RANK = DATA / "a100-8rank-pp-rank3.json.gz"

STEPS = 2
PARAMS = 16 * 32 + 32 + 32 * 8 + 8  # the recorded model's parameters: 808, one DDP bucket
TIMEOUT_S = 120
"""A guard against a hang, not a speed bound: the recording takes ~3 s on a quiet machine and
went past 15 s once beside a busy loop (issue 36's under-load run)."""


def comms(ops: tuple[Op, ...]) -> list[Op]:
    return [op for op in ops if op.kind != OpKind.COMPUTE]


def times(op: Op) -> tuple[float, float]:
    assert op.start is not None and op.end is not None, "timed"
    return op.start, op.end


def check_replayable(trace: Trace) -> None:
    """What a replay relies on: list order by start, deps backwards and across streams, each
    ending before its op starts (so overlap in the measurement stays possible)."""
    for ops in trace.ops.values():
        assert all(times(a)[0] <= times(b)[0] for a, b in zip(ops, ops[1:]))
        for index, op in enumerate(ops):
            assert times(op)[0] <= times(op)[1]
            for dep in op.deps:
                assert dep < index and ops[dep].stream != op.stream
                assert times(ops[dep])[1] <= times(op)[0]


# --- a profile recorded here: 2 gloo ranks -------------------------------------------------------

def _record(rank: int, port: int, out: str) -> None:
    """One rank: two DDP steps, then one of each collective, under torch.profiler."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's new name
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        x, t = torch.randn(4, 16), torch.ones(1000)
        for _ in range(2):  # DDP rebuilds its buckets in step 2 (two small broadcasts): not here
            ddp(x).sum().backward()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(STEPS):
                ddp(x).sum().backward()
            dist.all_reduce(t)
            work = dist.all_reduce(torch.ones(250, dtype=torch.float64), async_op=True)
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))
            work.wait()
            dist.broadcast(t, src=0)
            dist.all_gather([torch.empty(1000) for _ in range(2)], t)
            dist.all_gather_into_tensor(torch.empty(2000), t)
            dist.reduce_scatter_tensor(torch.empty(500), t)
            dist.reduce_scatter(torch.empty(500), list(t.chunk(2)))  # gloo: two all_reduces
            dist.all_to_all_single(torch.empty(1000), t)
            if rank == 0:
                dist.send(t, dst=1)
            else:
                dist.recv(t, src=0)
            dist.barrier()
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    finally:
        dist.destroy_process_group()


def _expected(rank: int) -> list[tuple[str, float, str]]:
    """(kind, bytes, dtype) of what `_record` issues, in order (nccl-tests sizes)."""
    return [*[("all_reduce", PARAMS * 4, "fp32")] * STEPS,
            ("all_reduce", 1000 * 4, "fp32"), ("all_reduce", 250 * 8, "fp64"),
            ("broadcast", 1000 * 4, "fp32"),
            ("all_gather", 2 * 1000 * 4, "fp32"), ("all_gather", 2 * 1000 * 4, "fp32"),
            ("reduce_scatter", 1000 * 4, "fp32"), ("reduce_scatter", 1000 * 4, "fp32"),
            ("all_to_all", 1000 * 4, "fp32"), ("send" if rank == 0 else "recv", 1000 * 4, "fp32"),
            ("all_reduce", 0.0, "unknown")]  # the barrier: no payload


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    import torch._dynamo  # noqa: F401  DDP imports it: once here, not in each rank (~3 s)
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("kineto")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # fork: the ranks inherit the imported torch instead of importing it again.
    context = mp.start_processes(_record, args=(port, str(out)), nprocs=2, join=False,
                                 start_method="fork")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"recording the gloo profile took over {TIMEOUT_S} s")
    return out


def test_recorded_collectives_equal_what_was_issued(recorded: Path) -> None:
    raw = json.loads((recorded / "rank0.json").read_text())["traceEvents"]
    names = Counter(e.get("name") for e in raw)
    # Each collective is in the file twice over (the call, and gloo's execution on its own
    # thread), so counting events would double them.
    assert names["c10d::allreduce_"] == STEPS + 2 and names["gloo:all_reduce"] >= STEPS + 2
    trace = load_kineto(recorded)
    assert trace.ranks == [0, 1]
    for rank in (0, 1):
        found = [(op.kind.value, op.size_bytes, op.dtype) for op in comms(trace.ops[rank])]
        assert found == _expected(rank)
    check_replayable(trace)


def test_recorded_groups_peers_and_meta(recorded: Path) -> None:
    trace = load_kineto(recorded)
    for rank in (0, 1):
        ops = comms(trace.ops[rank])
        assert {op.group for op in ops if op.kind.is_collective} == {(0, 1)}
        assert [op.peer for op in ops if op.kind.is_p2p] == [1 - rank]
        assert ops[-1].name == "barrier"
    meta = trace.meta
    assert (meta.source, meta.world_size, meta.ranks, meta.backend) == (
        "kineto", 2, (0, 1), "gloo")
    assert meta.process_groups[1] == [{"name": "0", "desc": "default_pg", "ranks": [0, 1]}]
    assert (meta.compute_from, meta.num_group_assumed, meta.skipped) == ("cpu", 0, {})


def test_recorded_compute_is_counted_once(recorded: Path) -> None:
    """Compute ops are the outermost CPU ops: none nested in another, none inside gloo's work."""
    trace = load_kineto(recorded)
    for ops in trace.ops.values():
        compute = [op for op in ops if op.kind == OpKind.COMPUTE]
        assert len({op.stream for op in compute}) == 1  # the main thread; gloo's hold none
        assert all(times(a)[1] <= times(b)[0] for a, b in zip(compute, compute[1:]))
        assert any(op.name == "aten::mm" for op in compute)


def test_recorded_all_reduce_follows_the_compute_that_issued_it(recorded: Path) -> None:
    """DDP's gradient all-reduce, issued from the autograd hook, depends on the compute op
    before the hook on the issuing thread (whether backward later waited for it depends on
    timing: a CPU trace records no wait)."""
    ops = load_kineto(recorded).ops[0]
    ddp = [op for op in ops if op.kind == OpKind.ALL_REDUCE and op.size_bytes == PARAMS * 4]
    assert len(ddp) == STEPS
    for op in ddp:
        [dep] = op.deps
        assert ops[dep].kind == OpKind.COMPUTE and ops[dep].stream.startswith("thread:")
        assert times(ops[dep])[1] <= times(op)[0]


# --- the two real GPU traces ---------------------------------------------------------------------

_BYTES = {"Float": 4, "Long": 8, "float": 4, "int": 4}
_KIND = {"allreduce": "all_reduce", "broadcast": "broadcast", "nccl:all_reduce": "all_reduce",
         "nccl:all_to_all": "all_to_all"}


def _raw_summary(path: Path) -> dict[str, Any]:
    """What the file holds, read here without traces.kineto: its device events, NCCL kernels
    and nccl:* annotations."""
    gc.disable()  # 35 MB of JSON: the collector would rescan it on every allocation burst
    try:
        with gzip.open(path) as file:
            events = json.load(file)["traceEvents"]
        return {
            "device": sum(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in events),
            "kernels": [e for e in events if e.get("cat") == "kernel"
                        and e["name"].startswith("ncclKernel")],
            "annotations": [e for e in events if e.get("cat") == "user_annotation"
                            and e["name"].startswith("nccl:")],
        }
    finally:
        gc.enable()


@pytest.fixture(scope="module")
def two_rank() -> tuple[Trace, dict[str, Any]]:
    return load_kineto(TWO_RANK), _raw_summary(TWO_RANK)


@pytest.fixture(scope="module")
def eight_rank() -> tuple[Trace, dict[str, Any]]:
    return load_kineto(EIGHT_RANK), _raw_summary(EIGHT_RANK)


def test_two_rank_trace_finds_each_nccl_kernel_once(two_rank: tuple[Trace, dict]) -> None:
    trace, raw = two_rank
    kernels = raw["kernels"]
    # Read here from the kernels' own args: kind, nccl-tests bytes and duration of each.
    expected = Counter((_KIND[k["args"]["Collective name"]],
                        k["args"]["Out msg nelems"] * _BYTES[k["args"]["dtype"]],
                        round(k["dur"], 3)) for k in kernels)
    ops = comms(trace.ops[0])
    assert len(ops) == len(kernels) == 21
    assert Counter((op.kind.value, op.size_bytes, round(op.duration * 1e6, 3))
                   for op in ops) == expected
    assert Counter(op.kind.value for op in ops) == {"all_reduce": 15, "broadcast": 6}
    assert {(op.group, op.stream) for op in ops} == {((0, 1), "cuda:40")}
    assert {op.dtype for op in ops} == {"fp32", "int64"}
    meta = trace.meta
    assert (meta.world_size, meta.ranks, meta.backend) == (2, (0,), "nccl")
    assert meta.skipped == {"wait for a collective": 6}
    assert (meta.num_size_unknown, meta.num_group_assumed) == (0, 0)
    check_replayable(trace)


def test_eight_rank_trace_finds_each_nccl_collective_once(eight_rank: tuple[Trace, dict]) -> None:
    trace, raw = eight_rank
    annotations = raw["annotations"]
    # Sizes are stated only by the nccl:* annotations: their input dims times the dtype.
    expected = Counter((_KIND[a["name"]], float(math.prod(a["args"]["Input Dims"][0])
                                                * _BYTES[a["args"]["Input type"][0]]))
                       for a in annotations)
    ops = comms(trace.ops[3])
    assert len(ops) == len(raw["kernels"]) == len(annotations) == 60
    assert Counter((op.kind.value, op.size_bytes) for op in ops) == expected
    assert Counter(op.kind.value for op in ops) == {"all_to_all": 42, "all_reduce": 18}
    # No group is stated: the whole world, and the meta says so.
    assert {(op.group, op.stream) for op in ops} == {(tuple(range(8)), "cuda:21")}
    assert trace.meta.num_group_assumed == 60 and trace.meta.world_size == 8
    assert trace.meta.skipped == {"communication record naming no collective": 42}
    check_replayable(trace)


def test_gpu_trace_compute_is_every_other_kernel_and_survives_a_round_trip(
        two_rank: tuple[Trace, dict]) -> None:
    trace, raw = two_rank
    assert len(trace.ops[0]) == raw["device"]  # every kernel once: NCCL's as collectives
    for stream in {op.stream for op in trace.ops[0]}:
        on = [op for op in trace.ops[0] if op.stream == stream]
        assert all(times(a)[1] <= times(b)[0] + 1e-9 for a, b in zip(on, on[1:]))
    assert io.from_json(json.loads(io.dumps(trace))) == trace


# --- the dependency rule, on hand-written traces -------------------------------------------------

def _doc(events: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    info = {"rank": 0, "world_size": 2, "backend": "nccl",
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}]}
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": events, **extra}


def _host(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op",
          **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _launch(ts: float, correlation: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return _host(name, ts, 1, cat="cuda_runtime", correlation=correlation)


def _kernel(name: str, ts: float, dur: float, stream: int, correlation: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
            "dur": dur, "args": {"stream": stream, "correlation": correlation}}


def _write(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def _gpu_step(c_start: float) -> list[dict[str, Any]]:
    """GEMM A; an all-reduce of its output (c10d > record > nccl: > launch, one kernel N);
    GEMM B running beside N; a stream wait, then GEMM C."""
    record: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1000,
                              "Out msg nelems": 1000, "dtype": "BFloat16",
                              "Process Group Ranks": "[0, 1]"}
    return [_launch(0, 1), _kernel("gemm_A", 10, 40, 7, 1),
            _host("c10d::allreduce_", 5, 10), _host("record_param_comms", 6, 8, **record),
            _host("nccl:all_reduce", 7, 6, cat="user_annotation"), _launch(8, 2),
            _kernel("ncclKernel_AllReduce_RING_LL_Sum_bfloat16", 50, 100, 40, 2),
            _launch(20, 3), _kernel("gemm_B", 50, 40, 7, 3),
            _host("cudaStreamWaitEvent", 30, 1, cat="cuda_runtime"),
            _launch(31, 4), _kernel("gemm_C", c_start, 10, 7, 4)]


def test_gpu_dependencies_follow_issue_and_wait(tmp_path: Path) -> None:
    trace = load_kineto(_write(tmp_path / "rank0.json", _doc(_gpu_step(c_start=150))))
    ops = trace.ops[0]
    assert [op.name for op in ops] == ["gemm_A", "gemm_B", "allreduce", "gemm_C"]
    assert (ops[2].size_bytes, ops[2].dtype, ops[2].group) == (2000.0, "bf16", (0, 1))
    # N waits for A (issued after it); B runs beside N (no edge); C waited for N.
    assert [op.deps for op in ops] == [(), (), (0,), (2,)]


def test_gpu_dependency_never_contradicts_the_measurement(tmp_path: Path) -> None:
    # C started before N ended: whatever the wait was for, it was not N.
    ops = load_kineto(_write(tmp_path / "rank0.json", _doc(_gpu_step(c_start=140)))).ops[0]
    assert [op.name for op in ops] == ["gemm_A", "gemm_B", "allreduce", "gemm_C"]
    assert ops[3].deps == ()


def test_cpu_dependencies_sync_and_async_collectives(tmp_path: Path) -> None:
    dims: dict[str, Any] = {"Input Dims": [[[1000]], []], "Input type": ["TensorList", ""]}
    gloo: dict[str, Any] = {"Input Dims": [[1000]], "Input type": ["float"]}
    events = [_host("aten::mm", 0, 10), _host("c10d::allreduce_", 12, 2, **dims),
              _host("gloo:all_reduce", 15, 23, tid=2, cat="user_annotation", **gloo),
              _host("aten::add", 40, 5),                      # after the synchronous wait
              _host("c10d::allreduce_", 50, 2, **dims),
              _host("aten::mul", 53, 7),                      # while the async one runs
              _host("gloo:all_reduce", 54, 16, tid=2, cat="user_annotation", **gloo),
              _host("aten::sub", 72, 3)]                      # after work.wait()
    document = _doc(events)
    document["distributedInfo"]["backend"] = "gloo"
    ops = load_kineto(_write(tmp_path / "rank0.json", document)).ops[0]
    assert [(op.name, op.stream) for op in ops] == [
        ("aten::mm", "thread:1"), ("allreduce", "comm:2"), ("aten::add", "thread:1"),
        ("aten::mul", "thread:1"), ("allreduce", "comm:2"), ("aten::sub", "thread:1")]
    # The first all-reduce follows mm and holds add back; the second follows add, runs beside
    # mul, and holds sub back.
    assert [op.deps for op in ops] == [(), (0,), (1,), (), (2,), (4,)]
    assert [op.size_bytes for op in comms(ops)] == [4000.0, 4000.0]


def test_folder_aligns_ranks_on_their_clocks(tmp_path: Path) -> None:
    for rank, base_ns in ((0, 10**15), (1, 10**15 + 500_000)):
        document = _doc([_host("aten::mm", 100, 10)], baseTimeNanoseconds=base_ns)
        document["distributedInfo"]["rank"] = rank
        _write(tmp_path / f"trace_{rank}.json", document)
    trace = load_kineto(tmp_path)
    assert [trace.ops[r][0].start for r in (0, 1)] == [0.0, pytest.approx(5e-4, abs=1e-12)]


def test_unknown_events_are_counted_not_guessed(tmp_path: Path) -> None:
    events = [_host("aten::mm", 0, 10), _host("x", 0, 1, cat="mystery"),
              {"ph": "C", "name": "memory", "ts": 3},
              _host("c10d::gather_", 20, 5), _host("record_param_comms", 30, 1)]
    trace = load_kineto(_write(tmp_path / "rank0.json", _doc(events)))
    assert trace.meta.skipped == {"category mystery": 1, "phase C": 1,
                                     "collective parasim does not model: gather": 1,
                                     "communication record naming no collective": 1}
    assert [op.name for op in trace.ops[0]] == ["aten::mm"]


def test_nccl_kernels_and_calls_that_lack_their_other_half(tmp_path: Path) -> None:
    events = [_kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                      10, 5, 9, 1),                       # no launch in the trace
              _kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 20, 5, 9, 2),
              _host("c10d::allreduce_", 30, 5),            # its kernel fell outside the profile
              _host("nccl:all_reduce", 31, 3, cat="user_annotation")]
    trace = load_kineto(_write(tmp_path / "rank0.json", _doc(events)))
    [gather] = comms(trace.ops[0])
    assert (gather.kind, gather.size_bytes, gather.group) == (OpKind.ALL_GATHER, 0.0, (0, 1))
    assert trace.meta.num_size_unknown == 1
    assert trace.meta.skipped == {"NCCL kernel of unknown kind": 1,
                                     "collective call whose NCCL kernel is not in the trace": 1}


def test_traces_does_not_import_torch() -> None:
    code = "import sys, traces.kineto; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=Path(__file__).parents[3])
    assert result.stdout.strip() == "False"


# --- what an event states ------------------------------------------------------------------------

def test_sizes_follow_nccl_tests() -> None:
    def size(facts: Facts, group: int = 4) -> float:
        return facts.size_bytes(group)

    gather = {"Collective name": "_allgather_base", "In msg nelems": 10, "Out msg nelems": 40,
              "dtype": "Half"}
    scatter = {**gather, "Collective name": "reduce_scatter_tensor_coalesced",
               "In msg nelems": 40, "Out msg nelems": 10}
    assert size(from_record(gather)) == size(from_record(scatter)) == 40 * 2  # the larger side
    per_rank = {"Input Dims": [[], [[10]]], "Input type": ["", "TensorList"]}
    assert size(from_issue("c10d::allgather_", per_rank)) == 0.0  # no dtype stated
    facts = from_issue("c10d::allgather_", per_rank)
    facts.dtype = "fp32"
    assert size(facts) == 4 * 10 * 4  # each rank's input times the group
    assert from_issue("c10d::send", {"Concrete Inputs": ["", "", "3", "0"]}).peer == 3
    assert [dtype_name(t) for t in ("c10::BFloat16", "long int", "Float", "c10::Float8_e4m3fn",
                                    "weird")] == ["bf16", "int64", "fp32", "fp8_e4m3", "weird"]


# --- broken files: one line naming the file ------------------------------------------------------

def _error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_kineto(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_broken_files_give_one_line(tmp_path: Path) -> None:
    text = json.dumps(_doc([_host("aten::mm", 0, 10)]))
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    assert "not valid JSON" in _error(tmp_path / "cut.json")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(text.encode())[:40])
    assert "corrupt or truncated gzip" in _error(tmp_path / "cut.json.gz")
    (tmp_path / "plain.json.gz").write_text(text)
    assert "not a gzip file" in _error(tmp_path / "plain.json.gz")
    _write(tmp_path / "other.json", {"rows": [1, 2]})
    assert "not a PyTorch profiler trace" in _error(tmp_path / "other.json")
    _write(tmp_path / "list.json", [{"ph": "X"}])
    assert "not a PyTorch profiler trace" in _error(tmp_path / "list.json")
    _write(tmp_path / "v2.json", {**_doc([]), "schemaVersion": 2})
    assert "unsupported kineto schemaVersion 2" in _error(tmp_path / "v2.json")
    _write(tmp_path / "plan.json", {"schema": "parasim.trace", "version": 1, "ranks": {}})
    assert "a parasim trace" in _error(tmp_path / "plan.json")
    _write(tmp_path / "nameless.json", {"schemaVersion": 1, "traceEvents": []})
    assert "cannot tell whose rank" in _error(tmp_path / "nameless.json")
    assert "no such file" in _error(tmp_path / "absent.json")


def test_gzip_bomb_stops_at_the_bound(tmp_path: Path) -> None:
    # 5 MB of JSON in a 5 KB gzip; read with a 1 MiB bound.
    event = json.dumps(_host("aten::mm", 0, 10)).encode()
    bomb = b'{"schemaVersion": 1, "traceEvents": [' + event + b" " * 5_000_000 + b"]}"
    (tmp_path / "rank0.json.gz").write_bytes(gzip.compress(bomb))
    assert "more than 1048576 bytes" in _error(tmp_path / "rank0.json.gz", max_bytes=2**20)
    assert load_kineto(tmp_path / "rank0.json.gz", max_bytes=2**23).ranks == [0]


def test_folder_errors(tmp_path: Path) -> None:
    assert "no profiler traces" in _error(tmp_path)
    for name in ("a.json", "b.json"):
        _write(tmp_path / name, _doc([_host("aten::mm", 0, 10)]))
    assert "rank 0 again" in _error(tmp_path)


# --- malformed events are errors; well-formed ones parasim cannot use are counted (issue 22) ----

_MM = _host("aten::mm", 0, 10)


@pytest.mark.parametrize(("event", "needle"), [
    ({**_MM, "tid": [1]}, "traceEvents[1] ('aten::mm'): tid [1] is not an integer or a string"),
    ({**_MM, "pid": {"a": 1}}, "pid {'a': 1} is not an integer or a string"),
    ({**_MM, "cat": ["cpu_op"]}, "cat ['cpu_op'] is not a string"),
    ({**_MM, "ph": ["X"]}, "ph ['X'] is not a string"),
    ({**_MM, "ph": None}, "ph None is not a string"),
    ({**_MM, "tid": True}, "tid True is not an integer or a string"),
    ({**_MM, "dur": -3}, "dur -3 is negative"),
    ({**_MM, "ts": "3"}, "ts '3' is not a finite number"),
    ({**_MM, "ts": 10**400}, "ts 1000000000"),
    ({**_MM, "dur": None}, "dur None is not a finite number"),
    ({**_MM, "name": 7}, "name 7 is not a string"),
    ({**_MM, "args": [1]}, "args [1] is not a JSON object"),
    ([1, 2], "traceEvents[1]: [1, 2] is not a JSON object"),
    ({"ph": "M", "name": "thread_name", "tid": [[1]]}, "tid [[1]] is not"),
])
def test_a_malformed_event_makes_the_file_an_error_naming_it(tmp_path, event, needle):
    message = _error(_write(tmp_path / "rank0.json", _doc([_MM, event])))
    assert needle in message, message


@pytest.mark.parametrize(("info", "needle"), [
    ({"world_size": 0}, "distributedInfo.world_size 0 is not a world size"),
    ({"world_size": "2"}, "distributedInfo.world_size '2' is not a world size"),
    ({"rank": -1}, "distributedInfo.rank -1 is not a rank"),
    ({"pg_config": [{"pg_name": "0", "ranks": [0, 5]}]},
     "group '0' names rank 5, outside the world of 2 ranks"),
    ({"pg_config": [{"pg_name": "0", "ranks": [0, 0]}]}, "ranks [0, 0] are not distinct"),
    ({"pg_config": [{"ranks": [0]}]}, "pg_config[0]: {'ranks': [0]} is not a group"),
    ({"pg_config": "0,1"}, "pg_config '0,1' is not a list"),
])
def test_impossible_distributed_info_is_an_error(tmp_path, info, needle):
    document = _doc([_MM])
    document["distributedInfo"].update(info)
    assert needle in _error(_write(tmp_path / "rank0.json", document))


def test_a_record_naming_ranks_outside_the_world_is_an_error(tmp_path):
    record = _host("record_param_comms", 20, 5, **{"Collective name": "allreduce",
                                                   "Process Group Ranks": "[0, 7]"})
    message = _error(_write(tmp_path / "rank0.json", _doc([_MM, _host("c10d::allreduce_", 20, 5),
                                                          record])))
    assert "[0, 7] are not distinct ranks of the world of 2" in message, message


def test_a_trace_with_nothing_usable_is_an_error(tmp_path):
    events = [_host("c10d::gather_", 20, 5), {"ph": "C", "name": "memory", "ts": 3}]
    message = _error(_write(tmp_path / "rank0.json", _doc(events)))
    assert "nothing parasim can use" in message
    assert "1 collective parasim does not model: gather, 1 phase C" in message
    assert "nothing parasim can use" in _error(_write(tmp_path / "rank0.json", _doc([])))


def test_what_is_left_out_is_counted_by_reason(tmp_path):
    from traces.kineto import dropped

    events = [_MM, _host("c10d::gather_", 20, 5), _host("c10d::gather_", 30, 5),
              _host("x", 0, 1, cat="mystery"), _host("record_param_comms", 40, 1)]
    trace = load_kineto(_write(tmp_path / "rank0.json", _doc(events)))
    assert dropped(trace.meta.skipped) == {"category mystery": 1,
                                           "collective parasim does not model: gather": 2}
