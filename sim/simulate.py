"""`parasim simulate`: build the plan of an experiment, replay it, summarize, format.

    from sim.config import load_experiment, example_path
    from sim.simulate import predict
    summary, times = predict(load_experiment(example_path()))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, replace
from itertools import groupby
from typing import Any

from sim.config import Experiment
from sim.engine.cp_symmetry import cp_fold_step
from sim.engine.mirror_fold import half, mirror_fold, unfold
from sim.engine.position import network_positions
from sim.engine.replay import Progress, StepTimes, replay
from sim.metrics import StepSummary, summarize
from sim.models.host import host_programs, plan_compute
from sim.models.memory import memory_by_pp_rank
from sim.models.reserved_sms import reserved_sms, spared
from sim.models.sharing import interference_for
from sim.models.variability import expected_speeds
from traces.cp_fold import cp_partition, cp_shift_closed
from traces.identity import Partition, partition_for
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.moe_overlap import comm_sms
from traces.ops import Trace
from traces.pipeline import layout_schedule
from traces.plan import build

GiB = 2**30


def predict(exp: Experiment, *, fold: bool = True, progress: Progress | None = None,
            speeds: Mapping[int, float] | None = None,
            plan_progress: Progress | None = None) -> tuple[StepSummary, StepTimes]:
    """Simulate one step of `exp`; with `fold`, one rank per pipeline stage stands for all.
    The cluster's variability (`[cluster] jitter`, `slow_nodes`) stretches each rank's kernels
    by the expected slowest-member factor (`sim.models.variability`); `speeds` (one seeded
    draw per rank, a Monte-Carlo sample) replaces it; folded, the ranks then fold by identity
    (`traces.identity`): one rank per class of equal speed, equal expert loads (skewed routing),
    equal network position (`sim.engine.position`) and equal peers, so a named slow node or a
    busier EP rank folds apart from the rest and the run equals the unfolded one. When kernels
    are stretched, the ideal step is simulated too and the summary's `variability_s` is the
    difference."""
    fold = fold and fold_sound(exp)
    # Folded by identity when something sets ranks apart (speeds, skewed experts' loads, an
    # expert grid the shifts do not map onto itself, where a rank sits on an unevenly cut fat
    # tree); else the uniform fold, one per (cp, pp).
    positions = network_positions(exp.cluster, exp.layout) if fold else None
    classes = partition_for(exp.model, exp.layout, speeds, positions) if fold else None
    if classes is not None and classes.uniform:
        classes = over_cp(exp)
    ranks = (classes.representatives() if classes else exp.layout.representatives()) \
        if fold else None
    schedule = layout_schedule(exp.layout)  # once: the plan and the memory model run it
    built = build(exp.model, exp.layout, ranks=ranks, schedule=schedule,
                  classes=classes is not None, progress=plan_progress)
    # the classes go in the header: a replay of the trace adds the copies this run adds
    plan = Trace(built.ops, replace(built.meta, experiment=exp.name, cluster_name=exp.cluster.name,
                                    cluster_spec=exp.cluster.table, network=str(exp.network),
                                    fold_classes=classes.classes() if classes else None))
    if speeds is None and not exp.cluster.variability.ideal:
        speeds = expected_speeds(exp.cluster.variability, exp.layout, plan.ranks,
                                 exp.cluster.devices_per_server)
    compute = plan_compute(exp.cluster, exp.profile, exp.model, exp.layout)
    durations = reserved_sms(plan, compute, comm_sms(exp.layout, exp.model.dispatch))
    interference = spared(interference_for(exp.cluster, exp.profile, compute), durations)
    hosts = host_programs(plan, exp.host, exp.model, exp.layout, compute)

    # DualPipe's mirror pairs fold too where nothing else sets ranks apart
    # (sim.engine.mirror_fold)
    mirror = mirror_fold(exp.model, exp.layout, exp.cluster, classes) \
        if fold and speeds is None and positions is None else None

    def run(stretch: Mapping[int, float] | None, bar: Progress | None) -> StepTimes:
        if mirror is not None:
            return unfold(replay(half(plan, mirror), exp.cluster, durations,
                                 interference=interference, network=exp.network,
                                 algo=exp.algo, progress=bar, fold=mirror, hosts=hosts),
                          plan, classes)
        return replay(plan, exp.cluster, durations, interference=interference,
                      network=exp.network, algo=exp.algo, progress=bar, speeds=stretch,
                      fold=classes, hosts=hosts)

    times = run(speeds, progress)
    memory = memory_by_pp_rank(exp.model, exp.layout, schedule,
                               exp.cluster.devices_per_server,
                               exp.cluster.accelerator.fp8_block_scaling)
    sizes = classes.class_sizes() if classes else None
    summary = summarize(exp.model, exp.layout, exp.cluster, times, memory, sizes)
    if speeds is not None and any(s != 1.0 for s in speeds.values()):
        ideal = summarize(exp.model, exp.layout, exp.cluster, run(None, None), memory, sizes)
        summary = replace(summary, variability_s=summary.step_time_s - ideal.step_time_s,
                          variability_compute_s=summary.compute_s - ideal.compute_s)
    return summary, times


def fold_sound(exp: Experiment) -> bool:
    """Whether folding may stand for `exp`: not where TP groups cross nodes (the layout's
    warning says so), which no shift of the fold maps onto itself; such a step is simulated
    with every rank."""
    return exp.cluster.devices_per_server % exp.layout.tp == 0


def over_cp(exp: Experiment) -> Partition | None:
    """The fold over CP (`traces.cp_fold`) where the cluster is alike under a cp shift and
    the expert grid too; None: the uniform fold, one rank per (cp, pp)."""
    step = cp_fold_step(exp.cluster, exp.layout)
    if not step or (exp.model.experts > 0 and not cp_shift_closed(exp.layout, step)):
        return None
    return cp_partition(exp.layout, step)


def summary_json(exp: Experiment, s: StepSummary) -> dict[str, Any]:
    """The `--json` object: the headline figures first, then the detail."""
    return {
        "experiment": exp.name,
        "cluster": exp.cluster.name,
        "world": exp.layout.world,
        "layout": exp.layout.to_dict(),
        "attention": str(exp.model.attention),
        "network": str(exp.network),
        "step_time_s": s.step_time_s,
        "tokens_per_s": s.tokens_per_s,
        "model_tflops_per_gpu": s.model_tflops_per_gpu,
        "hardware_tflops_per_gpu": s.hardware_tflops_per_gpu,
        "mfu": s.mfu,
        "bubble_fraction": s.bubble_fraction,
        "exposed_comm_s": s.exposed_comm_s,
        "compute_s": s.compute_s,
        "peak_memory_bytes": s.peak_memory_bytes,
        "memory_capacity_bytes": s.memory_capacity_bytes,
        "fits": s.fits,
        "memory_by_pp_rank": [{"pp_rank": i, **asdict(m), "total_bytes": m.total_bytes}
                            for i, m in enumerate(s.memory_by_pp_rank)],
        "ranks": [asdict(r) for r in s.ranks],
        "algorithms": s.algorithms,
        **({} if exp.cluster.variability.ideal else variability_json(exp, s)),
    }


def variability_json(exp: Experiment, s: StepSummary) -> dict[str, Any]:
    """The variability's part of the step (only when the cluster has some)."""
    v = exp.cluster.variability
    return {"variability": {"jitter": v.jitter, "slow_nodes": v.slow_nodes,
                            "slow_factor": v.slow_factor, "step_s": s.variability_s,
                            "fraction_of_step": s.variability_s / s.step_time_s,
                            "compute_s": s.variability_compute_s}}


