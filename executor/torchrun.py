"""Joining a world `torchrun` started (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set): multi-node
runs need nothing else. The same timeouts and failure lines as `executor.launch.spawn`.

    join(fn, args)    fn(ctx, *args) on this rank, in the env:// world

`check_env(world)` refuses, before anything starts, an environment torchrun would not have made
(RANK=abc, a rank outside WORLD_SIZE, MASTER_PORT unset) or a world other than the config's:
one `ConfigError` line each, where init_process_group would raise a traceback or wait until
the timeout.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.launch import RankContext, describe_error, exit_after, nccl_usable
from executor.recorder import FAILED, H_OP, H_STATE, HEADER
from traces.errors import ConfigError, show

_MAX_WORLD = 1 << 20


def check_env(world: int | None = None) -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) from the environment, checked (see the module doc);
    `world`: the ranks the config's layout needs."""
    rank, size, local = (_env_int(name, 0, _MAX_WORLD)
                         for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if size < 1:
        raise ConfigError("torchrun: WORLD_SIZE 0 holds no rank")
    if rank >= size or local >= size:
        raise ConfigError(f"torchrun: RANK {rank} / LOCAL_RANK {local} lie outside the world "
                          f"of WORLD_SIZE {size}")
    if not os.environ.get("MASTER_ADDR"):
        raise ConfigError("torchrun: MASTER_ADDR is empty; it names the host of rank 0")
    if "MASTER_PORT" not in os.environ:
        raise ConfigError("torchrun: MASTER_PORT is not set; rank 0 listens there (torchrun "
                          "sets it: start the job with torchrun, or export MASTER_PORT)")
    _env_int("MASTER_PORT", 1, 65535)
    if world is not None and size != world:
        raise ConfigError(f"torchrun: WORLD_SIZE {size} but the config's layout has {world} "
                          f"ranks (tp x pp x dp x cp); start torchrun with {world} processes "
                          "in all")
    return rank, size, local


def _env_int(name: str, low: int, high: int) -> int:
    raw = os.environ.get(name, "")
    if not raw.isdecimal() or len(raw) > 9 or not low <= int(raw) <= high:
        raise ConfigError(f"torchrun: {name}={show(raw)} must be an integer from {low} to "
                          f"{high:,}")
    return int(raw)


def join(fn: Callable[..., Any], args: tuple = (), *, timeout_s: float = 60.0,
         backend: str = "auto", record_slots: int = 0,
         on_failure: Callable[[RankContext, str], Sequence[Any]] | None = None) -> Any:
    """Run `fn(ctx, *args)` in the world torchrun started (env://). A failure prints one line
    naming the rank and op on stderr and exits 1 (torchrun then ends the other ranks); the
    job timeout exits 124. `on_failure(ctx, message)` runs first, on the failing rank (its
    records marked failed), and returns the files it wrote, which the line names."""
    rank, world_size, local_rank = check_env()
    if backend == "auto":
        backend = "nccl" if nccl_usable() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    records = np.full(HEADER + record_slots, -1, dtype=np.int64)
    records[:HEADER] = 0
    records[H_OP] = -1
    exit_after(timeout_s)
    ctx = RankContext(rank, world_size, local_rank, backend, device, timeout_s, records)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        return fn(ctx, *args)
    except Exception as exc:
        records[H_STATE] = FAILED
        op = getattr(exc, "parasim_op", "") or f"op {int(records[H_OP])}"
        message = f"rank {rank} failed in {op}: {describe_error(exc)}"
        written = ""
        if on_failure is not None:
            try:
                files = on_failure(ctx, message)
                written = f" (partial trace, marked incomplete: {', '.join(map(str, files))})"
            except Exception as also:  # the first error is the one to report
                written = f" (no partial trace: {describe_error(also)})"
        print(f"parasim: error: {message}{written}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized() and records[H_STATE] != FAILED:
            dist.destroy_process_group()
