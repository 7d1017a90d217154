"""What each rank is doing at run time, where the interference model (`sim.models.interference`)
makes it matter: kernels running, transfers in flight. Used by the replay engine
(`sim.engine.replay`), which asks it for

  - `scale[rank]`: how many times as long a kernel of the rank takes if it starts now
    (`kernel_stretch` while the rank moves data, else 1; times the rank's `speeds` stretch,
    how much slower than the plan the rank runs this step: `sim.models.variability`); where
    the model's stretch depends on the kernel (`per_kernel`), a kernel that starts while the
    rank moves data (`busy`) takes `kernel_scale(op)` times the rank's stretch instead;
  - `kernel(rank)`: the timeout a kernel of the rank waits on (`env.timeout`, or one that
    marks the rank computing until it fires, where communication notices kernels);
  - `move(lowered, op, ranks)`: the transport's event for the communication of `op` among
    `ranks`, waiting `comm_wait_s` and stretched by `comm_stretch` if one of them is
    computing, and marking them busy until it fires, where kernels notice communication
    (not a copy-engine copy: it holds no SMs).

A kernel runs at the rate its rank's state gives it from moment to moment: the kernels
running are timed again whenever their rank starts or stops moving data, whichever stream
the engine resumes first within that instant (`sim.engine.running`).
With no interference (`NO_INTERFERENCE`) nothing is tracked. A mark is undone by a callback
on the event, which simpy runs before it resumes the process that waits on it: the rank is
free again at the same instant, and in the same order, as if the process undid it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import simpy

from sim.engine.running import Running
from sim.engine.transport import Transport
from sim.models.interference import Interference, interferes
from traces.ops import Op
from traces.plan.overlap import copy_engine, in_margin

Kernel = Callable[[float], simpy.Event]
"""A timeout of the given seconds, for a kernel (or a run of kernels)."""
Move = Callable[[int, Op, Sequence[int]], simpy.Event | None]
"""(lowering, op, ranks) -> the event of its communication, None when free."""


class Occupancy:
    """Kernels running and transfers in flight per rank, kept as far as they matter."""

    def __init__(self, env: simpy.Environment, ranks: Iterable[int], model: Interference,
                 transport: Transport, speeds: Mapping[int, float] | None = None) -> None:
        self.env, self.transport = env, transport
        self.slows_kernels, self.slows_comm = interferes(model)
        self.kernel_stretch = model.kernel_stretch
        self.per_kernel = self.slows_kernels and model.per_kernel
        self.kernel_scale = model.kernel_scale
        """Where `per_kernel`: a kernel's stretch while its rank is `busy`."""
        self.comm_stretch, self.comm_wait_s = model.comm_stretch, model.comm_wait_s
        ranks = tuple(ranks)
        self.base = {r: (speeds or {}).get(r, 1.0) for r in ranks}
        """The rank's kernel stretch for the step when it moves nothing."""
        self.scale = dict(self.base)
        """How many times as long a kernel of the rank takes if it starts now."""
        self.busy = dict.fromkeys(ranks, 0)
        """Transfers in flight per rank (kept where kernels notice them)."""
        self.computing = dict.fromkeys(ranks, 0)
        """Kernels (or runs of kernels) running per rank (kept where communication notices)."""
        self.move: Move = self._move_beside if self.slows_kernels or self.slows_comm \
            else self._move_alone
        self.running: Running | None = None
        """Where kernels notice communication: the kernels running, re-timed when their
        rank starts or stops moving data (the replay sets it, `sim.engine.running`)."""

    def kernel(self, rank: int) -> Kernel:
        """The timeout a kernel of `rank` waits on."""
        timeout = self.env.timeout
        if not self.slows_comm:
            return timeout
        computing = self.computing

        def done(_: simpy.Event) -> None:
            computing[rank] -= 1

        def kernel(seconds: float) -> simpy.Event:
            computing[rank] += 1
            event = timeout(seconds)
            event.callbacks.append(done)
            return event

        return kernel

    def plain(self, op: Op) -> bool:
        """Whether `move(lowered, op, ranks)` is the transport's own `move(lowered, op, 1.0,
        0.0)` whatever its ranks are doing: kernels do not slow communication, and it marks
        no rank busy (kernels do not notice communication, or it is inline: see
        `_move_beside`). The replay then asks the transport directly."""
        return not self.slows_comm and (not self.slows_kernels or op.inline)

    def _move_alone(self, lowered: int, op: Op, ranks: Sequence[int]) -> simpy.Event | None:
        return self.transport.move(lowered, op, 1.0, 0.0)

    def _move_beside(self, lowered: int, op: Op, ranks: Sequence[int]) -> simpy.Event | None:
        stretch, wait = 1.0, 0.0
        if self.slows_comm and any(self.computing[r] for r in ranks):
            stretch, wait = self.comm_stretch, self.comm_wait_s
        moved = self.transport.move(lowered, op, stretch, wait)
        # an inline collective holds its ranks' compute streams: no kernel of theirs starts
        # while it moves, so it need not mark them (the same times, without the bookkeeping);
        # a copy-engine copy holds no SMs (`traces.plan.overlap.copy_engine`); a TE chunk's
        # SMs are its GEMMs' margin, in their time already where the model counts SMs
        # (`per_kernel`: `traces.plan.overlap.in_margin`)
        if moved is not None and self.slows_kernels and not op.inline \
                and not copy_engine(op) and not (self.per_kernel and in_margin(op)):
            busy, scale, base, running = self.busy, self.scale, self.base, self.running
            for r in ranks:
                busy[r] += 1
                scale[r] = self.kernel_stretch * base[r]
                if busy[r] == 1 and running is not None:
                    running.retime(r)

            def done(_: simpy.Event) -> None:
                for r in ranks:
                    busy[r] -= 1
                    if not busy[r]:
                        scale[r] = base[r]
                        if running is not None:
                            running.retime(r)

            moved.callbacks.append(done)
        return moved
