"""Compute time of one op: GEMMs by shape, streaming kernels by bytes, plus launches.

For a GEMM op (`op.gemm` = (batch, M, N, K)) the library splits the M×N output into tiles, one
per compute unit at a time (SMs on a GPU), and picks the tile shape that finishes soonest:

    tiles  = batch · ⌈M/tm⌉ · ⌈N/tn⌉           (tile quantization: edge tiles do full work)
    waves  = ⌈tiles / units⌉                   (wave quantization: the last wave runs part-full)
    t_gemm = waves · 2·tm·tn·K / (sustained/units · gemm_efficiency)

where `sustained` is the accelerator's roof at the clock it holds at its power limit
(`Accelerator.sustained_flops`, docs/sustained-rates.md; an FP8 GEMM, `op.dtype` "fp8", the
FP8 roof at that clock; an NVFP4 GEMM, "fp4", the FP4 roof), so a large GEMM runs at
`gemm_efficiency` of it, and a small, skinny or TP-sharded one
further from it: 109 tiles on 108 SMs take two waves, twice as long as 108. A backward op
runs two GEMMs, the input gradient (M, K, N) and the weight gradient (K, N, M). Other ops with
FLOPs (a flash-attention kernel) run at their kernel's efficiency of the same roof.

Every op also moves `mem_bytes` through HBM at `memory_efficiency` of its sustained
bandwidth, and draws `draws` random numbers (dropout's masks) on the integer lanes:
PHILOX_INT_OPS_PER_DRAW instructions each at the accelerator's `int32_ops_per_s`. The times
combine as (t_compute^p + t_int^p + t_memory^p)^(1/p) (p = `roofline_exponent`): a clearly
compute- or memory-bound kernel costs its larger time, but one near the ridge point does not
hide one under the other for free. Each kernel launch adds `launch_overhead_s` (a software
stack may launch several for one op, or none: `launches`). A measured op (one with start/end,
from a real run) keeps its measured duration. A plan's op is costed as its kernel (its
purpose's, `traces.purpose.KernelRun`), which the profile may tune; an op imported from
elsewhere (no purpose) by its name. A GEMM chunk of tp_comm_overlap (`GemmChunk`, in any
phase) is one GEMM of its own shape: a fraction of the tokens of one product, on the SMs its
communication leaves it (`GemmChunk.comm_sms`: Transformer Engine's set_sm_margin, `math_units`).
An activation offload copy (`HostCopy`) takes its bytes over the host link (`host_Bps`).

A plan GEMM the software stack runs as several GEMMs on one input (`splits`,
`traces.stack.gemm_splits`: torchtitan's separate wq, wk, wv and w1, w3 under the eager and
compiled stacks) costs the sum of its parts, each with its share of N, FLOPs and bytes plus
the input it reads again (and, in backward, the input gradient it writes and the input its
weight gradient reads again: `GemmSplit.extra_bytes`), each by its own tiles and roofline: at
TP 8 Llama 3 70B's wk and wv are 128 columns wide, memory-bound where the fused qkv is not.
AsyncTP's chunks of such a GEMM split likewise (fused_all_gather_matmul runs one mm per
weight on each gathered chunk).

The local experts' grouped GEMM (`expert_fc1`, `expert_fc2`: op.gemm = (E, M, N, K)) is one
kernel over all E experts' tiles by default. Under Transformer Engine (`model.moe_gemm_streams`
= S > 0) it is E cuBLAS GEMMs (Megatron-Core's --moe-grouped-gemm: "launch multiple local GEMM
kernels in multiple streams ... with GroupedLinear in TransformerEngine", NVIDIA/Megatron-LM
megatron/core/transformer/moe/README.md @022bcb5): nvte_multi_tensor_gemm takes its cuBLAS
path unless the GPU is Hopper and NVTE_USE_CUTLASS_GROUPED_GEMM is set (off by default) with
BF16 operands, and multi_stream_cublas_gemm launches GEMM i on compute stream
i % num_streams, then joins the streams (NVIDIA/TransformerEngine
transformer_engine/common/gemm/cublaslt_gemm.cu @0143a5e); num_streams is 4
(transformer_engine/common/util/multi_stream.cpp @3e125d6, get_num_compute_streams). Equal
GEMMs on S streams run in ⌈E/S⌉ rounds of at most S at once, each round's tiles sharing the
SMs (`expert_rounds`): a round's waves are ⌈c·tiles/units⌉ for its c GEMMs, not a share of
all E experts' pooled waves, and each round pays a launch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from math import ceil

from sim.profile import Profile
from topology.cluster import Accelerator
from traces.errors import ConfigError
from traces.fp8 import fp8_gemm_rate
from traces.kernel_names import Kernel
from traces.model import ModelSpec
from traces.moe_spec import gemm_streams
from traces.ops import Op, Phase
from traces.purpose import GemmChunk, HostCopy, KernelRun
from traces.stack import GemmSplit, gemm_splits

PHILOX_INT_OPS_PER_DRAW = 20.0
"""32-bit integer instructions per random draw of PyTorch's, Megatron-LM's and
FlashAttention's dropout: Philox4x32-10 (cuRAND's curand_uniform4) yields four draws per call
of ten rounds, each round two 32x32-bit multiplies kept whole (a low and a high half: four
instructions), two three-input XORs (one LOP3 each) and the key's two additions: 8 x 10 / 4
= 20 a draw. The float conversion and the compare with p run on the FP32 lanes."""


EXPERT_GEMMS = frozenset({str(Kernel.EXPERT_FC1), str(Kernel.EXPERT_FC2)})
"""The grouped expert GEMMs `model.moe_gemm_streams` splits (module docstring)."""


def expert_rounds(experts: int, streams: int) -> list[int]:
    """The GEMMs in flight in each round when `experts` equal GEMMs go round-robin onto
    `streams` streams (module docstring): S per round, the last the remainder; one round of
    all of them with no streams (0: the one grouped kernel)."""
    if streams <= 0 or experts <= streams:
        return [experts]
    full, rest = divmod(experts, streams)
    return [streams] * full + ([rest] if rest else [])


def draw_seconds(draws: float, accelerator: Accelerator) -> float:
    """Seconds `draws` random numbers take on the accelerator's integer lanes (0 where it has
    no integer figure)."""
    rate = accelerator.int32_ops_per_s
    return draws * PHILOX_INT_OPS_PER_DRAW / rate if rate else 0.0


class ComputeModel:
    """Kernel durations for one accelerator and profile, cached per distinct kernel."""

    def __init__(self, accelerator: Accelerator, profile: Profile,
                 launches: Mapping[tuple[str, bool], int] | None = None,
                 host_Bps: float = 0.0, fp8_rate: float = 1.0, expert_streams: int = 0,
                 splits: Mapping[str, GemmSplit] | None = None) -> None:
        self.accelerator = accelerator
        self.splits = splits or {}
        """Per kernel, the GEMMs a software stack runs one plan GEMM as
        (`traces.stack.gemm_splits`: torchtitan's wq, wk, wv and w1, w3); each part costed
        as its own GEMM (`kernel_time`)."""
        self.expert_streams = expert_streams
        """`model.moe_gemm_streams`: 0, the grouped expert GEMM one kernel; S, one GEMM per
        expert on S streams (module docstring)."""
        self.fp8_rate = fp8_rate
        """The model's FP8 GEMMs' rate as a fraction of the FP8 roof: its recipe's
        (`traces.fp8.fp8_gemm_rate`; MXFP8's block-scaled GEMMs below 1)."""
        self.host_Bps = host_Bps
        """The host link per direction that times activation offload copies (`HostCopy`:
        `sim.models.host_link`); 0: none known, and a copy is refused."""
        self.profile = profile
        self.launches = launches or {}
        """Device kernels per (kernel, backward) where the model's software stack states them
        (`traces.stack.launch_counts`: eager PyTorch's several for a norm, compiled's none
        for an op fused into another's kernel); others launch their own one (a GEMM's
        backward two)."""
        self._cache: dict[tuple[object, ...], float] = {}
        self._last: dict[int, tuple[object, ...]] = {}
        """Per purpose object (by id, the purpose kept so the id is never reused): the last
        op's fields the duration depends on, and its seconds. A plan shares one purpose among
        the ops of one kernel (682 purposes for 720,816 kernels of GPT-3 on 1024 GPUs), so
        comparing six fields usually answers without building and hashing `_kernel_key`."""

    @staticmethod
    def of_model(accelerator: Accelerator, profile: Profile, model: ModelSpec | None,
                 launches: Mapping[tuple[str, bool], int] | None = None,
                 host_Bps: float = 0.0) -> ComputeModel:
        """The compute model of `model`'s kernels: its FP8 recipe's GEMM rate
        (`traces.fp8.fp8_gemm_rate`), its stack's expert GEMM streams
        (`traces.moe_spec.gemm_streams`) and split GEMMs (`traces.stack.gemm_splits`), as
        every interpreter of a plan costs them; None (a trace naming no model): none of them."""
        if model is None:
            return ComputeModel(accelerator, profile, launches, host_Bps)
        return ComputeModel(accelerator, profile, launches, host_Bps, fp8_gemm_rate(model),
                            gemm_streams(model), gemm_splits(model))

    def duration(self, op: Op) -> float:
        if op.start is not None and op.end is not None:
            return op.end - op.start
        purpose = op.purpose
        last = self._last.get(id(purpose))
        if last is not None:
            same, phase, flops, mem_bytes, draws, gemm, dtype, name, seconds = last
            if (same is purpose and phase is op.phase and flops == op.flops
                    and mem_bytes == op.mem_bytes and draws == op.draws and gemm == op.gemm
                    and dtype == op.dtype and (purpose is not None or name == op.name)):
                return seconds  # type: ignore[return-value]
        if type(purpose) is HostCopy:
            return self.copy_seconds(op)
        seconds = self._keyed(op)
        self._last[id(purpose)] = (purpose, op.phase, op.flops, op.mem_bytes, op.draws, op.gemm,
                                   op.dtype, op.name, seconds)
        return seconds

    def _keyed(self, op: Op) -> float:
        """`duration` of an untimed op by its full `_kernel_key` (and the units it runs on)."""
        units = self.math_units(op)
        key = _kernel_key(op) if units is None else (*_kernel_key(op), units)
        seconds = self._cache.get(key)
        if seconds is None:
            seconds = self._cache[key] = self.kernel_time(
                key[0], op.flops, op.mem_bytes, op.gemm, backward=key[1], fp8=key[5],
                units=units, draws=op.draws)
        return seconds

    def math_units(self, op: Op) -> int | None:
        """The compute units a GEMM chunk of tp_comm_overlap runs on where its communication
        holds `GemmChunk.comm_sms` of them for the whole chunk (None: all of them).
        Transformer Engine launches every GEMM of an overlap with set_sm_margin on
        `sm_count - num_comm_sm` SMs, whether or not the collective is still moving
        (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp, CommOverlapCore's
        constructor: `_math_sms = set_sm_margin ? sm_count - num_comm_sm : sm_count`, the
        `math_sm_count` of each of its GEMMs). A margin of SMs is a GPU's: an accelerator with
        no more units than it (a CPU host, a TPU's matrix units) keeps all of them."""
        purpose = op.purpose
        if type(purpose) is not GemmChunk or not purpose.comm_sms:
            return None
        units = self.accelerator.compute_units
        return units - purpose.comm_sms if purpose.comm_sms < units else None

    def copy_seconds(self, op: Op) -> float:
        """An activation offload copy (`HostCopy`): its bytes over the host link, one
        direction (a copy stream holds one copy at a time; PCIe and NVLink-C2C are full
        duplex, so the other direction's copies do not share it)."""
        if self.host_Bps <= 0:
            raise ConfigError("parallel.cpu_offloading_num_layers: the cluster has no host "
                              "link (PCIe or NVLink-C2C) to time the offload copies on")
        return op.size_bytes / self.host_Bps

    def shared_duration(self, op: Op, units: int, hbm_fraction: float) -> float:
        """`duration(op)` on `units` of the accelerator's compute units and `hbm_fraction` of
        its HBM bandwidth: the op beside communication that holds the rest
        (`sim.models.interference.GpuInterference`); a GEMM chunk that leaves SMs to its own
        collective (`math_units`) runs on that many fewer again: both hold theirs at once.
        A measured op keeps its duration."""
        if op.start is not None and op.end is not None:
            return op.end - op.start
        if type(op.purpose) is HostCopy:  # the copy engines: no SMs, no HBM share to lose
            return self.copy_seconds(op)
        math = self.math_units(op)
        if math is not None:
            units = max(1, units - (self.accelerator.compute_units - math))
        key = (*_kernel_key(op), units, hbm_fraction)
        seconds = self._cache.get(key)
        if seconds is None:
            seconds = self._cache[key] = self.kernel_time(
                key[0], op.flops, op.mem_bytes, op.gemm, backward=key[1], fp8=key[5],
                units=units, hbm_fraction=hbm_fraction, draws=op.draws)
        return seconds

    def kernel_time(self, name: str, flops: float, mem_bytes: float, gemm: tuple[int, ...] = (),
                    *, backward: bool | str = False, fp8: bool | str = False,
                    units: int | None = None,
                    hbm_fraction: float = 1.0, draws: float = 0.0) -> float:
        """Seconds of one op of kernel `name` (see the module docstring); `fp8`: a GEMM on FP8
        operands, against the FP8 roof (at the same efficiency), "fp4" on NVFP4 ones against
        the FP4 roof; `units` and `hbm_fraction`:
        on part of the accelerator (`shared_duration`); `draws`: random numbers drawn.
        A GEMM the stack splits (`splits`) is the sum of its parts, each with its share of N
        and of the bytes, plus the input each reads again (`GemmSplit.extra_bytes`)."""
        split = self.splits.get(name) if gemm else None
        if split is None:
            return self._one_kernel_time(name, flops, mem_bytes, gemm, backward=backward,
                                         fp8=fp8, units=units, hbm_fraction=hbm_fraction,
                                         draws=draws)
        batch, m, n, k = gemm
        total = sum(split.widths)
        seconds = 0.0
        for width in split.widths:
            share = width / total
            part = (batch, m, max(1, round(n * share)), k)
            seconds += self._one_kernel_time(
                name, flops * share,
                mem_bytes * share + split.extra_bytes(share, batch * m * k, backward), part,
                backward=backward, fp8=fp8, units=units, hbm_fraction=hbm_fraction,
                draws=draws * share)
        return seconds

    def _one_kernel_time(self, name: str, flops: float, mem_bytes: float,
                         gemm: tuple[int, ...] = (), *, backward: bool | str = False,
                         fp8: bool | str = False, units: int | None = None,
                         hbm_fraction: float = 1.0, draws: float = 0.0) -> float:
        """`kernel_time` of one kernel."""
        params, override = self.profile.compute, self.profile.kernel(name)
        acc = self.accelerator
        peak = self.peak(fp8)
        if gemm:
            batch, m, n, k = gemm
            shapes = [(batch, m, k, n), (batch, k, n, m)] if backward is True else \
                [(batch, m, k, n)] if backward == "dgrad" else \
                [(batch, k, n, m)] if backward == "wgrad" else [(batch, m, n, k)]
            efficiency = override.flops_efficiency or params.gemm_efficiency
            rounds = expert_rounds(batch, self.expert_streams if name in EXPERT_GEMMS else 0)
            compute = sum(self.gemm_time((c, *shape[1:]), efficiency, peak, units)
                          for shape in shapes for c in rounds)
            launches = len(shapes) * len(rounds)
        else:
            efficiency = override.flops_efficiency or params.gemm_efficiency
            compute = flops / (peak * efficiency)
            if units is not None:  # a streaming kernel's FLOPs spread over fewer units
                compute *= acc.compute_units / units
            launches = 1
        memory = mem_bytes / (acc.sustained_hbm_Bps * hbm_fraction *
                              (override.memory_efficiency or params.memory_efficiency))
        integer = draw_seconds(draws, acc)
        if integer:
            if units is not None:
                integer *= acc.compute_units / units
            compute = _roofline(compute, integer, params.roofline_exponent)
        both = _roofline(compute, memory, params.roofline_exponent)
        overhead = params.launch_overhead_s if override.overhead_s is None else override.overhead_s
        launches = self.launches.get((name, backward is True), launches) \
            if isinstance(backward, bool) else launches
        return both + launches * overhead

    def peak(self, fp8: bool | str = False) -> float:
        """The sustained roof of the GEMMs' precision: FP8 (at the recipe's `fp8_rate`), FP4
        (`fp8` "fp4", likewise) or bf16 (`Accelerator`)."""
        if fp8 == "fp4":
            assert self.accelerator.peak_flops_fp4 > 0, f"{self.accelerator.name} has no FP4"
            return self.accelerator.sustained_flops_fp4 * self.fp8_rate
        if fp8:
            assert self.accelerator.peak_flops_fp8 > 0, f"{self.accelerator.name} has no FP8"
            return self.accelerator.sustained_flops_fp8 * self.fp8_rate
        return self.accelerator.sustained_flops

    def gemm_time(self, shape: tuple[int, int, int, int], efficiency: float,
                  peak: float | None = None, units: int | None = None) -> float:
        """Seconds of one (batch, M, N, K) GEMM with the best tile, by tile and wave count, at
        `peak` FLOP/s (default: the bf16 sustained roof); `units`: on that many of the
        accelerator's compute units (each at its own rate)."""
        batch, m, n, k = shape
        roof = self.accelerator.sustained_flops if peak is None else peak
        per_unit = roof / self.accelerator.compute_units * efficiency
        units = self.accelerator.compute_units if units is None else units
        best = float("inf")
        for tm, tn in self.profile.compute.gemm_tiles:
            waves = ceil(batch * ceil(m / tm) * ceil(n / tn) / units)
            best = min(best, waves * 2.0 * tm * tn * k / per_unit)
        return best


def _kernel_key(op: Op) -> tuple[str, bool | str, float, float, tuple[int, ...], bool | str,
                                 float]:
    """What an op's duration depends on: its kernel (its purpose's, else its name), whether
    it is a backward (a GEMM chunk of tp_comm_overlap is one product whatever its phase), its
    FLOPs, bytes and GEMM shape, whether it runs in FP8 (True) or FP4 ("fp4"), and its random
    draws."""
    purpose = op.purpose
    kernel = purpose.kernel if isinstance(purpose, (KernelRun, GemmChunk)) else \
        op.name if purpose is None else ""
    backward: bool | str = op.phase is Phase.BWD and not isinstance(purpose, GemmChunk)
    if op.gemm and op.phase is Phase.WGRAD:
        backward = "wgrad"  # a split backward's dB alone (`traces.zero_bubble`)
    elif backward and op.gemm and op.flops < 1.5 * 2.0 * math.prod(op.gemm):
        backward = "dgrad"  # its dA alone: one product's FLOPs where a backward has two
    quantized: bool | str = "fp4" if op.dtype == "fp4" else op.dtype == "fp8"
    return (kernel, backward, op.flops, op.mem_bytes, op.gemm, quantized, op.draws)


def _roofline(compute: float, memory: float, p: float) -> float:
    """(compute^p + memory^p)^(1/p), at least the larger of the two: where the powers
    underflow to 0 or overflow (a large p), the sum is taken relative to the larger."""
    if not (compute and memory):
        return compute + memory
    top = max(compute, memory)
    try:
        both = (compute ** p + memory ** p) ** (1 / p)
    except OverflowError:
        both = math.inf
    if math.isfinite(both) and both >= 0.5 * top:
        return both
    return top * ((compute / top) ** p + (memory / top) ** p) ** (1 / p)
