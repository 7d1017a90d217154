"""The routed experts' parameters on one rank: EP-sharded, reduced over the expert-DP group.

Megatron-Core keeps the experts out of the dense gradient buffers: their gradients are reduced
over the expert-data-parallel group (`traces.expert_grid.expert_data_group`), the rest of the
layer over DP x CP, and the plan counts them apart (`RankContext.expert_params`, the
`ExpertGrads` op). So they live here, not in the flat layout: for each MoE layer of the rank's
stages, its E/EP experts (`params.expert_shapes`: experts ep_rank·E/EP onward) in one flat
parameter tensor and one flat gradient buffer, accumulated over micro-batches and reduced by
the layer's `ExpertGrads` op, and AdamW over each layer's segment as over the dense buckets:

    ZeRO 0    the layer's gradients all-reduced; AdamW on the whole segment
    ZeRO 1/2  (`shards_experts`) the layer's segment in g equal slices over its expert-DP group
              of g ranks (slice k on the group's k-th rank, as `executor.flat.Shards` cuts a
              dense bucket): `ExpertGrads` reduce-scatters the gradients into the rank's
              slice, AdamW updates that slice only (its states 1/g), and the layer's
              `ExpertParamGather` all-gathers the updated slices back into every member's
              segment, as Megatron-Core's distributed optimizer does for its expert buffers.
              The plan reduces the experts once, after the last micro-batch, at ZeRO 2 too.

The gradient norm counts each expert once: on the first rank of its expert-DP group, or on
every rank where the statistics' group holds no other member of that group; sharded, every
rank counts its slice.
"""

from __future__ import annotations

import torch

from executor.comm import Comm, Handle, own_counter
from executor.memory import MemoryMeter
from executor.optim import AdamW, AdamWConfig
from executor.params import DTYPES, expert_shapes, init_full_unit
from traces.errors import ConfigError
from traces.expert_grid import ep_coord, expert_grad_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.ops import Stream
from traces.plan.experts import fsdp_experts
from traces.plan.optimizer import grad_stats_group
from traces.purpose import Unit


def shards_experts(layout: Layout, rank: int) -> bool:
    """Whether the plan shards `rank`'s expert states over its expert-DP group as ZeRO 1/2
    do (`traces.plan.optimizer._expert_gathers`: ZeRO >= 1, a group of two or more, and not
    FSDP's per-unit gathers)."""
    return layout.zero >= 1 and not fsdp_experts(layout) and \
        len(expert_grad_group(layout, rank)) > 1


