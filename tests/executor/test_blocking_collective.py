"""A synchronous collective on the compute stream must not stop a CPU rank's side streams.

Rank 1 queues two sends on one side stream and then joins an all-reduce; rank 0 receives
both (its receives posted late, after a pause) before it joins. The second send can only go
out once the first completes, which is after rank 1 has entered the all-reduce: unless the
interpreter keeps issuing while it blocks, the job deadlocks (zb1p's grad-norm all-reduce
did, now and then, on gloo)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.comm import Comm
from executor.groups import Groups
from executor.interpreter import _StepRun
from executor.launch import RankContext, spawn
from executor.recorder import Recorder, new_buffer
from traces.ops import Stream

PAUSE_S = 0.5  # rank 0's receives go out this late: rank 1 is in the all-reduce by then
SIDE = "pp"


@dataclass(frozen=True)
class _Op:
    stream: str


def _rank(ctx: RankContext) -> list[float]:
    group = (0, 1)
    comm = Comm(Groups.create([(Stream.COMPUTE, group)], ctx.timeout_s))
    first, second, total = torch.zeros(1), torch.zeros(1), torch.tensor([float(ctx.rank + 1)])
    if ctx.rank == 1:
        streams = [SIDE, SIDE, Stream.COMPUTE]
        calls = [lambda: comm.send(torch.tensor([7.0]), 0, "act"),
                 lambda: comm.send(torch.tensor([9.0]), 0, "act"),
                 lambda: comm.all_reduce(total, (Stream.COMPUTE, group))]
        deps: list[tuple[int, ...]] = [(), (), ()]
    else:
        streams = [Stream.COMPUTE, SIDE, SIDE, Stream.COMPUTE]
        calls = [lambda: time.sleep(PAUSE_S),
                 lambda: comm.recv(first, 1, "act"),
                 lambda: comm.recv(second, 1, "act"),
                 lambda: comm.all_reduce(total, (Stream.COMPUTE, group))]
        deps = [(), (0,), (0,), (1, 2)]
    ops = [_Op(s) for s in streams]
    interp = SimpleNamespace(
        ops=ops, on_compute=[s == Stream.COMPUTE for s in streams], deps=deps, calls=calls,
        recorder=Recorder(new_buffer(len(ops))), cuda=False, peak_bytes=lambda: 0,
        comm=comm)
    _StepRun(interp).all()  # type: ignore[arg-type]
    return [float(first), float(second), float(total)]


def test_a_blocked_rank_still_sends_what_its_peer_needs() -> None:
    results, _ = spawn(_rank, 2, timeout_s=30)
    assert results[0] == [7.0, 9.0, 3.0]
    assert results[1][2] == 3.0