def headline(s: StepSummary) -> list[tuple[str, str]]:
    """The figures a user looks at first, as (label, value) rows: the text summary and the
    report's header both show these."""
    verdict = "fits" if s.fits else "DOES NOT FIT"
    varied = [("variability", f"{s.variability_s:.4g} s  ({s.variability_s / s.step_time_s:.1%}"
                              " of the step: waiting for the slowest ranks)")] \
        if s.variability_s else []
    return [
        ("step time", f"{s.step_time_s:.4g} s"),
        ("throughput", f"{s.tokens_per_s:,.0f} tokens/s"),
        (f"model {rate_unit(s.model_tflops_per_gpu)}/GPU",
         f"{rate_value(s.model_tflops_per_gpu)}  (MFU {s.mfu:.1%})"),
        (f"hardware {rate_unit(s.hardware_tflops_per_gpu)}",
         f"{rate_value(s.hardware_tflops_per_gpu)}  (recomputation included)"),
        ("compute", f"{s.compute_s:.4g} s per GPU"),
        ("exposed comm", f"{s.exposed_comm_s:.4g} s per GPU"),
        ("bubble", f"{s.bubble_fraction:.1%} of the step"),
        *varied,
        ("peak memory", f"{size_text(s.peak_memory_bytes)} of "
                        f"{size_text(s.memory_capacity_bytes)}: {verdict}"),
    ]