class ExpertStore:
    def __init__(self, model: ModelSpec, layout: Layout, rank: int, *, seed: int,
                 grad_dtype: torch.dtype, device: torch.device, meter: MemoryMeter,
                 adamw: AdamWConfig) -> None:
        self.ep, self.ep_rank = layout.ep, ep_coord(layout, rank)
        self.group = expert_grad_group(layout, rank)
        self.sharded = shards_experts(layout, rank)
        self.overlap_gather = self.sharded and layout.overlap_param_gather
        self.stale: set[int] = set()
        """overlap_param_gather: layers whose slices the last step updated and no gather has
        brought in yet (the next step's forward would)."""
        stats = set(grad_stats_group(layout, rank))
        self.counted = self.sharded or self.group.index(rank) == 0 or \
            len(stats & set(self.group)) == 1
        parts = self._place(model, layout, rank, seed)
        self.params = torch.cat(parts).to(DTYPES[model.dtype]).to(device) if parts else \
            torch.zeros(0, device=device)
        self.grads = torch.zeros(self.params.numel(), dtype=grad_dtype, device=device)
        meter.hold(self.params, "params")
        meter.exclude(self.params)
        meter.hold(self.grads, "grads")
        self.leaves = {key: self._view(self.params, key).detach().requires_grad_()
                       for key in self.offsets if key[1]}
        self.meter = meter
        self.slice: dict[int, tuple[int, int]] = {}
        """Sharded: each layer's slice in its segment, and (`shard`) the rank's reduced
        gradients of its slices, layer after layer."""
        self.shard = torch.zeros(0, dtype=grad_dtype, device=device)
        if self.sharded:
            self.shard = self._shard_slices(rank, grad_dtype, device)
            meter.hold(self.shard, "grads")
        self.optimizer = AdamW(self.param_segments(), adamw, meter)

    def _place(self, model: ModelSpec, layout: Layout, rank: int, seed: int
               ) -> list[torch.Tensor]:
        """Set the rank's MoE layers and where each (layer, name) lies in the flat order
        ((layer, ""): the layer's segment); the initial parameters, part by part."""
        pp = layout.coords(rank).pp
        self.layers = [layer for stage in layout.stages_of_rank(pp)
                       for layer in layout.layers_of_stage(model, stage)
                       if is_moe_layer(model, layer)]
        n = model.experts // layout.ep
        shapes = expert_shapes(model, n)
        first = self.ep_rank * n
        parts, self.offsets = [], {}
        offset = 0
        for layer in self.layers:
            full = init_full_unit(model, Unit.of_layer(layer), seed)
            start = offset
            for name, shape in shapes.items():
                tensor = full[name][first:first + n]
                parts.append(tensor.reshape(-1))
                self.offsets[(layer, name)] = (offset, shape)
                offset += tensor.numel()
            self.offsets[(layer, "")] = (start, (offset - start,))
        return parts

    def _shard_slices(self, rank: int, dtype: torch.dtype, device: torch.device
                      ) -> torch.Tensor:
        """The rank's slice of each layer's segment (module docstring); its gradient shard."""
        g, k = len(self.group), self.group.index(rank)
        for layer in self.layers:
            size = self.offsets[(layer, "")][1][0]
            if size % g:
                raise ConfigError(f"parallel.zero: layer {layer}'s routed experts hold {size} "
                                  f"parameters on a rank, not divisible by the expert-DP "
                                  f"group of {g} that ZeRO shards them over")
            self.slice[layer] = (k * size // g, (k + 1) * size // g)
        total = sum(b - a for a, b in self.slice.values())
        return torch.zeros(total, dtype=dtype, device=device)

    def _view(self, flat: torch.Tensor, key: tuple[int, str]) -> torch.Tensor:
        start, shape = self.offsets[key]
        numel = 1
        for d in shape:
            numel *= d
        return flat[start:start + numel].view(shape)

    def segment(self, flat: torch.Tensor, layer: int) -> torch.Tensor:
        return self._view(flat, (layer, ""))

    def _shard_of(self, layer: int) -> torch.Tensor:
        """The rank's reduced gradients of the layer's slice (sharded)."""
        offset = 0
        for other in self.layers:
            a, b = self.slice[other]
            if other == layer:
                return self.shard[offset:offset + b - a]
            offset += b - a
        raise KeyError(layer)

    def leaf(self, unit: Unit, name: str) -> torch.Tensor:
        assert unit.layer is not None
        return self.leaves[(unit.layer, name)]

    def accumulate(self, unit: Unit, name: str, grad: torch.Tensor) -> None:
        assert unit.layer is not None
        self._view(self.grads, (unit.layer, name)).add_(grad)

    def reduce(self, layer: int, comm: Comm, stream: str = Stream.DP, *,
               async_op: bool = True) -> Handle:
        """The layer's expert gradients summed over the expert-data-parallel group: all-reduced
        in place, or (sharded) reduce-scattered into the rank's slice."""
        full = self.segment(self.grads, layer)
        if not self.sharded:
            return comm.all_reduce(full, (stream, self.group), async_op=async_op)
        shard = self._shard_of(layer)
        out = torch.empty_like(shard)
        held = self.meter.hold(out, "comm")

        def then() -> None:
            shard.add_(out)
            self.meter.drop(held)

        return comm.reduce_scatter(out, full, (stream, self.group), async_op=async_op,
                                   then=then)

    def gather(self, layer: int, comm: Comm, stream: str = Stream.DP, *,
               async_op: bool = True) -> Handle:
        """Sharded: all-gather the layer's updated slices into every member's segment."""
        assert self.sharded, "only sharded expert states are gathered"
        self.stale.discard(layer)
        a, b = self.slice[layer]
        segment = self.segment(self.params, layer)
        mine = segment[a:b].clone()  # all_gather may not read and write one buffer
        return comm.all_gather(own_counter(segment), mine, (stream, self.group),
                               async_op=async_op)

    def release(self, layer: int) -> None:
        """A pass over the layer has ended (ZeRO-3 frees its gathered experts: a subclass)."""

    def free_all(self) -> None:
        """The step has ended (ZeRO-3 frees every gathered layer: a subclass)."""

    def grad_segments(self) -> list[torch.Tensor]:
        """The gradients the optimizer reads: each layer's whole segment, or its slice."""
        if self.sharded:
            return [self._shard_of(layer) for layer in self.layers]
        return [self.segment(self.grads, layer) for layer in self.layers]

    def param_segments(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates, matching `grad_segments`."""
        if self.sharded:
            return [self.segment(self.params, layer)[slice(*self.slice[layer])]
                    for layer in self.layers]
        return [self.segment(self.params, layer) for layer in self.layers]

    @torch.no_grad()
    def square_sum(self) -> torch.Tensor:
        """The squares of the gradients this rank counts in the norm (module docstring)."""
        if not self.counted:
            return torch.zeros((), dtype=torch.float32, device=self.shard.device)
        return sum((g.float().square().sum() for g in self.grad_segments()),
                   torch.zeros((), dtype=torch.float32, device=self.shard.device))

    def step(self) -> None:
        self.optimizer.step(self.grad_segments())
        if self.overlap_gather:
            self.stale = set(self.layers)

    def zero_(self) -> None:
        self.grads.zero_()
        self.shard.zero_()

    def tensors(self, unit: Unit, comm: Comm) -> dict[str, torch.Tensor]:
        """The unit's experts by name, [E/EP, ...] each (copies); first brings in every
        layer the last step left stale (collective over the expert-DP group, in layer order,
        as Megatron-Core's forced param sync before a save)."""
        for layer in sorted(self.stale):
            self.gather(layer, comm, async_op=False)
        return {name: leaf.detach().clone() for (layer, name), leaf in self.leaves.items()
                if layer == unit.layer}
