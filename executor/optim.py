"""Parameters of one rank (whole, or ZeRO-3 shards gathered unit by unit) and AdamW on them.

    ZeRO 0-2  one flat parameter buffer in the flat order; units are views of it. ZeRO-1/2:
              the optimizer updates this rank's slice of each bucket, then `gather_bucket`
              all-gathers the bucket so every DP rank holds the new parameters.
    ZeRO 3    the rank keeps its slice of each unit (the shard); `gather_unit` all-gathers a
              unit into a buffer whose storage is freed again by `free_unit` (resized to 0, as
              FSDP does), so the parameter leaves and the autograd graphs that saved them stay
              valid across free and re-gather.

AdamW follows torch.optim.AdamW's single-tensor update step for step (decoupled weight decay,
bias corrections, eps added after the square root), applied to flat segments, so a sharded
update equals the unsharded one element by element. Weight decay applies to every parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.comm import Comm, Handle, own_counter
from executor.flat import Bucket, FlatLayout, Shards
from executor.groups import GroupKey
from executor.memory import MemoryMeter
from executor.params import DTYPES, FlatUnit, build_unit_params
from traces.purpose import Unit


@dataclass(frozen=True, slots=True, kw_only=True)
class AdamWConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1


class AdamW:
    """AdamW over flat segments (parameter slice, gradient slice) of equal shapes. Parameters
    not in fp32 get an fp32 master copy; the state (m, v) is fp32."""

    def __init__(self, params: list[torch.Tensor], config: AdamWConfig,
                 meter: MemoryMeter | None = None) -> None:
        self.params, self.config, self.step_count = params, config, 0
        self.master = [p if p.dtype == torch.float32 else p.detach().float().clone()
                       for p in params]
        self.m = [torch.zeros_like(p) for p in self.master]
        self.v = [torch.zeros_like(p) for p in self.master]
        if meter is not None:
            for p, master in zip(params, self.master):
                if master is not p:
                    meter.hold(master, "optimizer")
            for t in (*self.m, *self.v):
                meter.hold(t, "optimizer")

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor]) -> None:
        c = self.config
        self.step_count += 1
        bias1 = 1 - c.beta1 ** self.step_count
        bias2_sqrt = (1 - c.beta2 ** self.step_count) ** 0.5
        for param, master, grad, m, v in zip(self.params, self.master, grads, self.m, self.v):
            assert grad.shape == master.shape, "gradient segment matches its parameters"
            g = grad.float()
            master.mul_(1 - c.lr * c.weight_decay)
            m.lerp_(g, 1 - c.beta1)
            v.mul_(c.beta2).addcmul_(g, g, value=1 - c.beta2)
            denom = (v.sqrt() / bias2_sqrt).add_(c.eps)
            master.addcdiv_(m, denom, value=-c.lr / bias1)
            if master is not param:
                param.copy_(master)


class ParamStore:
    """One rank's parameters; `leaf(unit, name)` is the tensor kernels use."""

    def __init__(self, flat: FlatLayout, buckets: list[Bucket], *, zero: int, dp: int,
                 dp_rank: int, tp_rank: int, seed: int, device: torch.device,
                 meter: MemoryMeter) -> None:
        model, layout = flat.model, flat.layout
        self.flat, self.buckets, self.zero, self.meter = flat, buckets, zero, meter
        self.dtype = DTYPES[model.dtype]
        whole = torch.cat([build_unit_params(model, layout, u, flat.pp_rank, tp_rank, seed)
                           for u in flat.units]).to(device)
        self.units: dict[Unit, FlatUnit] = {}
        self.gathered: dict[Unit, bool] = {}
        self.shards: Shards | None = Shards(buckets, dp, dp_rank) if zero >= 1 else None
        if zero < 3:
            self.full: torch.Tensor | None = whole
            meter.hold(whole, "params")
            meter.exclude(whole)
            for unit in flat.units:
                a, b = flat.unit_range[unit]
                self.units[unit] = FlatUnit(flat.specs[unit], whole[a:b], leaves=True)
                self.gathered[unit] = True
            return
        # ZeRO-3: keep the shard; one gather buffer per unit, storage freed until gathered.
        assert self.shards is not None
        self.full = None
        self.shard = torch.cat([whole[a:b] for a, b in self.shards.flat_slice])
        meter.hold(self.shard, "params")
        self._unit_index = {b.units[0]: b.index for b in buckets}
        self._held: dict[Unit, tuple[int, int]] = {}
        self.users: dict[Unit, int] = {unit: 0 for unit in flat.units}
        """Gathers issued for a pass that has not ended yet: the unit is freed at zero, so a
        gather prefetched for the next pass is never freed under the one still running."""
        for unit in flat.units:
            buf = torch.empty(flat.unit_numel(unit), dtype=self.dtype, device=device)
            self.units[unit] = FlatUnit(flat.specs[unit], buf, leaves=True)
            buf.untyped_storage().resize_(0)
            self.gathered[unit] = False
        del whole

    def leaf(self, unit: Unit, name: str) -> torch.Tensor:
        if not self.gathered[unit]:
            raise RuntimeError(f"parameters of unit {unit} are not gathered (ZeRO-3): the plan "
                               "must all-gather them before this op")
        return self.units[unit].views[name]

    # --- ZeRO-3 ---------------------------------------------------------------------------

    def gather_unit(self, unit: Unit, comm: Comm, key: GroupKey, *, async_op: bool) -> Handle:
        """All-gather the unit's parameters from every DP rank's shard."""
        assert self.zero == 3 and self.shards is not None
        self.users[unit] += 1
        flat = self.units[unit].flat
        storage = flat.untyped_storage()
        numel = flat.numel()
        if storage.nbytes() == 0:
            storage.resize_(numel * flat.element_size())
        # written through a tensor of its own (own version counter): the leaves' saved versions
        # stay what autograd recorded (`own_counter`)
        target = own_counter(flat)
        lo, hi = self.shards.shard_slice[self._unit_index[unit]]

        def then() -> None:
            if unit not in self._held:
                self._held[unit] = (self.meter.hold(target, "params"),
                                    self.meter.exclude(target))
            self.gathered[unit] = True

        return comm.all_gather(target, self.shard[lo:hi], key, async_op=async_op, then=then)

    def release_unit(self, unit: Unit) -> None:
        """A pass over the unit has ended: free it unless another gather is pending."""
        if self.zero != 3:
            return
        self.users[unit] = max(0, self.users[unit] - 1)
        if self.users[unit] == 0:
            self.free_unit(unit)

    def free_unit(self, unit: Unit) -> None:
        """Free the unit's gathered parameters now (end of step)."""
        if self.zero != 3:
            return
        self.users[unit] = 0
        if not self.gathered[unit]:
            return
        self.units[unit].flat.untyped_storage().resize_(0)
        self.gathered[unit] = False
        held, excluded = self._held.pop(unit)
        self.meter.drop(held)
        self.meter.include(excluded)

    # --- ZeRO-1/2 -------------------------------------------------------------------------

    def gather_bucket(self, index: int, comm: Comm, key: GroupKey, *,
                      async_op: bool) -> Handle:
        """All-gather the bucket's updated slices into every DP rank's flat buffer."""
        assert self.zero in (1, 2) and self.shards is not None and self.full is not None
        bucket = self.buckets[index]
        lo, hi = self.shards.flat_slice[index]
        mine = self.full[lo:hi].clone()  # all_gather may not read and write one buffer
        return comm.all_gather(own_counter(self.full[bucket.start:bucket.end]), mine, key,
                               async_op=async_op)

    # --- optimizer -------------------------------------------------------------------------

    def optimizer_params(self) -> list[torch.Tensor]:
        """The parameter segments the optimizer updates, matching GradStore.optimizer_grads."""
        if self.zero == 0:
            assert self.full is not None
            return [self.full[b.start:b.end] for b in self.buckets]
        assert self.shards is not None
        if self.zero == 3:
            return [self.shard[lo:hi] for lo, hi in self.shards.shard_slice]
        assert self.full is not None
        return [self.full[lo:hi] for lo, hi in self.shards.flat_slice]

    def unit_tensors(self, unit: Unit) -> dict[str, torch.Tensor]:
        """The unit's current parameters by name (copies; ZeRO-3: from a gathered unit)."""
        return {n: v.detach().clone() for n, v in self.units[unit].views.items()}
