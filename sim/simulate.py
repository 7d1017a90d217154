"""`parasim simulate`: build the plan of an experiment, replay it, summarize, format.

    from sim.config import load_experiment, example_path
    from sim.simulate import predict
    summary, times = predict(load_experiment(example_path()))
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from sim.config import Experiment
from sim.engine.replay import Progress, StepTimes, replay
from sim.metrics import StepSummary, summarize
from sim.models.compute import ComputeModel
from sim.models.memory import memory_by_pp_rank
from sim.models.sharing import interference_for
from traces.layout import Recompute
from traces.ops import Trace
from traces.pipeline import layout_schedule
from traces.plan import build

GiB = 2**30


def predict(exp: Experiment, *, fold: bool = True,
            progress: Progress | None = None) -> tuple[StepSummary, StepTimes]:
    """Simulate one step of `exp`; with `fold`, one rank per pipeline stage stands for all."""
    ranks = exp.layout.representatives() if fold else None
    schedule = layout_schedule(exp.layout)  # once: the plan and the memory model run it
    built = build(exp.model, exp.layout, ranks=ranks, schedule=schedule)
    plan = Trace(built.ops, replace(built.meta, experiment=exp.name, cluster_name=exp.cluster.name,
                                    cluster_spec=exp.cluster.table, network=str(exp.network)))
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    times = replay(plan, exp.cluster, compute,
                   interference=interference_for(exp.cluster, exp.profile, compute),
                   network=exp.network,
                   algo=exp.algo, progress=progress)
    memory = memory_by_pp_rank(exp.model, exp.layout, schedule)
    return summarize(exp.model, exp.layout, exp.cluster, times, memory), times


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
    }


def headline(s: StepSummary) -> list[tuple[str, str]]:
    """The figures a user looks at first, as (label, value) rows: the text summary and the
    report's header both show these."""
    verdict = "fits" if s.fits else "DOES NOT FIT"
    return [
        ("step time", f"{s.step_time_s:.4g} s"),
        ("throughput", f"{s.tokens_per_s:,.0f} tokens/s"),
        ("model TFLOP/s/GPU", f"{s.model_tflops_per_gpu:.1f}  (MFU {s.mfu:.1%})"),
        ("hardware TFLOP/s", f"{s.hardware_tflops_per_gpu:.1f}  (recomputation included)"),
        ("compute", f"{s.compute_s:.4g} s per GPU"),
        ("exposed comm", f"{s.exposed_comm_s:.4g} s per GPU"),
        ("bubble", f"{s.bubble_fraction:.1%} of the step"),
        ("peak memory", f"{s.peak_memory_bytes / GiB:.1f} GiB of "
                        f"{s.memory_capacity_bytes / GiB:.1f} GiB: {verdict}"),
    ]


def summary_text(exp: Experiment, s: StepSummary) -> str:
    L = exp.layout
    layout = f"TP {L.tp} · PP {L.pp} · DP {L.dp}" + (f" · VP {L.vp}" if L.vp > 1 else "")
    extras = [x for x in (f"ZeRO-{L.zero}" if L.zero else "", "SP" if L.sp else "",
                          f"recompute {L.recompute}" if L.recompute is not Recompute.NONE else "")
              if x]
    devices = exp.cluster.device_words[1]
    lines = [
        f"parasim: {exp.name} on {exp.cluster.name} ({L.world} {devices}), {layout}"
        + (f", {', '.join(extras)}" if extras else ""),
        f"  schedule            {L.schedule}, {L.num_microbatches} micro-batches of "
        f"{L.micro_batch}, global batch {L.global_batch}",
        f"  attention           {exp.model.attention}"
        + (" (materialized scores)" if str(exp.model.attention) == "unfused" else ""),
        *(f"  {label:<20}{value}" for label, value in headline(s)),
        "  memory by pipeline rank (GiB)  params  grads  optim  activ  work  total",
    ]
    for i, m in enumerate(s.memory_by_pp_rank):
        lines.append(f"    pp rank {i:<3}                {m.params_bytes / GiB:6.1f} "
                     f"{m.grads_bytes / GiB:6.1f} {m.optimizer_bytes / GiB:6.1f} "
                     f"{m.activations_bytes / GiB:6.1f} {m.working_bytes / GiB:5.1f} "
                     f"{m.total_bytes / GiB:6.1f}")
    return "\n".join(lines)
