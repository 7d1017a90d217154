"""An asynchronous all-gather into a slice of a parameter buffer must leave the buffer's
version counter alone: gloo's worker thread writes the output with `copy_`, and a bump of the
counter every parameter view shares, landing while the main thread saves one of them for
backward, makes torch refuse the save ("a saved tensor pack hook is modifying its input in
place"). The executor's tests hit it 1 run in 3 under load, with overlap_param_gather's
bucket gathers in flight beside the forward. `executor.comm.own_counter` gives the gather a
counter of its own over the same memory."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.comm import Comm, own_counter
from executor.groups import Groups
from executor.launch import RankContext, spawn
from traces.ops import Stream

N = 1 << 16


def _rank(ctx: RankContext) -> dict[str, list[float]]:
    """Each way of passing the output: the buffer's version before the gather, after it was
    issued and after it completed; and the values gathered into the slice."""
    group = (0, 1)
    comm = Comm(Groups.create([(Stream.DP, group)], ctx.timeout_s))
    seen: dict[str, list[float]] = {}
    for how in ("plain view", "own counter"):
        full = torch.zeros(4 * N)
        out = full[N:3 * N]
        if how == "own counter":
            out = own_counter(out)
        mine = torch.full((N,), float(ctx.rank + 1))
        before = full._version
        handle = comm.all_gather(out, mine, (Stream.DP, group), async_op=True)
        issued = full._version
        handle.wait()
        seen[how] = [before, issued, full._version,
                     float(full[N:2 * N].sum()), float(full[2 * N:3 * N].sum()),
                     float(full[:N].sum() + full[3 * N:].sum())]
    return seen


def test_a_gather_into_its_own_counter_leaves_the_buffers_version() -> None:
    results, _ = spawn(_rank, 2, timeout_s=60)
    for seen in results:
        plain, own = seen["plain view"], seen["own counter"]
        # bumped by the gather (by gloo's thread on completion: after the issue when the
        # main thread looks first, which a loaded machine may not let it do)
        assert plain[0] < plain[2]
        assert own[0] == own[1] == own[2]  # never
        assert own[3:] == plain[3:] == [1.0 * N, 2.0 * N, 0.0]  # the same memory written
