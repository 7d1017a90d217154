"""The routed experts' parameters on one rank: EP-sharded, reduced over the expert-DP group.

Megatron-Core keeps the experts out of the dense gradient buffers: their gradients are reduced
over the expert-data-parallel group (`traces.expert_grid.expert_data_group`), the rest of the
layer over DP x CP, and the plan counts them apart (`RankContext.expert_params`, the
`ExpertGrads` op). So they live here, not in the flat layout: for each MoE layer of the rank's
stages, its E/EP experts (`params.expert_shapes`: experts ep_rank·E/EP onward) in one flat
parameter tensor and one flat gradient buffer, accumulated over micro-batches and all-reduced
by the layer's `ExpertGrads` op (ZeRO 0; the executor refuses sharded expert states), and
AdamW over each layer's segment as over the dense buckets.

The gradient norm counts each expert once: on the first rank of its expert-DP group, or on
every rank where the statistics' group holds no other member of that group.
"""

from __future__ import annotations

import torch

from executor.comm import Comm, Handle
from executor.memory import MemoryMeter
from executor.optim import AdamW, AdamWConfig
from executor.params import DTYPES, expert_shapes, init_full_unit
from traces.expert_grid import ep_coord, expert_grad_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.ops import Stream
from traces.plan.optimizer import grad_stats_group
from traces.purpose import Unit


class ExpertStore:
    def __init__(self, model: ModelSpec, layout: Layout, rank: int, *, seed: int,
                 grad_dtype: torch.dtype, device: torch.device, meter: MemoryMeter,
                 adamw: AdamWConfig) -> None:
        self.ep, self.ep_rank = layout.ep, ep_coord(layout, rank)
        self.group = expert_grad_group(layout, rank)
        stats = set(grad_stats_group(layout, rank))
        self.counted = self.group.index(rank) == 0 or len(stats & set(self.group)) == 1
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
        self.params = torch.cat(parts).to(DTYPES[model.dtype]).to(device) if parts else \
            torch.zeros(0, device=device)
        self.grads = torch.zeros(offset, dtype=grad_dtype, device=device)
        meter.hold(self.params, "params")
        meter.exclude(self.params)
        meter.hold(self.grads, "grads")
        self.leaves = {key: self._view(self.params, key).detach().requires_grad_()
                       for key in self.offsets if key[1]}
        self.optimizer = AdamW([self.segment(self.params, layer) for layer in self.layers],
                               adamw, meter)

    def _view(self, flat: torch.Tensor, key: tuple[int, str]) -> torch.Tensor:
        start, shape = self.offsets[key]
        numel = 1
        for d in shape:
            numel *= d
        return flat[start:start + numel].view(shape)

    def segment(self, flat: torch.Tensor, layer: int) -> torch.Tensor:
        return self._view(flat, (layer, ""))

    def leaf(self, unit: Unit, name: str) -> torch.Tensor:
        assert unit.layer is not None
        return self.leaves[(unit.layer, name)]

    def accumulate(self, unit: Unit, name: str, grad: torch.Tensor) -> None:
        assert unit.layer is not None
        self._view(self.grads, (unit.layer, name)).add_(grad)

    def reduce(self, layer: int, comm: Comm, stream: str = Stream.DP, *,
               async_op: bool = True) -> Handle:
        """The layer's expert gradients summed over the expert-data-parallel group."""
        return comm.all_reduce(self.segment(self.grads, layer), (stream, self.group),
                               async_op=async_op)

    def grad_segments(self) -> list[torch.Tensor]:
        return [self.segment(self.grads, layer) for layer in self.layers]

    @torch.no_grad()
    def square_sum(self) -> torch.Tensor:
        """The squares of the gradients this rank counts in the norm (module docstring)."""
        if not self.counted:
            return torch.zeros((), dtype=torch.float32, device=self.grads.device)
        return self.grads.float().square().sum()

    def step(self) -> None:
        self.optimizer.step(self.grad_segments())

    def zero_(self) -> None:
        self.grads.zero_()

    def tensors(self, unit: Unit) -> dict[str, torch.Tensor]:
        """The unit's experts by name, [E/EP, ...] each (copies)."""
        return {name: leaf.detach().clone() for (layer, name), leaf in self.leaves.items()
                if layer == unit.layer}
