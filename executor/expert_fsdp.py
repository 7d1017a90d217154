"""The routed experts under ZeRO 3 (FSDP with EP) over an expert-DP group of two or more.

MoE Parallel Folding's FSDP+EP, as the plan states it (`traces.plan.data`): the rank keeps
the k-th of g equal slices of each MoE layer's experts (its E/EP experts, g the expert-DP
group, k its index there), and each layer's `ExpertUnitGather` all-gathers the slices into a
buffer of the whole layer before its forward and its backward, beside the dense unit's
`UnitGather` over DP; the buffer's storage is freed again when the dense unit's is
(`traces.fsdp.frees_after`), resized to 0 as `executor.optim.ParamStore` frees a ZeRO-3 unit,
so the parameter leaves and the autograd graphs that saved them stay valid. A layer's
gradients accumulate in a buffer that lives from its first backward to its `ExpertGrads`
reduce-scatter into the rank's slice (every micro-batch that syncs, `traces.fsdp.syncs_grads`);
the slice's reduced gradients live from that reduction to the optimizer's `zero_` (FSDP2's
sharded gradients, set to None by zero_grad), so under `grad_sync = "step"` the peak holds the
full buffers alone, as `sim.models.memory` counts them. AdamW updates the slices only.
"""

from __future__ import annotations

import torch

from executor.comm import Comm, Handle, own_counter
from executor.experts import ExpertStore
from executor.memory import MemoryMeter
from executor.optim import AdamW, AdamWConfig
from executor.params import DTYPES
from traces.expert_grid import ep_coord, expert_grad_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Stream
from traces.plan.experts import fsdp_experts
from traces.purpose import Unit


def gathers_experts(layout: Layout, rank: int) -> bool:
    """Whether the plan gathers `rank`'s experts per use (`ExpertUnitGather`)."""
    return fsdp_experts(layout) and len(expert_grad_group(layout, rank)) > 1


def expert_store(model: ModelSpec, layout: Layout, rank: int, *, seed: int,
                 grad_dtype: torch.dtype, device: torch.device, meter: MemoryMeter,
                 adamw: AdamWConfig) -> ExpertStore:
    """The rank's routed experts as the plan keeps them: whole or ZeRO 1/2 shards
    (`executor.experts`), or FSDP's slices gathered per use (here)."""
    kind = ExpertUnits if gathers_experts(layout, rank) else ExpertStore
    return kind(model, layout, rank, seed=seed, grad_dtype=grad_dtype, device=device,
                meter=meter, adamw=adamw)


