"""Megatron-Core activation CPU offloading (`--cpu-offloading-num-layers`): the rules Megatron
enforces, the GPU memory it frees and the bytes it moves, and a two-stream timeline of one
micro-batch's forward and backward with the offload (D2H) and reload (H2D) transfers.

Rules from Megatron-Core's TransformerConfig.__post_init__ (transformer_config.py): the layer
count must lie in [0, num_layers); pipeline parallel > 1 and activation recompute are refused.
Transformer Engine's offload handler keeps two layers' activations resident (a double buffer:
the layer being offloaded or reloaded while the next computes), so those two free nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from traces.errors import ConfigError
from traces.fields import check_int

if TYPE_CHECKING:
    from traces.layout import Layout
    from traces.model import ModelSpec

# Host link per direction. NVLink-C2C on Grace: 900 GB/s bidirectional (NVIDIA GB200 NVL72 /
# GH200 spec sheets), 450 GB/s each way. x86 hosts: PCIe 5.0 x16, 32 GT/s x 16 lanes,
# 128b/130b -> ~63 GB/s per direction (the presets' pcie_Bps already carries this).
NVLINK_C2C_BPS = 450e9
GRACE_PREFIXES = ("GB200", "GB300", "GH200")
KEY = "parallel.cpu_offloading_num_layers"
RESIDENT_BUFFER_LAYERS = 2  # TE's double buffer: these layers' activations stay on the GPU


@dataclass(frozen=True)
class OffloadPlan:
    """How many of a rank's transformer layers offload their saved activations."""

    layers: int
    act_bytes_per_layer: float
    host_Bps: float

    @property
    def freed_bytes(self) -> float:
        """GPU memory freed per micro-batch in flight: all offloaded layers but the buffer."""
        return max(0, self.layers - RESIDENT_BUFFER_LAYERS) * self.act_bytes_per_layer

    @property
    def moved_bytes(self) -> float:
        """Bytes over the host link per micro-batch: each layer out (D2H) and back (H2D)."""
        return 2.0 * self.layers * self.act_bytes_per_layer

    @property
    def transfer_s(self) -> float:
        """One layer's offload (or reload) time on the host link."""
        return self.act_bytes_per_layer / self.host_Bps if self.host_Bps > 0 else 0.0


def check(layers: int, num_layers: int, pp: int, recompute: str) -> None:
    """Refuse what Megatron-Core refuses, in one line each."""
    if layers < 0 or layers >= max(num_layers, 1):
        raise ConfigError(f"{KEY}: {layers} must be in [0, {num_layers})")
    if layers and pp > 1:
        raise ConfigError(f"{KEY}: {layers} needs pp = 1 (Megatron-Core "
                          "has no pipeline parallelism with CPU offloading)")
    if layers and recompute not in ("none", ""):
        raise ConfigError(f"{KEY}: {layers} cannot be used with recompute "
                          f"= {recompute} (Megatron-Core refuses offload with recompute)")


def check_with_model(model: ModelSpec, layout: Layout) -> None:
    """The key's rules once the model is known; MoE layers' offload is not modelled."""
    layers = check_int(layout.cpu_offloading_num_layers, KEY,
                       minimum=0, maximum=max(model.layers - 1, 0))
    check(layers, model.layers, layout.pp, str(layout.recompute))
    if layers and model.experts:
        raise ConfigError(f"{KEY}: {layers} is not modelled for "
                          "MoE models (model.experts > 0)")


def freed_layers(layout: Layout) -> int:
    """Layers whose stored activations leave GPU memory: all offloaded but the double buffer."""
    return max(0, layout.cpu_offloading_num_layers - RESIDENT_BUFFER_LAYERS)


def host_link_Bps(accelerator: str, pcie_Bps: float) -> float:
    """Per-direction GPU<->host bandwidth: NVLink-C2C on Grace parts, else the PCIe link."""
    return NVLINK_C2C_BPS if accelerator.upper().startswith(GRACE_PREFIXES) else pcie_Bps


def micro_batch_s(fwd_s: list[float], bwd_s: list[float], plan: OffloadPlan,
                  head: tuple[float, float] = (0.0, 0.0),
                  embed: tuple[float, float] = (0.0, 0.0)) -> float:
    """Forward then backward of one micro-batch with the first `plan.layers` layers offloaded:
    the closed form of the plan's copies (`traces.plan.offload`), which the simulator must equal.

    Compute runs on one stream, transfers on another (one per direction). `embed` is the
    compute before the first layer's forward and after its backward, `head` the output
    layer's forward and backward between the layers' two passes. Layer i's D2H starts when
    its forward ends; forward of layer i + 2 waits for layer i's D2H (the double buffer must
    free a slot), and the backward waits for the last. Reloads run in backward order, one
    buffer ahead: layer i's H2D may start once layer i + 2's backward has begun (the top two:
    once the backward has), and layer i's backward waits for its H2D.
    """
    n, t, k = len(fwd_s), embed[0], plan.transfer_s
    d2h_end = [0.0] * n
    link = 0.0
    for i, f in enumerate(fwd_s):
        if i >= RESIDENT_BUFFER_LAYERS and i - RESIDENT_BUFFER_LAYERS < plan.layers:
            t = max(t, d2h_end[i - RESIDENT_BUFFER_LAYERS])
        t += f
        if i < plan.layers:
            link = max(link, t) + k
            d2h_end[i] = link
    t = max(t + head[0], link)  # the last offloads land before backward may reload them
    h2d, start, bwd_start = t, t, [0.0] * n
    t += head[1]
    for i in reversed(range(n)):
        if i < plan.layers:
            ahead = i + RESIDENT_BUFFER_LAYERS
            gate = bwd_start[ahead] if ahead < n else start
            h2d = max(h2d, gate) + k
            t = max(t, h2d)
        bwd_start[i] = t
        t += bwd_s[i]
    return t + embed[1]
