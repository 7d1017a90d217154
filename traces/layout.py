"""Parallel layout: the degrees and options of `[parallel]`, their rules, Megatron's rank order.

Ranks follow Megatron-LM, fastest-varying first: rank = tp + TP*(cp + CP*(dp + DP*pp)).
With 16 ranks, TP 2, PP 4, DP 2 this gives TP groups [0,1] ... [14,15], DP groups [0,2] [1,3]
[4,6] ..., and PP groups [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15].

Virtual stage k (0 <= k < PP*VP) runs on pipeline rank k % PP as its chunk k // PP and holds
the next L/(PP*VP) layers; with `pp_first_layers` / `pp_last_layers` (Megatron-Core's
--decoder-first/last-pipeline-num-layers) each chunk of the first (last) rank holds that count
/ VP and the other ranks' chunks split the rest evenly; with `account_for_embedding` /
`account_for_loss` (--account-for-embedding/loss-in-pipeline-split) the embedding and the loss
count as a layer each in an even split, so the first (last) virtual stage holds one layer fewer;
`pipeline_layout` (--pipeline-model-parallel-layout) states every stage's layers. The counts
per virtual stage are `traces.stage_split`'s, as Megatron-Core's get_num_layers_to_build and
layer offsets give them; chunks of one rank may differ and a stage may hold no layer (the
embedding or the loss only). Context parallelism: `traces.plan.context`.

The rules that tie a layout to a model are `traces.layout_rules`'. Parameter counts per rank
are the model's (`ModelSpec.params_on_stages`); which shifts of ranks map a group onto
another (folding's symmetry) is `traces.symmetry`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any

from traces.axes import Axis, along
from traces.errors import ConfigError, show
from traces.expert_grid import check_expert_grid
from traces.fields import (
    MAX_ACCELERATORS,
    check_bool,
    check_choice,
    check_int,
    is_int,
)
from traces.fsdp import GradSync, check_reshard, checked_grad_sync, default_grad_sync
from traces.model import ModelSpec
from traces.recompute import Recompute, check_options
from traces.schedule_rules import check_schedule, holders, model_copies, rank_stages, stage_rank
from traces.split_rules import check_split_keys
from traces.stage_split import Split
from traces.torch_optim import check_optimizer
from traces.units import MAX_SIZE_BYTES

MAX_VIRTUAL_STAGES = 1024  # model chunks per pipeline rank
MAX_BATCH = 2**24  # sequences in one step (GPT-3 used 1,536; 16 M is no real run)
MAX_COMPUTE_UNITS = 1024  # SMs a comm_sms may name (an H100 SXM5 has 132, a B200 148)
MAX_MICROBATCHES = 2**16  # per pipeline per step; GPT-3 on 1024 A100s ran 192


OMITTED_AT_DEFAULT = ("tp_comm_overlap", "overlap_param_gather", "pp_first_layers",
                      "pp_last_layers", "account_for_embedding", "account_for_loss",
                      "pipeline_layout", "ep", "etp", "reshard_after_forward", "grad_sync",
                      "overlap_p2p_comm", "overlap_moe_comm", "comm_sms", "recompute_modules",
                      "exp_avg_dtype", "exp_avg_sq_dtype", "fp8_activation_cache",
                      "cpu_offloading_num_layers", "fp8_param_gather", "optimizer",
                      "gradient_accumulation_fusion")
"""Options left out of `Layout.to_dict` at their default (so a layout without them reads as it
always has)."""


@dataclass(frozen=True, slots=True)
class Coords:
    """A rank's coordinate along each axis."""

    tp: int
    cp: int
    dp: int
    pp: int

    def along(self, axis: Axis) -> int:
        return along(axis, self.tp, self.cp, self.dp, self.pp)

    def moved(self, axis: Axis, value: int) -> Coords:
        """The same coordinates but `value` along `axis`."""
        c = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp, str(axis): value}
        return Coords(**c)


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB1P = "zb1p"  # zero-bubble ZB-1P (traces.zero_bubble), vp >= 1 chunks per rank
    ZBV = "zbv"  # zero-bubble ZB-V: two chunks per rank in a V (traces.zero_bubble)
    DUALPIPEV = "dualpipev"  # DualPipeV: zbv's V, overlapped pairs (traces.dualpipev_order)
    DUALPIPE = "dualpipe"  # DeepSeek's two-copy DualPipe (traces.dualpipe_order)


