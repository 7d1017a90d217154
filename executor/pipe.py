"""Pipeline messages of one rank: a layer's input (tag act) or its gradient (tag grad) sent
to and received from the neighbouring stage, whole or as this TP rank's chunk, which an
all-gather over the TP group makes whole again (Megatron-LM's
scatter_gather_tensors_in_pipeline, under TP without SP)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from executor.comm import Comm, Handle
from executor.groups import GroupKey
from executor.tape import Tape
from traces.layout import Layout
from traces.model import ModelSpec
from traces.purpose import Tag


def _received_slot(boundary: int, tag: Tag) -> tuple[int, str]:
    """Where a received TP chunk waits for its all-gather."""
    return (boundary, f"x/{tag} chunk")


def _release(tape: Tape, key: tuple[int, str], sent: torch.Tensor) -> None:
    """Drop a sent activation from the tape if the slot still holds it."""
    if tape.acts.get(key) is sent:
        tape.release(key)


class PipeMessages:
    """The rank's sends, receives and gathers of pipeline messages, on its tapes."""

    def __init__(self, model: ModelSpec, layout: Layout, comm: Comm, tape: Callable[[int], Tape],
                 *, tp_rank: int, tp_key: GroupKey, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.model, self.layout, self.comm, self.tape = model, layout, comm, tape
        self.tp_rank, self.tp_key, self.dtype, self.device = tp_rank, tp_key, dtype, device

    def boundary_shape(self) -> tuple[int, int, int]:
        s = self.model.seq_len // self.layout.cp // (self.layout.tp if self.layout.sp else 1)
        return (s, self.layout.micro_batch, self.model.hidden)

    @property
    def scatter_gather(self) -> bool:
        """Pipeline messages travel as TP chunks and are all-gathered after the receive
        (Megatron-LM's scatter_gather_tensors_in_pipeline: under TP, without SP)."""
        return self.layout.tp > 1 and not self.layout.sp

    def _chunk(self, value: torch.Tensor) -> torch.Tensor:
        """This TP rank's 1/t of the flattened tensor (a view)."""
        n = value.numel() // self.layout.tp
        return value.contiguous().view(-1)[self.tp_rank * n:(self.tp_rank + 1) * n]

    def send(self, boundary: int, mb: int, tag: Tag, peer: int) -> Handle:
        """Send layer `boundary`'s input (tag act) or its gradient (tag grad): the whole
        tensor, or this TP rank's chunk of it (`scatter_gather`)."""
        tape, key = self.tape(mb), (boundary, "x")
        cut = self._chunk if self.scatter_gather else (lambda t: t)
        if tag == Tag.ACT:
            sent = tape.acts[key]
            # Released once sent, unless the slot holds a newer tensor by then: a rank whose
            # next stage holds no layer (pipeline_layout's "Et||t|L") gets the same boundary
            # back through it, possibly before this send completes.
            return self.comm.send(cut(sent), peer, tag, then=lambda: _release(tape, key, sent))
        return self.comm.send(cut(tape.take_grad(key)), peer, tag)

    def recv(self, boundary: int, mb: int, tag: Tag, peer: int) -> Handle:
        """Receive layer `boundary`'s input or its gradient; a TP chunk of it waits in
        `_received_slot` for `gather_received`."""
        tape, key = self.tape(mb), (boundary, "x")
        if self.scatter_gather:
            numel = math.prod(self.boundary_shape()) // self.layout.tp
            chunk = torch.empty(numel, dtype=self.dtype, device=self.device)
            return self.comm.recv(chunk, peer, tag,
                                  then=lambda: tape.put(_received_slot(boundary, tag), chunk))
        buf = torch.empty(self.boundary_shape(), dtype=self.dtype, device=self.device)
        if tag == Tag.ACT:
            return self.comm.recv(buf, peer, tag, then=lambda: tape.put(key, buf))
        return self.comm.recv(buf, peer, tag, then=lambda: tape.put_grad(key, buf))

    def gather_received(self, boundary: int, mb: int, tag: Tag) -> None:
        """All-gather the TP chunks of a received message over the TP group (inline, on the
        compute stream, as Megatron-LM's gather_split_1d_tensor) into the whole tensor."""
        tape, key = self.tape(mb), (boundary, "x")
        chunk = tape.take(_received_slot(boundary, tag))
        flat = torch.empty(chunk.numel() * self.layout.tp, dtype=self.dtype, device=self.device)
        self.comm.all_gather(flat, chunk, self.tp_key)
        out = flat.view(self.boundary_shape())
        if tag == Tag.ACT:
            tape.put(key, out)
        else:
            tape.put_grad(key, out)
