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
- FP8 experts quantize each expert's input (forward) and output gradient (backward) on
  their own (`traces.moe`'s expert_cast and expert_cast_grad ops): GroupedLinear's
  `tex.split_quantize` ends in `multi_tensor_quantize_impl`, whose one fused kernel
  (nvte_multi_cast_transpose) serves only delayed scaling's Float8Quantizers; every other
  recipe takes its "Quantize kernels individually" loop, one quantize per expert
  (NVIDIA/TransformerEngine transformer_engine/pytorch/csrc/extensions/cast.cpp,
  multi_tensor_quantize_impl). Current scaling's quantize is its amax pass and its cast
  (`traces.fp8_recipes`, "tensorwise"): 2 kernels per local expert; MXFP8 and blockwise 1;
  delayed scaling 1 for all the experts together; SequentialMLP's experts each quantize in
  their own Linear (`expert_cast_launches`).
- Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP, `moe_grouped_gemm`) does
  host work around its kernels that launches none, per local expert (`GroupedHost`;
  NVIDIA/TransformerEngine transformer_engine/pytorch/module/grouped_linear.py @0069563,
  `_GroupedLinear.forward` / `.backward`):
  forward, `torch.split` of the input into one view per expert and the output's `torch.empty`;
  backward, the same split of the output gradient, the dgrad output's `torch.empty`, one
  `torch.empty` per expert for the weight gradient Megatron's DDP hands back
  (`handle_custom_ddp_from_mcore`: with gradient-accumulation fusion and Megatron-Core's
  `grad_added_to_main_grad`), and the autograd engine's node of the Function; FP8, the
  quantize call's two `torch.empty` per expert (TE issue #1499, maintainer's answer,
  2025-02-24: "torch.split() ... and torch.empty() (2x num_gemms calls)" are GroupedLinear's
  CPU overheads). Their costs: an ATen op called from C++ (a split's view, the quantize's
  allocations) ATEN_OP_S, one called from Python PY_OP_S (pytorch/pytorch issue #41383,
  N. Gimelshein: a no-grad `x*x` "is approx 2 us. Approx half of it is python parsing overhead
  (same operation called using c++ API would take about a microsecond)"); the engine's own
  CPU per backward node AUTOGRAD_NODE_S (huggingface/blog issue #1649, a PyTorch profiler
  table of a training step: `autograd::engine::evaluate_function: ViewBackward0` 13.902 us a
  call against its node `ViewBackward0`'s 6.352 us, so 7.55 us of engine per node). A
  GroupedLinear's per-call costs are spread over its ops in proportion to their experts (an
  op per distinct token count under skewed routing), so a call pays them once.
- The host CPU: LAUNCH_S and SYNC_S are x86 figures (the blog's dispatch chain; Gray's
  measurement). A Grace CPU (GH200, GB200, GB300) runs the same PyTorch op's CPU side slower:
  a torch.nn.Linear forward (BF16, hidden 2048, 8192 tokens) costs 37.08 us of CPU on GB200,
  33.17 us on GH200, 13.48 us on a DGX H100's Xeon Platinum 8480C (NVIDIA/TransformerEngine
  issue #2053, "High CPU overhead on Grace systems", 2025-08-11, its benchmark table). Each
  host cost on a Grace part is scaled by its ratio to the DGX's: 37.08 / 13.48 on GB200 and on
  GB300 (the same Grace CPU, no measurement of its own), 33.17 / 13.48 on GH200
  (`host_cpu_factor`).

Syncs: Megatron-Core's dropless alltoall dispatcher (MoEAlltoAllTokenDispatcher,
megatron/core/transformer/moe/token_dispatcher.py @0014f13) copies the token counts it needs
for the all-to-all's split sizes to the host (`cuda_dtoh_point` "before_permutation_1", after
the router's counts) and synchronizes before the EP all-to-all ("before_ep_alltoall", ep > 1,
no capacity factor), having launched the first permutation: so the host waits, before it
launches each forward (and recomputed) dispatch, for the op before the permute to end. The
backward reuses the splits (no sync). DeepEP and HybridEP without a fixed received-token
capacity likewise read the received counts on the host (`num_permuted_tokens=None`); HybridEP
right after gathering the routing map and preprocessing it (its `.cpu()` of the count precedes
the dispatch kernels, deepseek-ai/DeepEP deep_ep/hybrid_ep_buffer.py @017a520,
dispatch_with_permute), so there the host waits for the plan's `RoutingMapGather` before
launching the op after it. With a
capacity factor and no padding (parasim's `capacity_factor`: tokens dropped, none padded) the
alltoall dispatcher syncs earlier, at "before_permutation_1": "Token drop but no pad. A
synchronization is needed before the first permutation to get the `num_out_tokens` CPU
value" (MoEAlltoAllTokenDispatcher.preprocess, the `moe_expert_capacity_factor is not None`
branch, whatever ep; NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py),
so the host waits, before it launches each forward (and recomputed) permute, for the op
before it (`capacity_syncs`). A
step's own end-of-step syncs (grad norm's `.item()`) are where the replay starts host and GPU
together: one step from one synchronized start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sim.engine.host import HostProgram, Sync
from sim.models.compute import ComputeModel
from sim.models.host_link import cluster_host_Bps
from sim.profile import Profile
from topology.cluster import Cluster
from traces.errors import ConfigError, show
from traces.fields import Fields
from traces.fp8 import recipe as fp8_recipe
from traces.kernel_names import Kernel
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import gemm_streams, te_grouped_mlp
from traces.ops import Op, OpKind, Phase, Trace
from traces.purpose import ExpertAllToAll, GemmChunk, KernelRun, MoeStep, RoutingMapGather
from traces.stack import launch_counts