class CpComm(StrEnum):
    """How context-parallel attention sees the other ranks' keys and values."""

    P2P = "p2p"
    """A ring of K/V exchanges overlapped with attention (Transformer Engine's default)."""
    ALL_GATHER = "all_gather"
    """An all-gather of K/V before attention, a reduce-scatter of dK/dV after (Llama 3)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """The `[parallel]` table: degrees along each axis and how the step is scheduled."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    vp: int = 1
    """Virtual stages (model chunks) per pipeline rank; > 1 means interleaved 1F1B."""
    sp: bool = False
    """Sequence parallelism: norms and dropout split over the TP group along the sequence."""
    zero: int = 0
    """0 plain DP all-reduce, 1 sharded optimizer, 2 + gradients, 3 + parameters (FSDP)."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    micro_batch: int = 1
    global_batch: int = 1
    recompute: Recompute = Recompute.NONE
    bucket_bytes: int = 25 * 2**20
    """Gradient bucket size for DP / ZeRO-1/2 reductions (PyTorch DDP's 25 MiB)."""
    overlap_grad_reduce: bool = True
    """Reduce each gradient bucket as soon as it is full, during the last backward
    (Megatron-LM's --overlap-grad-reduce, PyTorch DDP); false: all buckets after the whole
    backward, as Megatron-LM did in 2021-2022."""
    fp32_main_grads: bool = False
    """Accumulate and reduce gradients in fp32 (Megatron-LM's
    --accumulate-allreduce-grads-in-fp32): 4-byte gradients, which the optimizer then reads."""
    cp_comm: CpComm = CpComm.P2P
    """Context parallelism's K/V exchange (Megatron-Core's --cp-comm-type p2p | all_gather)."""
    pp_first_layers: int = 0
    """Layers of the first pipeline rank (--decoder-first-pipeline-num-layers); 0: even."""
    pp_last_layers: int = 0
    """Layers of the last pipeline rank (--decoder-last-pipeline-num-layers); 0: even."""
    account_for_embedding: bool = False
    """The embedding counts as a layer in the even split (Megatron-Core's
    --account-for-embedding-in-pipeline-split): the first virtual stage holds one layer fewer."""
    account_for_loss: bool = False
    """The loss counts as a layer (--account-for-loss-in-pipeline-split): the last virtual stage
    holds one layer fewer."""
    pipeline_layout: str = ""
    """Every virtual stage's layers (--pipeline-model-parallel-layout, `traces.pipeline_layout`),
    such as "Et|(tt|)*30L"; "": none."""
    tp_comm_overlap: bool = False
    """Megatron-LM's --tp-comm-overlap: Transformer Engine's userbuffer overlap of the SP
    all-gathers and reduce-scatters of each layer's qkv, proj, fc1 and fc2 with the GEMMs that
    consume or produce them (`traces.plan.overlap`); needs sp at tp > 1; nothing at tp = 1."""
    overlap_param_gather: bool = False
    """Megatron-LM's --overlap-param-gather: ZeRO-1/2's parameter all-gathers issued per bucket
    and overlapped with the next step's forward (`traces.plan.optimizer`); nothing with ZeRO 0
    or 3 (ZeRO-3's per-unit gathers prefetch already) or dp = 1."""
    ep: int = 1
    """Expert parallelism over each stage's TP·CP·DP ranks (`traces.experts`)."""
    etp: int = 1
    """Expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size)."""
    reshard_after_forward: bool = True
    """ZeRO-3 (FSDP2's fully_shard argument): false keeps a unit's gathered parameters from
    its forward to its backward, under a pipeline across the step (`traces.fsdp`)."""
    grad_sync: GradSync | None = None
    """Gradients reduced every micro-batch or once per step (`traces.fsdp`); None (stored
    for the stated default too): the ZeRO stage's own, `sync`."""
    overlap_p2p_comm: bool = True
    """Megatron-Core's --overlap-p2p-communication (on by default, and only under the
    interleaved schedule): a pipeline send waits only for the next action of its direction
    (`traces.plan.p2p`); false: every send blocks the next action, as Megatron-LM before 2023."""
    overlap_moe_comm: bool = False
    """Megatron-Core's --overlap-moe-expert-parallel-comm (`traces.moe_overlap`)."""
    comm_sms: int = 0
    """SMs the expert all-to-all kernels hold while an overlapped pair's compute runs beside
    them (`sim.models.reserved_sms`); 0: none, but DeepSeek-V3's 20 under dualpipev with
    overlap_moe_comm (`traces.moe_overlap.comm_sms`)."""
    recompute_modules: tuple[str, ...] = ()
    """Megatron-Core's --recompute-modules under "selective" (`traces.recompute`); (): core_attn."""
    fp8_activation_cache: bool = False
    """Linear inputs kept for backward in FP8 (DeepSeek-V3 §3.3.2; `traces.recompute`)."""
    fp8_param_gather: bool = False
    """Megatron-Core's --fp8-param-gather: TE's linear weights held and gathered in FP8, no
    bf16 copy (`traces.fp8_params`)."""
    gradient_accumulation_fusion: bool = True
    """Megatron-Core's gradient_accumulation_fusion (on unless --no-gradient-accumulation-
    fusion): the weight-gradient GEMM accumulates into the main gradient itself. Off under
    Megatron-FSDP (ZeRO 3), each unit's gradients are copied into the reduce-scatter bucket
    after its backward (`traces.fsdp_kernels.copies_in`)."""
    exp_avg_dtype: str = "fp32"
    """Adam's first moment (Megatron-Core's --exp-avg-dtype): fp32, bf16, fp16 or fp8."""
    exp_avg_sq_dtype: str = "fp32"
    """Adam's second moment (Megatron-Core's --exp-avg-sq-dtype)."""
    cpu_offloading_num_layers: int = 0  # --cpu-offloading-num-layers (`traces.cpu_offload`)
    optimizer: str = "fused"
    """The optimizer step's kernels (`traces.torch_optim`): "fused", Megatron-LM's fused Adam
    over fp32 main parameters; "foreach", torch.optim's AdamW(foreach=True) over FSDP2's fp32
    shards (torchtitan's default)."""

    def __post_init__(self) -> None:
        """The rules that need neither the model nor the cluster (see `check_layout`)."""
        for axis in (Axis.TP, Axis.CP, Axis.PP, Axis.DP):
            check_int(self.degree(axis), f"parallel.{axis}", minimum=1,
                      maximum=MAX_ACCELERATORS)
        check_int(self.vp, "parallel.vp", minimum=1, maximum=MAX_VIRTUAL_STAGES)
        check_int(self.comm_sms, "parallel.comm_sms", minimum=0, maximum=MAX_COMPUTE_UNITS)
        check_int(self.micro_batch, "parallel.micro_batch", minimum=1, maximum=MAX_BATCH)
        check_int(self.global_batch, "parallel.global_batch", minimum=1, maximum=MAX_BATCH)
        for flag in ("sp", "overlap_grad_reduce", "fp32_main_grads", "tp_comm_overlap",
                     "overlap_param_gather", "overlap_p2p_comm", "overlap_moe_comm",
                     "fp8_param_gather", "gradient_accumulation_fusion"):
            check_bool(getattr(self, flag), f"parallel.{flag}")
        if self.zero not in (0, 1, 2, 3) or not is_int(self.zero):
            raise ConfigError(f"parallel.zero: {show(self.zero)} must be 0, 1, 2 or 3")
        check_reshard(self.reshard_after_forward, self.zero)
        if not self.gradient_accumulation_fusion and self.zero != 3:
            raise ConfigError("parallel.gradient_accumulation_fusion: false is modelled only "
                              "under Megatron-FSDP (zero = 3; DDP's main_grad add is not)")
        check_optimizer(self.optimizer, (self.exp_avg_dtype, self.exp_avg_sq_dtype))
        object.__setattr__(self, "grad_sync", checked_grad_sync(self.grad_sync, self.zero))
        for name, enum in (("schedule", Schedule), ("recompute", Recompute),
                           ("cp_comm", CpComm)):
            value = getattr(self, name)
            value = str(value) if isinstance(value, enum) else value
            choices = [str(e) for e in enum]
            object.__setattr__(self, name, enum(check_choice(value, f"parallel.{name}", choices)))
        if not is_int(self.bucket_bytes) or not 1 <= self.bucket_bytes <= MAX_SIZE_BYTES:
            raise ConfigError(f"parallel.bucket_bytes: {show(self.bucket_bytes)} must be from 1 "
                              f"to {MAX_SIZE_BYTES:,} bytes")
        if self.world > MAX_ACCELERATORS:
            raise ConfigError(f"parallel: tp {self.tp} x cp {self.cp} x pp {self.pp} x "
                              f"dp {self.dp} = {self.world:,} ranks, more than the "
                              f"{MAX_ACCELERATORS:,} parasim simulates")
        if self.global_batch % (self.micro_batch * self.dp):
            raise ConfigError(f"parallel.global_batch: {self.global_batch} is not divisible by "
                              f"micro_batch x dp = {self.micro_batch} x {self.dp}")
        if self.num_microbatches > MAX_MICROBATCHES:
            raise ConfigError(f"parallel.global_batch: {self.global_batch} / (micro_batch x dp "
                              f"= {self.micro_batch} x {self.dp}) = {self.num_microbatches:,} "
                              f"micro-batches per step, more than {MAX_MICROBATCHES:,}")
        if self.sp and self.tp == 1:
            raise ConfigError("parallel.sp: sequence parallelism needs tp > 1 (it splits over "
                              "the tensor-parallel group)")
        if self.tp_comm_overlap and self.tp > 1 and not self.sp:
            raise ConfigError("parallel.tp_comm_overlap: true at tp = "
                              f"{self.tp} needs sp = true (Megatron-Core overlaps the "
                              "sequence-parallel all-gathers and reduce-scatters)")
        check_options(self)
        check_schedule(self)
        check_split_keys(self.split(None))
        check_expert_grid(self)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def sync(self) -> GradSync:
        """When gradients are reduced: `grad_sync`, or the ZeRO stage's own."""
        return self.grad_sync or default_grad_sync(self.zero)

    @property
    def num_stages(self) -> int:
        """Virtual pipeline stages in all."""
        return self.pp * self.vp

    # --- ranks and groups ---------------------------------------------------------------------

    def degree(self, axis: Axis) -> int:
        """The number of ranks along `axis`."""
        return along(axis, self.tp, self.cp, self.dp, self.pp)

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def rank_of(self, c: Coords) -> int:
        """The rank at coordinates `c` (the inverse of `coords`)."""
        return self.rank(c.tp, c.cp, c.dp, c.pp)

    def coords(self, rank: int) -> Coords:
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return Coords(tp=tp, cp=cp, dp=dp, pp=pp)

    def group(self, rank: int, axis: Axis) -> tuple[int, ...]:
        """Ranks that share every coordinate of `rank` except `axis`: `rank_of` is linear in
        each coordinate, so moving `axis` from its value to i adds (i - value) x the axis's
        stride (`rank`'s formula) — `rank_of(coords(rank).moved(axis, i))` for each i, without
        making a `Coords` per member (a 64-rank DP group: ~0.7 ms that way)."""
        stride = along(axis, 1, self.tp, self.tp * self.cp, self.tp * self.cp * self.dp)
        first = rank - self.coords(rank).along(axis) * stride
        return tuple(range(first, first + self.degree(axis) * stride, stride))

    def groups(self, axis: Axis) -> list[tuple[int, ...]]:
        """All groups along `axis`, ordered by their first rank."""
        seen = {self.group(r, axis) for r in range(self.world)}
        return sorted(seen)

    @property
    def data_degree(self) -> int:
        """Ranks that hold the same parameters: DP x CP (Megatron-Core reduces gradients and
        shards the distributed optimizer over its data-parallel-with-context-parallel group),
        times DualPipe's two copies (`traces.schedule_rules.holders`)."""
        return self.dp * self.cp * model_copies(self.schedule)

    def data_group(self, rank: int) -> tuple[int, ...]:
        """The DP x CP group of `rank` (its DP group when cp = 1; under dualpipe, of both
        ranks of its pair: `holders`), in rank order."""
        c = self.coords(rank)
        pair = holders(self.schedule, self.pp, c.pp)
        if self.cp == 1 and len(pair) == 1:
            return self.group(rank, Axis.DP)
        return tuple(sorted(self.rank(tp=c.tp, cp=k, dp=d, pp=p) for p in pair
                            for d in range(self.dp) for k in range(self.cp)))

    def embedding_group(self, rank: int) -> tuple[int, ...]:
        """First and last pipeline rank holding the (tied) word embeddings."""
        c = self.coords(rank)
        return (self.rank_of(c.moved(Axis.PP, 0)), self.rank_of(c.moved(Axis.PP, self.pp - 1)))

    @property
    def uneven(self) -> bool:
        return bool(self.pp_first_layers or self.pp_last_layers)

    @property
    def custom_split(self) -> bool:
        """Layers are not split evenly by count: uneven ends, an accounted embedding or loss,
        or a stated layout."""
        return self.uneven or self.account_for_embedding or self.account_for_loss or \
            bool(self.pipeline_layout)

    def split(self, model: ModelSpec | None) -> Split:
        """The keys that place layers on stages, with `model`'s layer count (0 without)."""
        return Split(0 if model is None else model.layers, self.pp, self.vp,
                     self.pp_first_layers, self.pp_last_layers, self.account_for_embedding,
                     self.account_for_loss, self.pipeline_layout,
                     0 if model is None else model.mtp_layers)

    def stage_layers(self, model: ModelSpec) -> tuple[int, ...]:
        """Transformer layers of each virtual stage, in stage order (`traces.stage_split`)."""
        return self.split(model).counts()

    def layers_per_chunk(self, model: ModelSpec, pp_rank: int) -> int:
        """Layers of each model chunk of pipeline rank `pp_rank`, where its chunks are equal
        (ValueError where they are not: see `layers_of_stage`)."""
        sizes = {len(self.layers_of_stage(model, s)) for s in self.stages_of_rank(pp_rank)}
        if len(sizes) != 1:
            raise ValueError(f"pipeline rank {pp_rank}'s chunks differ: {sorted(sizes)}")
        return sizes.pop()

    def layers_of_stage(self, model: ModelSpec, stage: int) -> range:
        """The layers of virtual stage `stage` (module docstring): stages in order hold
        consecutive runs."""
        starts = self.split(model).starts()
        return range(starts[stage], starts[stage + 1])

    def layers_of_rank(self, model: ModelSpec, pp_rank: int) -> int:
        """How many layers pipeline rank `pp_rank` holds over all its chunks."""
        counts = self.stage_layers(model)
        return sum(counts[s] for s in self.stages_of_rank(pp_rank))

    def stages_of_rank(self, pp_rank: int) -> list[int]:
        """Virtual stages run by pipeline rank `pp_rank`, chunk by chunk (zbv: in a V)."""
        return rank_stages(str(self.schedule), self.pp, self.vp, pp_rank)

    def stage_rank(self, stage: int) -> int:
        """The pipeline rank that runs virtual stage `stage`."""
        return stage_rank(str(self.schedule), self.pp, stage)

    # --- folding: one rank per (cp, pp) coordinate stands for its TP peers and DP replicas ---

    def representatives(self) -> list[int]:
        """One rank per (cp, pp) coordinate: the one with tp = dp = 0."""
        return sorted(self.rank(cp=cp, pp=pp) for cp in range(self.cp) for pp in range(self.pp))

    def representative(self, rank: int) -> int:
        c = self.coords(rank)
        return self.rank(cp=c.cp, pp=c.pp)

    def axes(self) -> str:
        """The parallel degrees in the seeds' order, for people: 'TP 4 · CP 2 (p2p) · PP 4 ·
        DP 2 · VP 5' (CP, VP, EP and ETP only where they are above 1)."""
        cp = f" · CP {self.cp} ({self.cp_comm})" if self.cp > 1 else ""
        text = f"TP {self.tp}{cp} · PP {self.pp} · DP {self.dp}"
        text += f" · VP {self.vp}" if self.vp > 1 else ""
        if self.ep > 1 or self.etp > 1:
            text += f" · EP {self.ep}" + (f" · ETP {self.etp}" if self.etp > 1 else "")
        return text

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values; cp_comm only with cp > 1, the options of
        OMITTED_AT_DEFAULT only where they are not at their default."""
        out = asdict(self)
        out["schedule"], out["recompute"] = str(self.schedule), str(self.recompute)
        out["cp_comm"] = str(self.cp_comm)
        if self.cp == 1:
            del out["cp_comm"]
        for f in fields(self):  # files and --json from before an option stay the same
            if f.name in OMITTED_AT_DEFAULT and getattr(self, f.name) == f.default:
                del out[f.name]
        if self.grad_sync is not None:
            out["grad_sync"] = str(self.grad_sync)
        return out