_DISPATCH_LABEL = {"deepep": ", DeepEP", "hybridep": ", HybridEP"}
"""How the model line names a dispatch other than NCCL's all-to-all."""

RATE_UNITS = ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"), (0.0, "MFLOP/s"))
"""TFLOP/s thresholds of each unit: the largest that shows the rate as 1 or more."""


def rate_unit(tflops: float) -> str:
    """The unit a rate of `tflops` TFLOP/s is shown in: TFLOP/s from 1 up (the GPU
    clusters' figures read as always), GFLOP/s or MFLOP/s below (a CPU run's 0.0 said
    nothing)."""
    return next(unit for floor, unit in RATE_UNITS if tflops >= floor)


def rate_value(tflops: float) -> str:
    """`tflops` in `rate_unit(tflops)`, one decimal: 124.4, 35.2 (GFLOP/s)."""
    scale = {"TFLOP/s": 1.0, "GFLOP/s": 1e3, "MFLOP/s": 1e6}[rate_unit(tflops)]
    return f"{tflops * scale:.1f}"


def size_text(nbytes: float) -> str:
    """A memory size in GiB from 1 GiB up (as always), else MiB, else KiB: '26.8 GiB',
    '12.3 MiB'."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"


def fleet_lines(exp: Experiment) -> list[str]:
    """The cluster's departures from the ideal, when it has any: variability and routing."""
    v = exp.cluster.variability
    routing = getattr(getattr(exp.cluster.fabric, "spec", None), "routing", None)
    parts = [] if v.ideal else [f"jitter {v.jitter:g}, slow nodes {v.slow_nodes:g} "
                                f"x{v.slow_factor:g}"]
    if routing is not None and routing != "dmodk":
        parts.append(f"routing {routing}")
    return [f"  {'fleet':<20}{', '.join(parts)}"] if parts else []


def _stage_layers(exp: Experiment) -> str:
    """'7 · 8 x 14 · 7 per pipeline rank' (first, middle, last), with VP chunks noted."""
    L, model = exp.layout, exp.model
    counts = [L.layers_of_rank(model, r) for r in range(L.pp)]
    middle = counts[1:-1]
    parts = [str(counts[0]), *([f"{middle[0]} x {len(middle)}"] if middle else []),
             str(counts[-1])]
    if len(set(middle)) > 1:  # a pipeline_layout: runs of equal ranks
        runs = [(n, len(list(run))) for n, run in groupby(counts)]
        parts = [f"{n} x {k}" if k > 1 else str(n) for n, k in runs]
    chunks = f", {L.vp} chunks each" if L.vp > 1 else ""
    if L.uneven:
        keys = f"pp_first_layers {L.pp_first_layers}, pp_last_layers {L.pp_last_layers}"
    elif L.pipeline_layout:
        keys = f"pipeline_layout {L.pipeline_layout!r}"
    else:
        keys = ", ".join(name for name in ("account_for_embedding", "account_for_loss")
                         if getattr(L, name))
    if L.vp > 1 and len({len(L.layers_of_stage(model, k)) for k in L.stages_of_rank(0)}) > 1:
        firsts = " · ".join(str(len(L.layers_of_stage(model, k))) for k in L.stages_of_rank(0))
        chunks += f"; rank 0's chunks {firsts}"
    return f"{' · '.join(parts)} per pipeline rank ({keys}{chunks})"


def _overlaps(layout: Layout) -> list[str]:
    """The overlaps line, where Megatron-Core's overlaps beyond the gradient buckets' are on."""
    names = [name for name, on in (
        ("TP communication beside the GEMMs (--tp-comm-overlap)",
         layout.tp_comm_overlap and layout.sp),
        ("parameter gathers beside the forward (--overlap-param-gather)",
         layout.overlap_param_gather and layout.zero in (1, 2)
         and layout.data_degree > 1)) if on]
    return [f"  overlaps            {'; '.join(names)}"] if names else []