LAUNCH_S = 5e-6
"""CPU seconds per launch (module docstring)."""
SYNC_S = 5.8e-6
"""CPU seconds a device-to-host sync adds after its GPU op ends (module docstring)."""
X86_LINEAR_CPU_S = 13.48e-6
"""CPU seconds of one torch.nn.Linear forward on a DGX H100's Xeon Platinum 8480C
(TransformerEngine issue #2053's table; module docstring)."""
ATEN_OP_S = 1e-6
"""CPU seconds of an ATen op called from C++, no kernel (module docstring: issue #41383)."""
PY_OP_S = 2e-6
"""CPU seconds of a PyTorch op called from Python, no kernel (module docstring: #41383)."""
AUTOGRAD_NODE_S = 13.902e-6 - 6.352e-6
"""The autograd engine's CPU seconds per backward node, the node's own work apart (module
docstring: huggingface/blog issue #1649's profile, evaluate_function less ViewBackward0)."""
GRACE_LINEAR_CPU_S = {"GB200": 37.08e-6, "GB300": 37.08e-6, "GH200": 33.17e-6}
"""The same on Grace parts (issue #2053's GB200 and GH200 rows; GB300's Grace as GB200's)."""

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
EXPERT_CASTS = frozenset({str(Kernel.EXPERT_CAST), str(Kernel.EXPERT_CAST_GRAD)})
"""The experts' FP8 quantization: `expert_cast_launches` kernels each."""
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


