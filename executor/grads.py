"""Gradient buffers and their data-parallel reduction, bucket by bucket.

    ZeRO 0   one flat buffer, accumulated over micro-batches, all-reduced in place per bucket
    ZeRO 1   the same buffer, reduce-scattered per bucket into the rank's shard
    ZeRO 2/3 a bucket's buffer exists only from its first gradient in a micro-batch to its
             reduce-scatter (ZeRO-3: one bucket per unit); the shard accumulates

Reductions sum: the loss is scaled by 1/(tokens per micro-batch x micro-batches x dp) so sums
are the global mean. With dp = 1 every stage behaves as ZeRO 0 (nothing to shard).
"""

from __future__ import annotations

import torch

from executor.comm import Comm, Handle
from executor.flat import Bucket, FlatLayout, Shards
from executor.groups import GroupKey
from executor.memory import MemoryMeter
from traces.purpose import Unit


class GradStore:
    def __init__(self, flat: FlatLayout, buckets: list[Bucket], *, zero: int, dp: int,
                 dp_rank: int, dtype: torch.dtype, device: torch.device,
                 meter: MemoryMeter) -> None:
        self.flat, self.buckets, self.zero = flat, buckets, zero
        self.dtype, self.device, self.meter = dtype, device, meter
        self.bucket_of = {u: b for b in buckets for u in b.units}
        self.full: torch.Tensor | None = None
        self._transient: dict[int, tuple[torch.Tensor, int]] = {}
        if zero in (0, 1):
            self.full = torch.zeros(flat.total, dtype=dtype, device=device)
            meter.hold(self.full, "grads")
        self.shards: Shards | None = None
        self.shard: torch.Tensor | None = None
        if zero >= 1:
            self.shards = Shards(buckets, dp, dp_rank)
            self.shard = torch.zeros(self.shards.total, dtype=dtype, device=device)
            meter.hold(self.shard, "grads")

    def bucket_tensor(self, bucket: Bucket) -> torch.Tensor:
        """The bucket's full-size gradient (allocated at first use for ZeRO 2/3)."""
        if self.full is not None:
            return self.full[bucket.start:bucket.end]
        entry = self._transient.get(bucket.index)
        if entry is None:
            buf = torch.zeros(bucket.numel, dtype=self.dtype, device=self.device)
            entry = (buf, self.meter.hold(buf, "grads"))
            self._transient[bucket.index] = entry
        return entry[0]

    def accumulate(self, unit: Unit, name: str, grad: torch.Tensor) -> None:
        bucket = self.bucket_of[unit]
        start, end = self.flat.param_range[(unit, name)]
        view = self.bucket_tensor(bucket)[start - bucket.start:end - bucket.start]
        view.add_(grad.reshape(-1))

    def reduce(self, index: int, comm: Comm, key: GroupKey, *, async_op: bool) -> Handle:
        """The bucket's DP reduction: all-reduce (ZeRO 0) or reduce-scatter into the shard."""
        bucket = self.buckets[index]
        buf = self.bucket_tensor(bucket)
        if self.zero == 0:
            return comm.all_reduce(buf, key, async_op=async_op)
        assert self.shards is not None and self.shard is not None
        lo, hi = self.shards.shard_slice[index]
        out = torch.empty(hi - lo, dtype=self.dtype, device=self.device)
        held = self.meter.hold(out, "comm")
        entry = self._transient.pop(index, None)  # the next micro-batch starts a new buffer
        shard = self.shard

        def then() -> None:
            shard[lo:hi].add_(out)
            self.meter.drop(held)
            if entry is not None:
                self.meter.drop(entry[1])

        return comm.reduce_scatter(out, buf, key, async_op=async_op, then=then)

    def optimizer_grads(self) -> list[torch.Tensor]:
        """The gradient the optimizer reads, per bucket: the reduced full bucket (ZeRO 0) or
        this rank's reduced slice."""
        if self.zero == 0:
            assert self.full is not None
            return [self.full[b.start:b.end] for b in self.buckets]
        assert self.shard is not None and self.shards is not None
        return [self.shard[lo:hi] for lo, hi in self.shards.shard_slice]

    def zero_(self) -> None:
        """After the optimizer step."""
        assert not self._transient, "every bucket was reduced before the optimizer step"
        if self.full is not None:
            self.full.zero_()
        if self.shard is not None:
            self.shard.zero_()

    # --- sequence parallelism: the replicated parameters' partial gradients ----------------

    def sp_pack_index(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(flat positions of the SP parameters in pack order, mask of those this rank's
        reduced gradient holds, their positions there) — the last two None for ZeRO 0."""
        ranges = self.flat.sp_ranges()
        flat_pos = torch.cat([torch.arange(a, b) for a, b in ranges]) if ranges else \
            torch.zeros(0, dtype=torch.long)
        if self.zero == 0:
            return flat_pos.to(self.device), None, None
        assert self.shards is not None
        where = torch.full((self.flat.total,), -1, dtype=torch.long)
        for (fa, fb), (sa, sb) in zip(self.shards.flat_slice, self.shards.shard_slice):
            where[fa:fb] = torch.arange(sa, sb)
        pos = where[flat_pos]
        owned = pos >= 0
        return flat_pos.to(self.device), owned.to(self.device), pos[owned].to(self.device)

    def sp_unit_all_reduce(self, unit: Unit, comm: Comm, key: GroupKey, *,
                           async_op: bool = False) -> Handle:
        """Sum one unit's SP parameters' gradients over the TP group, in its bucket buffer
        before the bucket's DP reduction (exact for every ZeRO stage): one buffer of them."""
        bucket = self.bucket_of[unit]
        buf = self.bucket_tensor(bucket)
        a, b = self.flat.unit_range[unit]
        ranges = [(lo - bucket.start, hi - bucket.start) for lo, hi in self.flat.sp_ranges()
                  if a <= lo < b]
        pack = torch.cat([buf[lo:hi] for lo, hi in ranges])
        held = self.meter.hold(pack, "comm")

        def then() -> None:
            offset = 0
            for lo, hi in ranges:
                buf[lo:hi].copy_(pack[offset:offset + hi - lo])
                offset += hi - lo
            self.meter.drop(held)

        return comm.all_reduce(pack, key, async_op=async_op, then=then)

    def sp_all_reduce(self, comm: Comm, key: GroupKey) -> None:
        """Sum all the SP parameters' gradients over the TP group once, after the DP
        reduction: one buffer of all of them, holding what this rank has reduced (zeros where
        another DP rank owns the slice)."""
        if not hasattr(self, "_sp_index"):
            self._sp_index = self.sp_pack_index()
        flat_pos, owned, pos = self._sp_index
        if self.zero == 0:
            assert self.full is not None
            pack = self.full[flat_pos]
            comm.all_reduce(pack, key)
            self.full[flat_pos] = pack
            return
        assert self.shard is not None and owned is not None and pos is not None
        pack = torch.zeros(len(flat_pos), dtype=self.dtype, device=self.device)
        pack[owned] = self.shard[pos]
        comm.all_reduce(pack, key)
        self.shard[pos] = pack[owned]