def summary_text(exp: Experiment, s: StepSummary) -> str:
    L = exp.layout
    layout = L.axes()
    modules = f" ({', '.join(L.recompute_modules)})" if L.recompute_modules else ""
    extras = [x for x in (f"ZeRO-{L.zero}" if L.zero else "", "SP" if L.sp else "",
                          f"recompute {L.recompute}{modules}"
                          if L.recompute is not Recompute.NONE else "",
                          "FP8 activation cache" if L.fp8_activation_cache else "")
              if x]
    devices = exp.cluster.device_words[1]
    lines = [
        f"parasim: {exp.name} on {exp.cluster.name} ({L.world} {devices}), {layout}"
        + (f", {', '.join(extras)}" if extras else ""),
        f"  schedule            {L.schedule}, {L.num_microbatches} micro-batches of "
        f"{L.micro_batch}, global batch {L.global_batch}",
        *([f"  pipeline layers     {_stage_layers(exp)}"] if L.custom_split else []),
        f"  attention           {exp.model.attention}"
        + (" (materialized scores)" if str(exp.model.attention) == "unfused" else ""),
        f"  model               {model_summary(exp.model)}"
        + (f" ({exp.model.fp4_recipe} scaling; MFU against the FP4 peak)" if exp.model.fp4
           else f" ({exp.model.fp8_recipe} scaling; MFU against the FP8 peak)"
           if exp.model.fp8 else ""),
        *fleet_lines(exp),
        *_overlaps(L),
        *(f"  {label:<20}{value}" for label, value in headline(s)),
    ]
    # the table's unit from its largest figure: GiB for a GPU's, MiB for a tiny CPU run's
    unit = size_text(max((m.total_bytes for m in s.memory_by_pp_rank), default=GiB))[-3:]
    size = GiB if unit == "GiB" else 2**20 if unit == "MiB" else 2**10
    lines.append(f"  memory by pipeline rank ({unit})  params  grads  optim  activ  work  total")
    for i, m in enumerate(s.memory_by_pp_rank):
        lines.append(f"    pp rank {i:<3}                {m.params_bytes / size:6.1f} "
                     f"{m.grads_bytes / size:6.1f} {m.optimizer_bytes / size:6.1f} "
                     f"{m.activations_bytes / size:6.1f} {m.working_bytes / size:5.1f} "
                     f"{m.total_bytes / size:6.1f}")
    return "\n".join(lines)


def model_summary(model: ModelSpec) -> str:
    """The model's architecture in a few words, for the summary and the report."""
    attn = ("MHA" if model.kv_heads == model.heads else
            "MQA" if model.kv_heads == 1 else f"GQA {model.kv_heads} kv heads")
    if model.head_dim * model.heads != model.hidden or model.qk_norm:
        attn += f", heads of {model.head_dim}" + (", qk_norm" if model.qk_norm else "")
    if model.mla:
        attn = (f"MLA q_lora {model.q_lora_rank or 'none'}, kv_lora {model.kv_lora_rank}, "
                f"heads {model.head_dim}+{model.qk_rope_head_dim} rope, v {model.v_head_dim}")
    moe = ""
    if model.experts:
        skew = f", skew {model.routing_skew:g}" if model.routing_skew else ""
        skew += (", force-balanced" if model.force_balance else "") + (
            f", {model.router_group_topk} of {model.router_groups} groups"
            if model.router_groups else "") + _DISPATCH_LABEL.get(model.dispatch, "")
        cap = f", capacity {model.capacity_factor:g}" if model.capacity_factor else ", dropless"
        moe = (f", MoE {model.experts} experts top-{model.top_k} of {model.moe_ffn_hidden}"
               f" + {model.shared_experts} shared, {model.dense_layers} dense layers"
               f"{cap}{skew}")
    return (f"{attn}, {model.ffn} {model.ffn_hidden}, {model.norm}, {model.position} positions"
            f", {'biases' if model.bias else 'no biases'}, dropout {model.dropout:g}, "
            f"{model.dtype}{moe}" + (f", MTP {model.mtp_layers}" if model.mtp_layers else "")
            + _STACK_LABEL.get(model.kernels, ""))


_STACK_LABEL = {"eager": ", PyTorch eager kernels", "compiled": ", torch.compile kernels"}
"""The software stack where it is not the default fused one (`traces.stack`)."""