@dataclass(frozen=True)
class GroupedHost:
    """Transformer Engine GroupedLinear's host work that launches no kernel, per call of
    `experts` local experts (module docstring); `quantized`: the call quantizes its input
    and output gradient (FP8 experts' cast ops)."""

    experts: int
    quantized: bool

    @staticmethod
    def of(model: ModelSpec, layout: Layout) -> GroupedHost | None:
        """The rank's GroupedLinear calls; None without TEGroupedMLP's grouped experts
        (`traces.moe_spec.te_grouped_mlp`: not on torch's stacks, torch._grouped_mm)."""
        if not te_grouped_mlp(model):
            return None
        return GroupedHost(model.experts // layout.ep, model.fp8)

    @property
    def forward_s(self) -> float:
        """A forward call: the input's split (a view per expert), the output's empty."""
        return self.experts * ATEN_OP_S + PY_OP_S

    @property
    def backward_s(self) -> float:
        """A backward call: the gradient's split, the dgrad output's empty, a weight-gradient
        empty per expert for Megatron's DDP, the autograd node."""
        return self.experts * (ATEN_OP_S + PY_OP_S) + PY_OP_S + AUTOGRAD_NODE_S

    @property
    def quantize_s(self) -> float:
        """A split_quantize call: two allocations per expert (TE issue #1499); none
        unquantized."""
        return 2 * self.experts * ATEN_OP_S if self.quantized else 0.0

    def op_s(self, op: Op) -> float:
        """The host seconds of this work plan op `op` carries: an expert GEMM op its share
        of its call's (its experts over the call's), an expert cast op its call's quantize;
        else none."""
        if isinstance(op.purpose, GemmChunk) or op.kind is not OpKind.COMPUTE:
            return 0.0
        name, backward = kernel_of(op)
        if name in EXPERT_CASTS:
            return self.quantize_s
        if name not in EXPERT_GEMMS:
            return 0.0
        share = (op.gemm[0] if op.gemm else 1) / self.experts
        return share * (self.backward_s if backward else self.forward_s)


def dropless_sync(model: ModelSpec, layout: Layout) -> bool:
    """Whether the dispatcher reads token counts on the host every forward MoE layer."""
    return model.experts > 0 and layout.ep > 1 and not model.capacity_factor


def capacity_sync(model: ModelSpec) -> bool:
    """Whether the alltoall dispatcher reads `num_out_tokens` on the host before every forward
    permute: a capacity factor without padding (module docstring), NCCL's all-to-all."""
    return model.experts > 0 and model.capacity_factor > 0 and model.dispatch == "nccl"


def host_programs(plan: Trace, settings: HostSettings, model: ModelSpec, layout: Layout,
                  compute: ComputeModel) -> dict[int, HostProgram] | None:
    """Each rank's host program: its ops' launch costs and its dispatcher syncs (None when
    `settings` leave the host out)."""
    if not settings.host:
        return None
    factor = host_cpu_factor(compute.accelerator.name)
    casts = expert_cast_launches(model, layout)
    grouped = GroupedHost.of(model, layout)
    return {rank: HostProgram.of(launch_costs(ops, compute, settings.scopes, casts, factor,
                                              grouped),
                                 dispatcher_syncs(ops, model, layout, SYNC_S * factor))
            for rank, ops in plan.ops.items()}


def dispatcher_syncs(ops: Sequence[Op], model: ModelSpec, layout: Layout,
                     seconds: float) -> list[Sync]:
    """The dispatcher's syncs on a rank's ops: the dropless ones (`dispatch_syncs`), the
    capacity factor's (`capacity_syncs`), or none."""
    if dropless_sync(model, layout):
        return dispatch_syncs(ops, seconds)
    if capacity_sync(model):
        return capacity_syncs(ops, seconds)
    return []


def capacity_syncs(ops: Sequence[Op], seconds: float = SYNC_S) -> list[Sync]:
    """A capacity factor's syncs ("before_permutation_1"): before each forward (or
    recomputed) permute the host waits for the op before it on its stream, and `seconds`
    more."""
    syncs = []
    last_on: dict[str, int] = {}
    for i, op in enumerate(ops):
        if (kernel_of(op)[0] == Kernel.PERMUTE and op.phase in (Phase.FWD, Phase.RECOMPUTE)
                and op.stream in last_on):
            syncs.append(Sync(i, last_on[op.stream], seconds))
        last_on[op.stream] = i
    return syncs


def host_cpu_factor(accelerator: str) -> float:
    """How much slower than the x86 DGX host the accelerator's host CPU runs a PyTorch op's CPU
    side (module docstring): 1 but on Grace parts."""
    for prefix, seconds in GRACE_LINEAR_CPU_S.items():
        if accelerator.upper().startswith(prefix):
            return seconds / X86_LINEAR_CPU_S
    return 1.0


def expert_cast_launches(model: ModelSpec, layout: Layout) -> int:
    """Kernels one expert cast op launches (module docstring): per local expert, the recipe's
    quantize (2 with current scaling's amax pass, 3 with NVFP4's Hadamard cast, else 1:
    `Fp8Recipe.cast_kernels`); delayed scaling's grouped experts
    1 in all; 0 without FP8 experts."""
    if not (model.fp8 and model.experts):
        return 0
    rec = fp8_recipe(model)
    if rec.name == "delayed" and model.moe_grouped_gemm:
        return 1
    return model.experts // layout.ep * rec.cast_kernels


def device_cast_launches(model: ModelSpec, layout: Layout) -> int:
    """Quantize kernels an expert cast op runs on the device one after another: its
    `expert_cast_launches` under Transformer Engine's GroupedLinear
    (`traces.moe_spec.gemm_streams` > 0: split_quantize's loop), else 0 (one launch, as any
    op)."""
    return expert_cast_launches(model, layout) if gemm_streams(model) else 0


def device_launches(model: ModelSpec, layout: Layout) -> dict[tuple[str, bool], int] | None:
    """Kernels per (kernel, backward) on the device where the stack states them
    (`traces.stack.launch_counts`), and under Transformer Engine's GroupedLinear
    (`traces.moe_spec.gemm_streams` > 0) an expert cast op's `expert_cast_launches`:
    split_quantize's loop launches its quantize kernels one after another on the GPU as on the
    host (module docstring), each paying the compute model's launch overhead. None where nothing is
    stated (each op its own one launch)."""
    counts = dict(launch_counts(model) or {})
    casts = device_cast_launches(model, layout)
    if casts > 1:
        counts[str(Kernel.EXPERT_CAST), False] = casts
        counts[str(Kernel.EXPERT_CAST_GRAD), True] = casts
    return counts or None


def plan_compute(cluster: Cluster, profile: Profile, model: ModelSpec | None,
                 layout: Layout | None) -> ComputeModel:
    """The compute model `simulate` times a plan of `model` on `layout` by, on `cluster`:
    the model's FP8 rate, expert GEMM streams and split GEMMs (`ComputeModel.of_model`), its
    kernels' device launches (`device_launches`: the stack's, and TE's per-expert quantize
    kernels of an FP8 expert cast op) and the host link offload copies cross
    (`cluster_host_Bps`). One place, so every interpreter of a plan costs its kernels alike:
    `simulate`, a replay of its trace (`sim.measured`), whatif's replay and kernel book. A
    header without a layout: the stack's launches alone; without a model (a profiler's
    trace): none of the model's parameters."""
    if model is None:
        launches = None
    elif layout is None:
        launches = launch_counts(model)
    else:
        launches = device_launches(model, layout)
    return ComputeModel.of_model(cluster.accelerator, profile, model, launches,
                                 cluster_host_Bps(cluster))


def launch_costs(ops: Sequence[Op], compute: ComputeModel | Mapping[tuple[str, bool], int],
                 scopes: frozenset[str] = frozenset(), casts: int = 1,
                 factor: float = 1.0, grouped: GroupedHost | None = None) -> list[float]:
    """Per op, the CPU seconds of its launch: LAUNCH_S per kernel or call, none inside a CUDA
    graph but one per stretch of graphed ops; `casts`: the kernels of an expert cast op
    (`expert_cast_launches`); `factor`: the host CPU's (`host_cpu_factor`); `grouped`: TE
    GroupedLinear's host work besides its launches (`GroupedHost`), none if None."""
    launches = compute.launches if isinstance(compute, ComputeModel) else compute
    graphed = _graphed(ops, scopes) if scopes else None
    launch = LAUNCH_S * factor
    costs = []
    previous = False
    for i, op in enumerate(ops):
        if graphed is not None and graphed[i]:
            costs.append(0.0 if previous else launch)
            previous = True
            continue
        previous = False
        if op.kind is not OpKind.COMPUTE:
            costs.append(launch)
            continue
        extra = grouped.op_s(op) * factor if grouped is not None else 0.0
        costs.append(_kernels(op, launches, casts) * launch + extra)
    return costs


def _kernels(op: Op, launches: Mapping[tuple[str, bool], int], casts: int) -> int:
    """Kernels compute op `op` launches: its experts' GEMMs one each, an expert cast
    `casts`, any other its stack's count (else one, two for a GEMM's backward)."""
    name, backward = kernel_of(op)
    if name in EXPERT_GEMMS:
        return expert_launches(op, backward)
    if name in EXPERT_CASTS:
        return casts
    return launches.get((name, backward), 2 if op.gemm and backward else 1)


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


def dispatch_syncs(ops: Sequence[Op], seconds: float = SYNC_S) -> list[Sync]:
    """The dropless dispatcher's syncs: before each forward (or recomputed) dispatch
    all-to-all, the host waits for the op before its permute (the router's counts), and
    `seconds` more."""
    syncs = []
    last_on: dict[str, list[int]] = {}  # per stream, its last two ops
    for i, op in enumerate(ops):
        purpose = op.purpose
        if (isinstance(purpose, ExpertAllToAll) and purpose.step is MoeStep.DISPATCH
                and not purpose.grad and op.phase in (Phase.FWD, Phase.RECOMPUTE)):
            before = [j for j in last_on.get(op.stream, [])
                      if kernel_of(ops[j])[0] != Kernel.PERMUTE]
            if before:
                target = before[-1]
                # HybridEP reads the count right after its routing-map gather, before any of
                # dispatch_with_permute's kernels: the host waits before the next op
                gather = isinstance(ops[target].purpose, RoutingMapGather)
                syncs.append(Sync(target + 1 if gather else i, target, seconds))
        last = last_on.setdefault(op.stream, [])
        last.append(i)
        if len(last) > 2:
            del last[0]
    return syncs


__all__ = ["ATEN_OP_S", "AUTOGRAD_NODE_S", "GRACE_LINEAR_CPU_S", "KEYS", "LAUNCH_S", "PY_OP_S",
           "SCOPES", "SYNC_S", "X86_LINEAR_CPU_S", "GroupedHost", "HostSettings",
           "capacity_sync", "capacity_syncs", "device_launches", "dispatch_syncs",
           "dispatcher_syncs", "dropless_sync", "expert_cast_launches",
           "expert_launches", "host_cpu_factor", "host_programs", "launch_costs"]
