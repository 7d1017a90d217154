"""The host's side of a step (`[sim] host = true`): what each op costs the CPU thread that
launches it, and where that thread waits for the GPU. The engine's cursor (`sim.engine.host`)
turns these into launch times; here are the costs and the syncs. Off by default: a step then
starts every op as soon as its dependencies end, as before.

    [sim]
    host = true                                       # model the launching thread
    cuda_graph_scope = "attn moe_router moe_preprocess"   # Megatron's --cuda-graph-scope

    hosts = host_programs(plan, settings, model, layout, compute)   # {rank: HostProgram}

Costs (public measurements; each a lower bound of what a Python training loop pays):

- LAUNCH_S per kernel the op launches (`ComputeModel.launches`: the software stack's count,
  one for a fused op, two for a GEMM's backward) and per communication call: the CPU side of
  one PyTorch op, Python, pybind, autograd, ATen dispatch and cudaLaunchKernel, "~5-25 µs of
  CPU-side work per op" (J. Lin, "From PyTorch op to kernel launch", GPU kernel serving
  lesson 18, jiahuanglin.xyz, its dispatch-chain table); the low end, 5 µs.
- SYNC_S after a device-to-host sync's GPU op ends, before the thread launches again: the
  cost of a stream synchronization, 9.6 - 3.8 = 5.8 µs per kernel in NVIDIA's measurement
  (A. Gray, "Getting Started with CUDA Graphs", NVIDIA Technical Blog, 2019: a short kernel
  launched back to back costs 3.8 µs, with cudaStreamSynchronize after each 9.6 µs).
- A CUDA graph (`cuda_graph_scope`) replaces its kernels' launches by one: each stretch of
  graphed ops in program order costs one LAUNCH_S, its ops none.
- A grouped expert GEMM (Megatron-Core's TEGroupedMLP) is one cuBLAS GEMM per local expert:
  Transformer Engine's nvte_multi_tensor_gemm takes its cuBLAS path (multi_stream_cublas_gemm,
  a loop launching `nvte_cublas_gemm_v2` once per GEMM over its compute streams) unless the
  GPU is Hopper, the GEMM BF16 and NVTE_USE_CUTLASS_GROUPED_GEMM set (off by default):
  NVIDIA/TransformerEngine transformer_engine/common/gemm/cublaslt_gemm.cu. So the op of
  `experts` GEMMs launches `experts` kernels forward and 2 x `experts` backward (dgrad and
  wgrad), as `expert_launches` counts.

Syncs: Megatron-Core's dropless alltoall dispatcher (MoEAlltoAllTokenDispatcher,
megatron/core/transformer/moe/token_dispatcher.py @0014f13) copies the token counts it needs
for the all-to-all's split sizes to the host (`cuda_dtoh_point` "before_permutation_1", after
the router's counts) and synchronizes before the EP all-to-all ("before_ep_alltoall", ep > 1,
no capacity factor), having launched the first permutation: so the host waits, before it
launches each forward (and recomputed) dispatch, for the op before the permute to end. The
backward reuses the splits (no sync). DeepEP and HybridEP without a fixed received-token
capacity likewise read the received counts on the host (`num_permuted_tokens=None`). A
step's own end-of-step syncs (grad norm's `.item()`) are where the replay starts host and GPU
together: one step from one synchronized start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sim.engine.host import HostProgram, Sync
from sim.models.compute import ComputeModel
from traces.errors import ConfigError, show
from traces.fields import Fields
from traces.kernel_names import Kernel
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Trace
from traces.purpose import ExpertAllToAll, GemmChunk, KernelRun, MoeStep

LAUNCH_S = 5e-6
"""CPU seconds per launch (module docstring)."""
SYNC_S = 5.8e-6
"""CPU seconds a device-to-host sync adds after its GPU op ends (module docstring)."""

SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess")
"""Megatron-Core's --cuda-graph-scope values parasim models (partial capture, TE's
implementation): each graphs the named part of every layer, forward and backward;
moe_preprocess (the dispatcher's count preprocessing) runs inside the router's ops here, so
it adds nothing to moe_router, and the dropless sync stays."""
ATTN = frozenset({Kernel.LN1, Kernel.QKV, Kernel.QK_NORM, Kernel.MLA_DOWN, Kernel.LATENT_NORM,
                  Kernel.Q_UP, Kernel.KV_UP, Kernel.ROPE, Kernel.FLASH_ATTN, Kernel.QK,
                  Kernel.SOFTMAX, Kernel.ATTN_DROPOUT, Kernel.AV, Kernel.PROJ, Kernel.BDA1})
MLP = frozenset({Kernel.FC1, Kernel.GELU, Kernel.SWIGLU, Kernel.FC2, Kernel.BDA2})
ROUTER = frozenset({Kernel.ROUTER, Kernel.TOPK, Kernel.AUX_LOSS})
EXPERT_GEMMS = frozenset({str(Kernel.EXPERT_FC1), str(Kernel.EXPERT_FC2)})
"""The experts' GEMMs: each op holds its experts' GEMMs (`traces.moe_steps.expert_gemms`)."""
CASTS = frozenset({Kernel.FP8_AMAX, Kernel.FP8_CAST, Kernel.FP8_CAST_GRAD})
"""Kernels of the part of the layer they follow (an FP8 cast before a GEMM)."""


def kernel_of(op: Op) -> tuple[str, bool]:
    """An op's kernel name and whether it is a backward (as the compute model keys it)."""
    purpose = op.purpose
    name = purpose.kernel if isinstance(purpose, (KernelRun, GemmChunk)) else op.name
    return str(name), op.phase is Phase.BWD and not isinstance(purpose, GemmChunk)


KEYS = ("host", "cuda_graph_scope")
"""The [sim] keys of the host model."""


@dataclass(frozen=True)
class HostSettings:
    """`[sim] host` and `cuda_graph_scope`: whether the launching thread is modelled, and
    which parts of each layer CUDA graphs hold."""

    host: bool = False
    scopes: frozenset[str] = frozenset()

    @staticmethod
    def read(sim: Fields) -> HostSettings:
        """The settings of a [sim] table (its other keys are the caller's)."""
        host = sim.boolean("host", False)
        line = sim.string("cuda_graph_scope", "")
        words = line.split()
        for word in words:
            if word not in SCOPES:
                raise ConfigError(f"sim.cuda_graph_scope: {show(word)} is not one of "
                                  f"{', '.join(SCOPES)}")
        if "moe_preprocess" in words and "moe_router" not in words:
            raise ConfigError("sim.cuda_graph_scope: \"moe_preprocess\" needs \"moe_router\" "
                              "(Megatron-Core captures the preprocess with the router)")
        if words and not host:
            raise ConfigError(f"sim.cuda_graph_scope: {show(line)} needs sim.host = true (a "
                              f"graph saves launches only where launches are modelled)")
        return HostSettings(host, frozenset(words))


def dropless_sync(model: ModelSpec, layout: Layout) -> bool:
    """Whether the dispatcher reads token counts on the host every forward MoE layer."""
    return model.experts > 0 and layout.ep > 1 and not model.capacity_factor


def host_programs(plan: Trace, settings: HostSettings, model: ModelSpec, layout: Layout,
                  compute: ComputeModel) -> dict[int, HostProgram] | None:
    """Each rank's host program: its ops' launch costs and its dispatcher syncs (None when
    `settings` leave the host out)."""
    if not settings.host:
        return None
    sync = dropless_sync(model, layout)
    return {rank: HostProgram.of(launch_costs(ops, compute, settings.scopes),
                                 dispatch_syncs(ops) if sync else ())
            for rank, ops in plan.ops.items()}


def launch_costs(ops: Sequence[Op], compute: ComputeModel | Mapping[tuple[str, bool], int],
                 scopes: frozenset[str] = frozenset()) -> list[float]:
    """Per op, the CPU seconds of its launch: LAUNCH_S per kernel or call, none inside a CUDA
    graph but one per stretch of graphed ops."""
    launches = compute.launches if isinstance(compute, ComputeModel) else compute
    graphed = _graphed(ops, scopes) if scopes else None
    costs = []
    previous = False
    for i, op in enumerate(ops):
        if graphed is not None and graphed[i]:
            costs.append(0.0 if previous else LAUNCH_S)
            previous = True
            continue
        previous = False
        if op.kind is not OpKind.COMPUTE:
            costs.append(LAUNCH_S)
            continue
        name, backward = kernel_of(op)
        count = expert_launches(op, backward) if name in EXPERT_GEMMS else \
            launches.get((name, backward), 2 if op.gemm and backward else 1)
        costs.append(count * LAUNCH_S)
    return costs


def expert_launches(op: Op, backward: bool) -> int:
    """Kernels an expert GEMM op launches (module docstring): one per expert it holds (its
    gemm's batch), forward; two per expert, backward; one per expert for a dgrad or wgrad
    chunk."""
    experts = op.gemm[0] if op.gemm else 1
    return experts * (2 if backward else 1)


def _graphed(ops: Sequence[Op], scopes: frozenset[str]) -> list[bool]:
    """Per op, whether a CUDA graph of `scopes` holds it: a compute op of a graphed part of a
    layer (an FP8 cast or the pre-MLP norm with the part around it)."""
    parts = set()
    if "attn" in scopes:
        parts.add("attn")
    if "mlp" in scopes:
        parts.add("mlp")
    if "moe_router" in scopes:
        parts.add("router")
    names = [kernel_of(op)[0] if op.kind is OpKind.COMPUTE and op.layer is not None else ""
             for op in ops]
    out = []
    part: str | None = None
    for i, name in enumerate(names):
        if name in ATTN:
            part = "attn"
        elif name in ROUTER:
            part = "router"
        elif name in MLP:
            part = "mlp"
        elif name == Kernel.LN2:  # the pre-MLP norm: with the router or the MLP beside it
            near = {names[i - 1] if i else "", names[i + 1] if i + 1 < len(names) else ""}
            part = "router" if near & ROUTER else "mlp" if near & MLP else None
        elif name not in CASTS:
            part = None
        out.append(part in parts)
    return out


def dispatch_syncs(ops: Sequence[Op]) -> list[Sync]:
    """The dropless dispatcher's syncs: before each forward (or recomputed) dispatch
    all-to-all, the host waits for the op before its permute (the router's counts)."""
    syncs = []
    last_on: dict[str, list[int]] = {}  # per stream, its last two ops
    for i, op in enumerate(ops):
        purpose = op.purpose
        if (isinstance(purpose, ExpertAllToAll) and purpose.step is MoeStep.DISPATCH
                and not purpose.grad and op.phase in (Phase.FWD, Phase.RECOMPUTE)):
            before = [j for j in last_on.get(op.stream, [])
                      if kernel_of(ops[j])[0] != Kernel.PERMUTE]
            if before:
                syncs.append(Sync(i, before[-1], SYNC_S))
        last = last_on.setdefault(op.stream, [])
        last.append(i)
        if len(last) > 2:
            del last[0]
    return syncs


__all__ = ["KEYS", "LAUNCH_S", "SCOPES", "SYNC_S", "HostSettings", "dispatch_syncs",
           "dropless_sync", "expert_launches", "host_programs", "launch_costs"]
