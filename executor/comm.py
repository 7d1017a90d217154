"""The one door to torch.distributed: every collective and send/recv the executor makes.

Each call names its communicator by `GroupKey` (stream, ranks) and may be asynchronous; it
returns a `Handle` whose `wait()` blocks until the work is done and then runs the caller's
completion step (copy a reduced shard into place, free a buffer) on the calling thread. With
`record=True` every call is logged as a `CommCall` (kind, group, bytes as nccl-tests counts
them, peer, tag), so a test can check that a rank made exactly the plan's communication, in
order, and nothing else.

Sizes (nccl-tests convention, as the plan's `size_bytes`): all_reduce and broadcast the tensor;
all_gather the gathered output; reduce_scatter the full input; all_to_all the input; send and
recv the message. An all-to-all with uneven splits also records what it sends each peer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from executor.groups import GroupKey, Groups
from traces.ops import OpKind

P2P_TAGS = {"act": 1, "grad": 2, "cp": 3, "cp_grad": 4}  # pipeline; CP ring (traces.plan.context)
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
# torch >= 2.12 names them *_single; older releases *_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True, slots=True)
class CommCall:
    kind: OpKind
    group: tuple[int, ...] = ()
    size_bytes: int = 0
    peer: int | None = None
    tag: str = ""
    reduce: str = ""
    stream: str = ""
    splits: tuple[int, ...] = ()
    """An all-to-all with uneven splits: the bytes it sends each member, in group order."""


class Handle:
    """An issued call: `wait()` blocks until done, then runs `then` once (on the caller's
    thread). `watch(callback)` learns of completion without blocking, after which
    `finished()` answers without blocking either."""

    __slots__ = ("work", "then", "done", "notify", "_flag", "_waiter")

    def __init__(self, work: dist.Work | None, then: Callable[[], None] | None = None) -> None:
        self.work, self.then, self.done = work, then, False
        self.notify: threading.Event | None = None
        """Set too when a watched work completes (a waiting interpreter wakes up)."""
        self._flag: threading.Event | None = None
        self._waiter = False

    def wait(self) -> None:
        if self.done:
            return
        if self._waiter:
            # A thread waits on the work already: gloo's send/recv hand their completion to
            # one waiter only, so a second `work.wait()` would block for ever.
            assert self._flag is not None
            self._flag.wait()
        elif self.work is not None:
            self.work.wait()
        self.done = True
        if self.then is not None:
            self.then()

    def watch(self, callback: Callable[[], None] | None = None) -> None:
        """Call `callback` (on another thread) as soon as the work completes: from the work's
        future, or — gloo's reduce-scatter and send/recv have none, and report completion
        only to `wait` — from a daemon thread that waits on it."""
        flag = self._flag = threading.Event()

        def fire(_: object = None) -> None:
            if callback is not None:
                callback()
            flag.set()
            if self.notify is not None:
                self.notify.set()

        if self.work is None or self.done:
            fire()
            return
        try:
            future = self.work.get_future()
        except RuntimeError:  # "Work::getFuture not implemented"
            work = self.work

            def waiter() -> None:
                work.wait()
                fire()

            self._waiter = True
            threading.Thread(target=waiter, daemon=True, name="parasim-wait").start()
            return
        future.then(fire)

    def finished(self) -> bool:
        if self.done or self.work is None:
            return True
        if self._flag is not None:
            return self._flag.is_set()
        return self.work.is_completed()


def own_counter(view: torch.Tensor) -> torch.Tensor:
    """`view`'s memory under a version counter of its own, for an asynchronous collective to
    write into. On CPU gloo's worker thread writes its output with `copy_`, which bumps the
    version counter every view of the buffer shares; were the main thread meanwhile saving
    another view of it for backward (a parameter of the layer running while later buckets are
    gathered), torch would refuse the save ("a saved tensor pack hook is modifying its input
    in place"), seen 1 run in 3 of the executor tests under load."""
    return torch.empty(0, dtype=view.dtype, device=view.device).set_(
        view.untyped_storage(), view.storage_offset(), view.shape, view.stride())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Comm:
    """torch.distributed calls for one rank, through its `Groups`, optionally recorded."""

    def __init__(self, groups: Groups, record: bool = False) -> None:
        self.groups = groups
        self.record = record
        self.calls: list[CommCall] = []
        self.block: Callable[[Handle], None] | None = None
        """Waits for a synchronous collective in its caller's place: set by the CPU
        interpreter so that its side streams keep issuing while one blocks (a queued send a
        peer needs before it can join the collective would otherwise never go out)."""

    def _log(self, kind: OpKind, key: GroupKey | None, size: int, **extra: object) -> None:
        if self.record:
            group, stream = (key[1], key[0]) if key is not None else ((), "")
            self.calls.append(CommCall(kind, group, size, stream=stream, **extra))  # type: ignore[arg-type]

    # --- collectives ---------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, key: GroupKey, *, reduce: str = "sum",
                   async_op: bool = False, then: Callable[[], None] | None = None) -> Handle:
        """In place."""
        self._log(OpKind.ALL_REDUCE, key, _nbytes(tensor), reduce=reduce)
        group = self.groups.get(key)
        work = None if group is None else dist.all_reduce(
            tensor, op=_REDUCE_OPS[reduce], group=group, async_op=self._async(async_op))
        return self._handle(work, then, async_op)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, key: GroupKey, *,
                       async_op: bool = False, then: Callable[[], None] | None = None) -> Handle:
        """Sum `input` over the group; this rank's block (in group order) lands in `output`."""
        assert input.numel() == output.numel() * len(key[1]), "reduce_scatter sizes"
        self._log(OpKind.REDUCE_SCATTER, key, _nbytes(input))
        group = self.groups.get(key)
        if group is None:
            output.copy_(input.view_as(output))
            return self._handle(None, then)
        work = _reduce_scatter(output, input, group=group, async_op=self._async(async_op))
        return self._handle(work, then, async_op)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, key: GroupKey, *,
                   async_op: bool = False, then: Callable[[], None] | None = None) -> Handle:
        """Members' `input`s concatenated in group order into `output`."""
        assert output.numel() == input.numel() * len(key[1]), "all_gather sizes"
        self._log(OpKind.ALL_GATHER, key, _nbytes(output))
        group = self.groups.get(key)
        if group is None:
            output.copy_(input.view_as(output))
            return self._handle(None, then)
        work = _all_gather(output, input, group=group, async_op=self._async(async_op))
        return self._handle(work, then, async_op)

    def broadcast(self, tensor: torch.Tensor, src: int, key: GroupKey, *,
                  async_op: bool = False, then: Callable[[], None] | None = None) -> Handle:
        self._log(OpKind.BROADCAST, key, _nbytes(tensor), peer=src)
        group = self.groups.get(key)
        work = None if group is None else dist.broadcast(tensor, src, group=group,
                                                         async_op=self._async(async_op))
        return self._handle(work, then, async_op)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, key: GroupKey, *,
                   input_splits: list[int] | None = None,
                   output_splits: list[int] | None = None, async_op: bool = False,
                   then: Callable[[], None] | None = None) -> Handle:
        """Equal blocks: block j of `input` goes to member j; block i of `output` came from i.
        With splits (rows along dim 0, as all_to_all_single's): `input_splits[j]` rows to
        member j, `output_splits[i]` rows from member i."""
        row = _nbytes(input) // max(1, input.shape[0]) if input.dim() else 0
        splits = tuple(n * row for n in input_splits) if input_splits is not None else ()
        self._log(OpKind.ALL_TO_ALL, key, _nbytes(input), splits=splits)
        group = self.groups.get(key)
        if group is None:
            output.copy_(input)
            return self._handle(None, then)
        work = dist.all_to_all_single(output, input, output_split_sizes=output_splits,
                                      input_split_sizes=input_splits, group=group,
                                      async_op=self._async(async_op))
        return self._handle(work, then, async_op)

    def hop_exchange(self, key: GroupKey, size: int, splits: tuple[int, ...]
                     ) -> Callable[[torch.Tensor, torch.Tensor, list[int], list[int]], None]:
        """One logged all-to-all of `size` bytes split as NCCL's (the plan's op) that runs as
        the hops of `executor.hops`: the returned function does each hop's all_to_all_single
        over the group, unlogged and synchronous."""
        self._log(OpKind.ALL_TO_ALL, key, size, splits=splits)
        group = self.groups.get(key)

        def exchange(output: torch.Tensor, input: torch.Tensor, input_splits: list[int],
                     output_splits: list[int]) -> None:
            if group is None:
                output.copy_(input)
                return
            work = dist.all_to_all_single(output, input, output_split_sizes=output_splits,
                                          input_split_sizes=input_splits, group=group,
                                          async_op=self._async(False))
            self._handle(work, None, async_op=False)
        return exchange

    # --- point to point ------------------------------------------------------------------

    def send(self, tensor: torch.Tensor, peer: int, tag: str, *,
             then: Callable[[], None] | None = None) -> Handle:
        self._log(OpKind.SEND, None, _nbytes(tensor), peer=peer, tag=tag)
        return self._handle(dist.isend(tensor, peer, tag=P2P_TAGS[tag]), then)

    def recv(self, tensor: torch.Tensor, peer: int, tag: str, *,
             then: Callable[[], None] | None = None) -> Handle:
        self._log(OpKind.RECV, None, _nbytes(tensor), peer=peer, tag=tag)
        return self._handle(dist.irecv(tensor, peer, tag=P2P_TAGS[tag]), then)

    def _async(self, async_op: bool) -> bool:
        """Issue asynchronously: asked for, or a synchronous call `block` waits for."""
        return async_op or self.block is not None

    def _handle(self, work: dist.Work | None, then: Callable[[], None] | None,
                async_op: bool = True) -> Handle:
        handle = Handle(work, then)
        if work is None or work.is_completed():
            handle.wait()
        elif not async_op and self.block is not None:
            self.block(handle)
        return handle
