"""Megatron-Core activation CPU offloading (`--cpu-offloading-num-layers`): the rules Megatron
enforces, the GPU memory it frees and the bytes it moves, Transformer Engine's copy windows, and
the closed form of one micro-batch's forward and backward with the offload (D2H) and reload
(H2D) copies that `traces.plan.offload` puts in the plan.

Rules from Megatron-Core's TransformerConfig.__post_init__ (transformer_config.py): the layer
count must lie in [0, num_layers); pipeline parallel > 1 and activation recompute are refused.
Transformer Engine's offload handler (AsyncDoubleBufferGroupOffloadHandler, cpu_offload_v1.py)
frees offloaded layer j's saved tensors once the forward reaches its window w[j] (the last
offloaded layer's at the forward's end) and, in backward, reloads it into a new buffer just
before layer w[j]'s backward: the last one (w[-1] = L - 1) comes back at once, before the first
backward, while every layer not offloaded is still held. So one offloaded layer's activations
are resident at the peak, L - N + 1 layers of L with N offloaded (Megatron-Core's default
`cpu_offloading_double_buffering = False`; its True adds two preallocated reload buffers).
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
RESIDENT_BUFFER_LAYERS = 1  # the last offloaded layer, reloaded before the first backward


@dataclass(frozen=True)
class OffloadPlan:
    """How many of a rank's transformer layers offload their saved activations."""

    layers: int
    act_bytes_per_layer: float
    host_Bps: float

    @property
    def freed_bytes(self) -> float:
        """GPU memory freed per micro-batch in flight: all offloaded layers but the one
        resident at the peak (module docstring)."""
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
    """Layers whose stored activations leave GPU memory at the peak: all offloaded but the
    one reloaded before the first backward (module docstring)."""
    return max(0, layout.cpu_offloading_num_layers - RESIDENT_BUFFER_LAYERS)


def host_link_Bps(accelerator: str, pcie_Bps: float) -> float:
    """Per-direction GPU<->host bandwidth: NVLink-C2C on Grace parts, else the PCIe link."""
    return NVLINK_C2C_BPS if accelerator.upper().startswith(GRACE_PREFIXES) else pcie_Bps


def windows(layers: int, offloaded: int) -> tuple[int, ...]:
    """Transformer Engine's `layer_window_map` (AsyncDoubleBufferGroupOffloadHandler,
    transformer_engine/pytorch/cpu_offload_v1.py): `w[j]`, the layer after whose forward the
    compute waits for offload j and offload j + 1 starts, and before whose backward reload j
    starts; the offloaded layers' copies spread evenly over the `layers` (w[-1] = layers - 1)."""
    if not offloaded:
        return ()
    per, extra = divmod(layers, offloaded)
    out, constant = [], 0
    for j in range(offloaded):
        window = per * (j + 1) - 1
        if j < extra:
            constant = j + 1
            window += j + 1
        else:
            window += constant
        out.append(window)
    return tuple(out)


def micro_batch_s(fwd_s: list[float], bwd_s: list[float], plan: OffloadPlan,
                  head: tuple[float, float] = (0.0, 0.0),
                  embed: tuple[float, float] = (0.0, 0.0)) -> float:
    """Forward then backward of one micro-batch with the first `plan.layers` layers offloaded:
    the closed form of the plan's copies (`traces.plan.offload`), which the simulator must equal.

    Compute runs on one stream, offloads on a second, reloads on a third, as Transformer
    Engine's handler issues them (`windows`: w). `embed` is the compute before the first
    layer's forward and after its backward, `head` the output layer's forward and backward
    between the layers' two passes. Offload 0 starts when layer 0's forward ends; after layer
    w[j]'s forward the compute waits for offload j, and offload j + 1 starts. Before layer
    w[j]'s backward the compute waits for reload j + 1, and reload j starts; layer 0's
    backward waits for reload 0.
    """
    n, k = len(fwd_s), plan.transfer_s
    w = windows(n, plan.layers)
    t, j, d2h = embed[0], 0, 0.0
    for i, f in enumerate(fwd_s):
        t += f
        if i == 0 and w:
            d2h = t + k
        if j < len(w) and w[j] == i:
            t = max(t, d2h)
            if j + 1 < len(w):
                d2h = t + k
            j += 1
    t += head[0] + head[1]
    h2d, j = 0.0, len(w)
    for i in reversed(range(n)):
        if j and w[j - 1] == i:
            t = max(t, h2d)  # reload j landed (0 before the first)
            h2d = t + k
            j -= 1
        if i == 0 and w:
            t = max(t, h2d)
        t += bwd_s[i]
    return t + embed[1]
