"""Calibration profiles: the parameters of the compute model and of the links, as a JSON file.

    {"schema": "parasim.profile", "version": 2, "name": "...", "calibrated": false,
     "compute": {"gemm_efficiency": 0.85, "gemm_tiles": [[256, 128], ...],
                 "memory_efficiency": 0.8, "launch_overhead_s": 3e-6, "roofline_exponent": 2,
                 "kernels": {"flash_attn": {"flops_efficiency": 0.6}}},
     "links": {"loopback": {"bandwidth_Bps": 1.4e9, "latency_s": 8e-5, "call_s": 3e-4}},
     "accelerator": {"peak_flops": 7.1e10, "hbm_bandwidth_Bps": 9.5e9},
     "measured_on": "CPU-localhost", "measured_ranks": 4}

`sim.models.compute` times kernels with `compute`; `links` (optional) replaces the cluster's
figures for a class of links, as `parasim calibrate` measures them; `accelerator` (optional) the
roofs (the CPU of `localhost` has no data sheet); `applied_to(cluster)` puts both in place. A
calibrated profile names the accelerator it was measured on (`measured_on`: it applies to that
one only, else one error line) and its ranks (`measured_ranks`: `validate` compares its run's).
Uncalibrated, presets have defaults from public kernel benchmarks (cited below), never from an
end-to-end table. Read through `traces.fields`: an unknown key or kernel, an efficiency outside
(0, 1], a non-finite number is one error line; version-1 profiles are refused saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.models import rates
from topology.cluster import LINK_KINDS, Accelerator, Cluster
from topology.override import with_accelerator, with_links
from traces.errors import ConfigError, show
from traces.fields import (
    MAX_BANDWIDTH_BPS,
    MAX_LATENCY_S,
    MAX_TFLOPS,
    MIN_BANDWIDTH_BPS,
    MIN_TFLOPS,
    Fields,
    check_efficiency,
    check_int,
    check_line,
    check_number,
)
from traces.files import load_json, write_text_atomic
from traces.purpose import Kernel

VERSION = 2
KERNEL_NAMES = tuple(str(k) for k in Kernel)
"""The kernels a profile may tune (`traces.purpose.Kernel`)."""
MAX_COMM_INTERFERENCE = 10.0
"""The largest `comm_interference` (kernels 11 times slower beside data) or
`compute_interference` a profile holds."""
Tile = tuple[int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelCost:
    """Per-kernel overrides of the compute parameters (None: the general value)."""

    flops_efficiency: float | None = None
    memory_efficiency: float | None = None
    overhead_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("flops_efficiency", "memory_efficiency"):
            if getattr(self, name) is not None:
                check_efficiency(getattr(self, name), name)
        if self.overhead_s is not None:
            check_number(self.overhead_s, "overhead_s", minimum=0.0, maximum=MAX_LATENCY_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeParams:
    """How close to the accelerator's roofs kernels run (see `sim.models.compute`)."""

    gemm_efficiency: float
    """Achieved fraction of the sustained FLOP/s (`Accelerator.sustained_flops`: the roof at
    the clock held at the power limit) of a GEMM whose tiles fill every unit."""
    gemm_tiles: tuple[Tile, ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128),
                                    (64, 64))
    """Output tiles the GEMM library chooses among (CUTLASS's usual bf16 CTA tiles)."""
    memory_efficiency: float = 0.8
    """Achieved fraction of sustained HBM bandwidth (`Accelerator.sustained_hbm_Bps`) of a
    streaming kernel."""
    launch_overhead_s: float = 3e-6
    """Fixed time per kernel launch."""
    roofline_exponent: float = 2.0
    """p in (compute^p + memory^p)^(1/p): how a kernel near the ridge point is slower than
    either roof alone (p = 2: √2 at the ridge; p → ∞ is the bare maximum)."""
    kernels: Mapping[str, KernelCost] = field(default_factory=dict)
    comm_interference: float = 0.0
    """While a rank has communication in flight, its kernels take (1 + this) times as long:
    on a CPU, gloo's threads run on the cores the kernels need; on a GPU, NCCL runs on SMs of
    its own and the kernels barely notice (0)."""
    compute_interference: float = 0.0
    """The other way round: communication that starts while one of its ranks runs a kernel
    takes (1 + this) times as long. On a CPU, gloo's threads get the cores only
    between the kernels' time slices; on a GPU, NCCL's SMs are its own (0)."""
    compute_interference_delay_s: float = 0.0
    """... and first waits this long, whatever its size: on a CPU, gloo's woken thread waits
    for the scheduler to give it a core the kernels hold (0.35 ms fitted on a 2-vCPU VM); on
    a GPU, 0."""

    def __post_init__(self) -> None:
        check_efficiency(self.gemm_efficiency, "compute.gemm_efficiency")
        check_number(self.comm_interference, "compute.comm_interference", minimum=0.0,
                     maximum=MAX_COMM_INTERFERENCE)
        check_number(self.compute_interference, "compute.compute_interference", minimum=0.0,
                     maximum=MAX_COMM_INTERFERENCE)
        check_number(self.compute_interference_delay_s, "compute.compute_interference_delay_s",
                     minimum=0.0, maximum=MAX_LATENCY_S)
        check_efficiency(self.memory_efficiency, "compute.memory_efficiency")
        check_number(self.launch_overhead_s, "compute.launch_overhead_s", minimum=0.0,
                     maximum=MAX_LATENCY_S)
        check_number(self.roofline_exponent, "compute.roofline_exponent", minimum=1.0,
                     maximum=64.0)
        if not self.gemm_tiles:
            raise ConfigError("compute.gemm_tiles: must list at least one [rows, columns] tile")
        for tile in self.gemm_tiles:
            for side in tile:
                check_int(side, "compute.gemm_tiles", minimum=1, maximum=4096)
        unknown = sorted(set(self.kernels) - set(KERNEL_NAMES))
        if unknown:
            raise ConfigError(f"compute.kernels.{unknown[0]}: unknown kernel (known: "
                              f"{', '.join(KERNEL_NAMES)})")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkParams:
    """Measured figures of one class of links, replacing the cluster's."""

    bandwidth_Bps: float
    latency_s: float
    call_s: float = 0.0
    """What a collective call costs the library once, before any message moves, where the
    ranks are joined by this class (gloo on loopback hands each call to a worker thread and
    back: `sim.collectives.gloo`); NCCL's launch is its own model's (`nccl_plan`)."""

    def __post_init__(self) -> None:
        check_number(self.bandwidth_Bps, "bandwidth_Bps", minimum=MIN_BANDWIDTH_BPS,
                     maximum=MAX_BANDWIDTH_BPS)
        check_number(self.latency_s, "latency_s", minimum=0.0, maximum=MAX_LATENCY_S)
        check_number(self.call_s, "call_s", minimum=0.0, maximum=MAX_LATENCY_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorRoofs:
    """Measured roofs replacing the accelerator's data-sheet figures."""

    peak_flops: float
    hbm_bandwidth_Bps: float

    def __post_init__(self) -> None:
        check_number(self.peak_flops, "accelerator.peak_flops", minimum=MIN_TFLOPS * 1e12,
                     maximum=MAX_TFLOPS * 1e12)
        check_number(self.hbm_bandwidth_Bps, "accelerator.hbm_bandwidth_Bps",
                     minimum=MIN_BANDWIDTH_BPS, maximum=MAX_BANDWIDTH_BPS)


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    compute: ComputeParams
    links: Mapping[str, LinkParams] = field(default_factory=dict)
    calibrated: bool = False
    """Fitted from measurements (`parasim calibrate`), or the built-in defaults."""
    accelerator: AcceleratorRoofs | None = None
    """Measured roofs (None: the cluster's accelerator figures stand)."""
    measured_on: str | None = None
    """The accelerator (`Accelerator.name`) a calibrated profile was measured on."""
    measured_ranks: int | None = None
    """Ranks of the runs it was fitted to (None: not recorded, by an older parasim)."""

    def __post_init__(self) -> None:
        check_line(self.name, "name")
        if self.measured_on is not None:
            check_line(self.measured_on, "measured_on")
        # A class the cluster at hand lacks is no error (a profile measured on servers with
        # NVLink and InfiniBand applies to one server without InfiniBand: topology.override);
        # a class no cluster has is a typo that would silently change the answer.
        for kind in sorted(self.links):
            if kind not in LINK_KINDS:
                raise ConfigError(f"links.{show(kind)[1:-1]}: unknown link class (known: "
                                  f"{', '.join(LINK_KINDS)})")

    def check_accelerator(self, accelerator: Accelerator) -> None:
        """One error line unless this profile may time `accelerator`: a calibrated profile's
        figures are those of the accelerator it was measured on, and of no other."""
        if not self.calibrated:
            return
        if self.measured_on is None:
            raise ConfigError(f"profile {self.name}: calibrated, but it does not say which "
                              "accelerator it was measured on (measured_on; written by an "
                              "older parasim): calibrate again")
        if self.measured_on != accelerator.name:
            raise ConfigError(f"profile {self.name} was measured on {self.measured_on}, but "
                              f"the cluster's accelerators are {accelerator.name}: compute "
                              "and link figures do not transfer between accelerators; "
                              f"calibrate on {accelerator.name}, or leave the profile out "
                              "for its defaults")

    def applied_to(self, cluster: Cluster) -> Cluster:
        """`cluster` with this profile's measured link classes and roofs in place (one error
        line if the profile was measured on another accelerator: `check_accelerator`)."""
        self.check_accelerator(cluster.accelerator)
        cluster = with_links(cluster, {kind: (p.bandwidth_Bps, p.latency_s)
                                       for kind, p in self.links.items()},
                             calls={kind: p.call_s for kind, p in self.links.items()})
        if self.accelerator is None:
            return cluster
        return with_accelerator(cluster, peak_flops=self.accelerator.peak_flops,
                                hbm_bandwidth_Bps=self.accelerator.hbm_bandwidth_Bps)

    def kernel(self, name: str) -> KernelCost:
        return self.compute.kernels.get(name, _NO_OVERRIDE)

    def to_json(self) -> dict[str, Any]:
        c = self.compute
        kernels = {name: {k: v for k, v in (("flops_efficiency", cost.flops_efficiency),
                                             ("memory_efficiency", cost.memory_efficiency),
                                             ("overhead_s", cost.overhead_s)) if v is not None}
                   for name, cost in sorted(c.kernels.items())}
        out: dict[str, Any] = {
            "schema": "parasim.profile", "version": VERSION, "name": self.name,
            "calibrated": self.calibrated,
            "compute": {"gemm_efficiency": c.gemm_efficiency,
                        "gemm_tiles": [list(t) for t in c.gemm_tiles],
                        "memory_efficiency": c.memory_efficiency,
                        "launch_overhead_s": c.launch_overhead_s,
                        "roofline_exponent": c.roofline_exponent,
                        "comm_interference": c.comm_interference,
                        "compute_interference": c.compute_interference,
                        "compute_interference_delay_s": c.compute_interference_delay_s,
                        "kernels": kernels},
            "links": {kind: {"bandwidth_Bps": p.bandwidth_Bps, "latency_s": p.latency_s,
                             **({"call_s": p.call_s} if p.call_s else {})}
                      for kind, p in sorted(self.links.items())}}
        if self.accelerator is not None:
            out["accelerator"] = {"peak_flops": self.accelerator.peak_flops,
                                  "hbm_bandwidth_Bps": self.accelerator.hbm_bandwidth_Bps}
        return {**out, **{k: v for k in ("measured_on", "measured_ranks")
                          if (v := getattr(self, k)) is not None}}

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")


_NO_OVERRIDE = KernelCost()


def load_profile(path: str | Path, what: str = "--profile") -> Profile:
    """Read and check a profile file (see `profile_from_json`); `what` names where it was
    given in errors (the flag, or a config's "sim.profile")."""
    return profile_from_json(load_json(path, what=what), f"{what}: {path}")


def profile_from_json(data: object, source: str = "profile") -> Profile:
    """A profile from its JSON object; every bad key or value is one ConfigError line."""
    if not isinstance(data, dict) or data.get("schema") != "parasim.profile":
        raise ConfigError(f"{source}: not a parasim profile (schema parasim.profile)")
    version = data.get("version")
    if type(version) is int and version == 1:
        raise ConfigError(f"{source}: a version-1 profile (per-op-class efficiencies); this "
                          f"parasim reads version {VERSION} (per-kernel compute parameters): "
                          "calibrate again with `parasim calibrate`")
    if type(version) is not int or version != VERSION:
        raise ConfigError(f"{source}: has version {show(version)}; this parasim reads "
                          f"version {VERSION}")
    try:
        fields = Fields(data, "profile").known(("schema", "version", "name", "calibrated",
                                                "compute", "links", "accelerator",
                                                "measured_on", "measured_ranks"))
        links = fields.sub("links")
        return Profile(name=fields.line("name", str(source)),
                       calibrated=fields.boolean("calibrated", False),
                       compute=_compute(fields.sub("compute")),
                       links={kind: _link(links.sub(kind)) for kind in links.table},
                       accelerator=_roofs(fields.sub("accelerator"))
                       if "accelerator" in fields else None,
                       measured_on=fields.line("measured_on", "")
                       if "measured_on" in fields else None,
                       measured_ranks=fields.integer("measured_ranks", 0, minimum=1,
                                                     maximum=1 << 20) or None)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _compute(fields: Fields) -> ComputeParams:
    fields.known(("gemm_efficiency", "gemm_tiles", "memory_efficiency", "launch_overhead_s",
                  "roofline_exponent", "comm_interference", "compute_interference",
                  "compute_interference_delay_s", "kernels"))
    if "gemm_efficiency" not in fields:
        raise ConfigError(f"{fields.name('gemm_efficiency')}: missing")
    base = ComputeParams(gemm_efficiency=1.0)
    tiles = base.gemm_tiles
    if "gemm_tiles" in fields:
        raw = fields.table["gemm_tiles"]
        if not isinstance(raw, list) or not all(isinstance(t, list) and len(t) == 2 for t in raw):
            raise ConfigError(f"{fields.name('gemm_tiles')}: {show(raw)} must be a list of "
                              "[rows, columns] pairs")
        tiles = tuple((t[0], t[1]) for t in raw)
    kernels = fields.sub("kernels").known(KERNEL_NAMES)
    return ComputeParams(
        gemm_efficiency=fields.efficiency("gemm_efficiency", 1.0), gemm_tiles=tiles,
        memory_efficiency=fields.efficiency("memory_efficiency", base.memory_efficiency),
        launch_overhead_s=fields.number("launch_overhead_s", base.launch_overhead_s,
                                        minimum=0.0, maximum=MAX_LATENCY_S, unit=" s"),
        comm_interference=fields.number("comm_interference", base.comm_interference,
                                        minimum=0.0, maximum=MAX_COMM_INTERFERENCE),
        compute_interference=fields.number("compute_interference",
                                           base.compute_interference, minimum=0.0,
                                           maximum=MAX_COMM_INTERFERENCE),
        compute_interference_delay_s=fields.number(
            "compute_interference_delay_s", base.compute_interference_delay_s, minimum=0.0,
            maximum=MAX_LATENCY_S, unit=" s"),
        roofline_exponent=fields.number("roofline_exponent", base.roofline_exponent,
                                        minimum=1.0, maximum=64.0),
        kernels={name: _kernel(kernels.sub(name)) for name in kernels.table})


def _kernel(fields: Fields) -> KernelCost:
    fields.known(("flops_efficiency", "memory_efficiency", "overhead_s"))
    efficiencies = {k: fields.efficiency(k, 1.0) for k in ("flops_efficiency",
                                                          "memory_efficiency") if k in fields}
    return KernelCost(**efficiencies, overhead_s=fields.number(
        "overhead_s", 0.0, minimum=0.0, maximum=MAX_LATENCY_S, unit=" s")
        if "overhead_s" in fields else None)


def _link(fields: Fields) -> LinkParams:
    fields.known(("bandwidth_Bps", "latency_s", "call_s"))
    for key in ("bandwidth_Bps", "latency_s"):
        if key not in fields:
            raise ConfigError(f"{fields.name(key)}: missing")
    return LinkParams(bandwidth_Bps=fields.number("bandwidth_Bps", 0.0,
                                                  minimum=MIN_BANDWIDTH_BPS,
                                                  maximum=MAX_BANDWIDTH_BPS),
                      latency_s=fields.number("latency_s", 0.0, minimum=0.0,
                                              maximum=MAX_LATENCY_S, unit=" s"),
                      call_s=fields.number("call_s", 0.0, minimum=0.0,
                                           maximum=MAX_LATENCY_S, unit=" s"))


def _roofs(fields: Fields) -> AcceleratorRoofs:
    fields.known(("peak_flops", "hbm_bandwidth_Bps"))
    for key in ("peak_flops", "hbm_bandwidth_Bps"):
        if key not in fields:
            raise ConfigError(f"{fields.name(key)}: missing")
    return AcceleratorRoofs(
        peak_flops=fields.number("peak_flops", 0.0, minimum=MIN_TFLOPS * 1e12,
                                 maximum=MAX_TFLOPS * 1e12),
        hbm_bandwidth_Bps=fields.number("hbm_bandwidth_Bps", 0.0, minimum=MIN_BANDWIDTH_BPS,
                                        maximum=MAX_BANDWIDTH_BPS))


# Defaults per accelerator: efficiencies relative to the sustained roof, each derived from a
# public GEMM benchmark at a known clock by the one rule of `sim.models.rates` (cited there);
# streaming kernels reach ~80% of HBM bandwidth (STREAM-like copies on HBM2e/HBM3), whose clock
# the power limit leaves alone; launches: ~3 us per kernel ("Getting Started with CUDA Graphs",
# NVIDIA blog, 2019: a few microseconds per launch, which graphs remove); XLA on TPU fuses: 1 us;
# TPU v4 runs one clock (sustained = peak): PaLM (Chowdhery et al., 2022) ran at 57.8% hardware
# FLOPs utilisation end to end, so matrix units reach at least that per op: 0.75; one 128x128
# tile per MXU.
DEFAULTS: dict[str, ComputeParams] = {
    "A100-SXM4-80GB": ComputeParams(gemm_efficiency=rates.A100.gemm, kernels={
        "flash_attn": KernelCost(flops_efficiency=rates.A100.flash_attn)}),
    "H100-SXM5-80GB": ComputeParams(gemm_efficiency=rates.H100.gemm, kernels={
        "flash_attn": KernelCost(flops_efficiency=rates.H100.flash_attn)}),
    "TPU-v4": ComputeParams(gemm_efficiency=0.75, gemm_tiles=((128, 128),),
                            launch_overhead_s=1e-6, kernels={
                                "flash_attn": KernelCost(flops_efficiency=0.6)}),
}
DEFAULTS["B200-SXM-180GB"] = ComputeParams(gemm_efficiency=rates.B200.gemm, kernels={
    "flash_attn": KernelCost(flops_efficiency=rates.B200.flash_attn)})
DEFAULTS["H200-SXM-141GB"] = DEFAULTS["H100-SXM5-96GB"] = DEFAULTS["H100-SXM5-80GB"]  # Hopper
DEFAULTS["GB200-186GB"] = DEFAULTS["B200-SXM-180GB"]  # B200's die pair; Blackwell Ultra: B200's
DEFAULTS["B300-SXM-288GB"] = DEFAULTS["GB300-288GB"] = ComputeParams(  # GEMMs, faster exp
    gemm_efficiency=rates.B200.gemm,
    kernels={"flash_attn": KernelCost(flops_efficiency=rates.BLACKWELL_ULTRA_FLASH)})
# The CPU of `localhost`: no SMs to quantize over (one small tile), about half the core's peak
# in a BLAS, ~10 us of PyTorch dispatch per eager op. Ranks are processes with one compute
# thread each, at least as many as cores (the host runs up to 8 whatever its cores), and gloo
# moves a rank's data on a thread that shares the rank's cores: comm_interference 1 (kernels
# at half speed while data moves) and compute_interference 0.6 after a 0.5 ms wait for a core
# (0.65 after 0.35 ms [0, 1.5] fitted on a 2-vCPU VM with 2 ranks, from a 64 KiB and an 8 MiB
# all-reduce each alone and issued just before a chain of GEMMs; beside a running kernel, 1 KiB
# to 1 MiB took 3-7 ms longer, but the executor issues between kernels): rough figures for
# uncalibrated use only, which `parasim calibrate --run` measures (traces.bench,
# sim.calibrate.interference).
DEFAULTS["CPU-localhost"] = ComputeParams(gemm_efficiency=0.5, gemm_tiles=((8, 8),),
                                          memory_efficiency=0.7, launch_overhead_s=10e-6,
                                          comm_interference=1.0, compute_interference=0.6,
                                          compute_interference_delay_s=0.5e-3)


def default_profile(accelerator: Accelerator) -> Profile:
    """The built-in profile for a preset accelerator (generic figures for unknown ones)."""
    compute = DEFAULTS.get(accelerator.name, ComputeParams(gemm_efficiency=0.7))
    return Profile(name=f"default-{accelerator.name}", compute=compute)