class ExpertUnits(ExpertStore):
    def __init__(self, model: ModelSpec, layout: Layout, rank: int, *, seed: int,
                 grad_dtype: torch.dtype, device: torch.device, meter: MemoryMeter,
                 adamw: AdamWConfig) -> None:
        self.ep, self.ep_rank = layout.ep, ep_coord(layout, rank)
        self.group = expert_grad_group(layout, rank)
        self.sharded, self.overlap_gather, self.counted = True, False, True
        self.stale: set[int] = set()
        self.meter, self.grad_dtype = meter, grad_dtype
        whole = torch.cat(self._place(model, layout, rank, seed)).to(DTYPES[model.dtype])
        self.slice: dict[int, tuple[int, int]] = {}
        self._shard_slices(rank, grad_dtype, device)  # the slices; no one shard for them all
        self.shard = torch.zeros(0, dtype=grad_dtype, device=device)
        self.shards: dict[int, tuple[torch.Tensor, int]] = {}
        """Per layer, the rank's reduced gradients of its slice and their meter key: from the
        step's first reduction of the layer to `zero_` (FSDP2's sharded gradients, which the
        optimizer's zero_grad sets to None), so never beside the whole step's full buffers."""
        self.kept = torch.cat([self._layer_part(whole, layer)[slice(*self.slice[layer])]
                               for layer in self.layers]).to(device)
        """The rank's slices of the layers' parameters, layer after layer."""
        meter.hold(self.kept, "params")
        self.buffers: dict[int, torch.Tensor] = {}
        self.leaves = {}
        for layer in self.layers:
            buf = torch.empty(self._size(layer), dtype=self.kept.dtype, device=device)
            self.buffers[layer] = buf
            start = self.offsets[(layer, "")][0]
            for (at, name), (offset, shape) in self.offsets.items():
                if at == layer and name:
                    numel = _numel(shape)
                    view = buf[offset - start:offset - start + numel].view(shape)
                    self.leaves[(layer, name)] = view.detach().requires_grad_()
            buf.untyped_storage().resize_(0)
        self.users = {layer: 0 for layer in self.layers}
        self.gathered = {layer: False for layer in self.layers}
        self._held: dict[int, tuple[int, int]] = {}
        self._transient: dict[int, tuple[torch.Tensor, int]] = {}
        self.optimizer = AdamW(self.param_segments(), adamw, meter)

    def _size(self, layer: int) -> int:
        return self.offsets[(layer, "")][1][0]

    def _layer_part(self, flat: torch.Tensor, layer: int) -> torch.Tensor:
        start = self.offsets[(layer, "")][0]
        return flat[start:start + self._size(layer)]

    def _kept_of(self, layer: int) -> torch.Tensor:
        """The rank's slice of the layer's parameters."""
        offset = 0
        for other in self.layers:
            a, b = self.slice[other]
            if other == layer:
                return self.kept[offset:offset + b - a]
            offset += b - a
        raise KeyError(layer)

    def leaf(self, unit: Unit, name: str) -> torch.Tensor:
        assert unit.layer is not None
        if not self.gathered[unit.layer]:
            raise RuntimeError(f"the experts of layer {unit.layer} are not gathered (ZeRO-3): "
                               "the plan must all-gather them before this op")
        return self.leaves[(unit.layer, name)]

    def accumulate(self, unit: Unit, name: str, grad: torch.Tensor) -> None:
        assert unit.layer is not None
        start = self.offsets[(unit.layer, "")][0]
        offset, shape = self.offsets[(unit.layer, name)]
        buf = self._grad_buffer(unit.layer)
        buf[offset - start:offset - start + _numel(shape)].view(shape).add_(grad)

    def _grad_buffer(self, layer: int) -> torch.Tensor:
        """The layer's gradients since its last reduction (allocated at first use)."""
        entry = self._transient.get(layer)
        if entry is None:
            buf = torch.zeros(self._size(layer), dtype=self.grad_dtype,
                              device=self.kept.device)
            entry = self._transient[layer] = (buf, self.meter.hold(buf, "grads"))
        return entry[0]

    def reduce(self, layer: int, comm: Comm, stream: str = Stream.ZERO_RS, *,
               async_op: bool = True) -> Handle:
        """Reduce-scatter the layer's gradients into the rank's slice; the next backward
        starts a new buffer."""
        buf = self._grad_buffer(layer)
        _, held_buf = self._transient.pop(layer)
        a, b = self.slice[layer]
        out = torch.empty(b - a, dtype=self.grad_dtype, device=self.kept.device)
        held = self.meter.hold(out, "comm")

        def then() -> None:
            self.meter.drop(held_buf)  # the full buffer goes before the shard comes
            self.meter.drop(held)
            if layer in self.shards:
                self.shards[layer][0].add_(out)
            else:  # the step's first reduction of the layer: its result is the shard
                self.shards[layer] = (out, self.meter.hold(out, "grads"))

        return comm.reduce_scatter(out, buf, (stream, self.group), async_op=async_op,
                                   then=then)

    def gather(self, layer: int, comm: Comm, stream: str = Stream.ZERO_AG, *,
               async_op: bool = True) -> Handle:
        """All-gather the layer's slices into its buffer, for one pass over the layer."""
        self.users[layer] += 1
        flat = self.buffers[layer]
        storage, numel = flat.untyped_storage(), flat.numel()
        if storage.nbytes() == 0:
            storage.resize_(numel * flat.element_size())
        # written through a tensor of its own (own version counter): the leaves' saved versions
        # stay what autograd recorded (`own_counter`)
        target = own_counter(flat)

        def then() -> None:
            if layer not in self._held:
                self._held[layer] = (self.meter.hold(target, "params"),
                                     self.meter.exclude(target))
            self.gathered[layer] = True

        return comm.all_gather(target, self._kept_of(layer), (stream, self.group),
                               async_op=async_op, then=then)

    def release(self, layer: int) -> None:
        """A pass over the layer has ended: free it unless another gather is pending."""
        if layer not in self.users:
            return  # a dense layer
        self.users[layer] = max(0, self.users[layer] - 1)
        if self.users[layer] == 0:
            self._free(layer)

    def free_all(self) -> None:
        for layer in self.layers:
            self.users[layer] = 0
            self._free(layer)

    def _free(self, layer: int) -> None:
        if not self.gathered[layer]:
            return
        self.buffers[layer].untyped_storage().resize_(0)
        self.gathered[layer] = False
        held, excluded = self._held.pop(layer)
        self.meter.drop(held)
        self.meter.include(excluded)

    def param_segments(self) -> list[torch.Tensor]:
        return [self._kept_of(layer) for layer in self.layers]

    def _shard_of(self, layer: int) -> torch.Tensor:
        """The rank's reduced gradients of the layer's slice (zeros before its reduction)."""
        if layer not in self.shards:
            a, b = self.slice[layer]
            zeros = torch.zeros(b - a, dtype=self.grad_dtype, device=self.kept.device)
            self.shards[layer] = (zeros, self.meter.hold(zeros, "grads"))
        return self.shards[layer][0]

    def zero_(self) -> None:
        """After the optimizer step: the shards freed (`shards`)."""
        assert not self._transient, "every layer's experts were reduced before the step"
        for _, key in self.shards.values():
            self.meter.drop(key)
        self.shards.clear()

    def tensors(self, unit: Unit, comm: Comm) -> dict[str, torch.Tensor]:
        """The unit's experts by name (copies), gathered for the purpose (collective)."""
        if unit.layer is None or unit.layer not in self.gathered:
            return {}
        self.gather(unit.layer, comm, async_op=False)
        out = {name: leaf.detach().clone() for (layer, name), leaf in self.leaves.items()
               if layer == unit.layer}
        self.release(unit.layer)
        return out


def _numel(shape: tuple[int, ...]) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return numel
