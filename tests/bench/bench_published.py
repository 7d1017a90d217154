"""Benchmark: parasim against published Megatron-LM throughputs on DGX-A100 clusters.

    python tests/bench/bench_published.py [--only SUBSTRING] [--max-gpus N]

Every case is a run a paper measured end to end, simulated with `sim.simulate.predict` (the
same path as `parasim simulate`) at the stated layout on `dgx-a100` nodes (Selene: 8 A100
80GB, NVSwitch, 8 HDR InfiniBand HCAs per node, as both papers describe):

- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC'21 (arXiv 2104.04473). Table 1: achieved TFLOP/s per GPU, counted with
  eq. (3), F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (hardware FLOPs with full recomputation),
  s = 2048, V = 51200. Micro-batch, interleaving and DDP flavour per row from Megatron-LM's
  examples/sc21/run_table_1.sh (the scripts that produced the table): `DDP=torch` is PyTorch
  DDP, which all-reduces gradient buckets during the backward (overlap_grad_reduce), `DDP=local`
  is Megatron's own, which reduced after the backward in 2021. §5.1 also gives GPT-3 175B on
  1024 GPUs, batch 1536: 140 TFLOP/s (the layout of the shipped example, TP 8 · PP 16 · DP 8,
  micro-batch 1, from Megatron-LM's GPT-3 example script).
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys
  2023 (arXiv 2205.05198). Table 5: iteration time with full recomputation and with the paper's
  method (sequence parallelism + selective recomputation), for the Table 3 configurations (no
  data parallelism; interleaved schedule with 3 model chunks for 175B and 530B).

- Korthikanti et al. 2022, Table 4: the 22B model's per-layer forward and backward times on
  one DGX-A100 (`bench_layer_times.py`, whose rows this prints too, unless --no-layers).

Besides each source's MAPE it prints the trend across Table 1's sizes (the published and the
simulated TFLOP/s from the smallest model to the largest, and their correlation).

Both papers ran 2021-2022 Megatron-LM: fp16 mixed precision, materialized (unfused) attention,
tied embeddings. The comparison is in each source's own unit (TFLOP/s by eq. 3, or seconds per
iteration); the error is parasim's against the published figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.step_flops import megatron_step_flops

NARAYANAN = "Narayanan et al. 2021, Table 1"
KORTHIKANTI = "Korthikanti et al. 2022, Table 5"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    source: str
    model: dict[str, Any]
    parallel: dict[str, Any]
    published: float
    """TFLOP/s per GPU (eq. 3) for Narayanan, seconds per iteration for Korthikanti."""
    unit: str = "TFLOP/s"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        p = self.parallel
        return p["tp"] * p.get("pp", 1) * p.get("dp", 1)


def gpt(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": 2048,
            "vocab": 51200, "dtype": "fp16", "attention": "unfused"}


def table1(name: str, model: dict[str, Any], tp: int, pp: int, dp: int, mb: int, gb: int,
           vp: int, torch_ddp: bool, tflops: float) -> Case:
    parallel = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb, "global_batch": gb,
                "recompute": "full", "overlap_grad_reduce": torch_ddp,
                "schedule": "interleaved" if vp > 1 else "1f1b", "vp": vp,
                "overlap_p2p_comm": False}  # 2021's interleaved schedule waited on its sends
    return Case(name, NARAYANAN, model, parallel, tflops)


def table5(name: str, model: dict[str, Any], pp: int, batch: int, mb: int, vp: int,
           full_s: float, ours_s: float) -> list[Case]:
    base = {"tp": 8, "pp": pp, "dp": 1, "micro_batch": mb, "global_batch": batch,
            "schedule": "interleaved" if vp > 1 else "1f1b", "vp": vp,
            "overlap_p2p_comm": False}  # 2022's Megatron-LM had no p2p overlap (2023)
    return [Case(f"{name} full recompute", KORTHIKANTI, model,
                 {**base, "recompute": "full"}, full_s, "s"),
            Case(f"{name} SP + selective", KORTHIKANTI, model,
                 {**base, "recompute": "selective", "sp": True}, ours_s, "s")]


CASES: list[Case] = [
    # Narayanan et al. 2021, Table 1 (layout, micro-batch, chunks, DDP: run_table_1.sh)
    table1("1.7B", gpt(24, 2304, 24), 1, 1, 32, 16, 512, 1, True, 137),
    table1("3.6B", gpt(30, 3072, 32), 2, 1, 32, 16, 512, 1, True, 138),
    table1("7.5B", gpt(36, 4096, 32), 4, 1, 32, 16, 512, 1, True, 142),
    table1("18.4B", gpt(40, 6144, 48), 8, 1, 32, 8, 1024, 1, True, 135),
    table1("39.1B", gpt(48, 8192, 64), 8, 2, 32, 4, 1536, 1, False, 138),
    table1("76.1B", gpt(60, 10240, 80), 8, 4, 32, 2, 1792, 3, False, 140),
    table1("145.6B", gpt(80, 12288, 96), 8, 8, 24, 2, 2304, 2, False, 148),
    table1("310.1B", gpt(96, 16384, 128), 8, 16, 15, 1, 2160, 2, False, 155),
    table1("529.6B", gpt(105, 20480, 128), 8, 35, 9, 1, 2520, 3, False, 163),
    table1("1008B", gpt(128, 25600, 160), 8, 64, 6, 1, 3072, 1, False, 163),
    # Narayanan et al. 2021, §5.1: GPT-3 on 1024 GPUs (the shipped example's layout)
    Case("GPT-3 175B, 1024 GPUs", "Narayanan et al. 2021, §5.1", gpt(96, 12288, 96),
         {"tp": 8, "pp": 16, "dp": 8, "micro_batch": 1, "global_batch": 1536,
          "recompute": "full", "overlap_grad_reduce": False}, 140),
    # Korthikanti et al. 2022, Table 5 (configurations of its Table 3)
    *table5("22B", gpt(48, 6144, 64), 1, 4, 4, 1, 1.42, 1.10),
    *table5("175B", gpt(96, 12288, 96), 8, 64, 1, 3, 18.13, 13.75),
    *table5("530B", gpt(105, 20480, 128), 35, 280, 1, 3, 49.05, 37.83),
    *table5("1T", gpt(128, 25600, 160), 64, 512, 1, 1, 94.42, 71.49),
]


PAIRS = [("529.6B", "530B full recompute"), ("1008B", "1T full recompute")]
"""Runs both papers published with the same work per pipeline: the same model, TP, PP, model
chunks, micro-batch and micro-batches per pipeline (Narayanan's global batch over its DP
degree equals Korthikanti's batch at DP 1), on the same Selene nodes. They differ only in the
software (2021 and 2022 Megatron-LM) and in Narayanan's DP all-reduce after the backward."""


def per_gpu_tflops(case: Case, seconds: float) -> float:
    """Eq. (3)'s FLOPs of `case`'s global batch per GPU per second, in TFLOP/s."""
    exp = experiment_from_dict({"model": case.model, "parallel": case.parallel,
                                "cluster": {"preset": "dgx-a100", "nodes": case.gpus // 8}})
    flops = megatron_step_flops(exp.model, exp.layout.global_batch, full_recompute=True)
    return flops / case.gpus / seconds / 1e12


def same_work(a: Case, b: Case) -> bool:
    """`a` and `b` run one pipeline's step alike: the model and every per-pipeline figure."""
    pa, pb = a.parallel, b.parallel
    keys = ("tp", "pp", "vp", "micro_batch", "recompute")
    return a.model == b.model and all(pa.get(k, 1) == pb.get(k, 1) for k in keys) and \
        pa["global_batch"] // pa.get("dp", 1) == pb["global_batch"] // pb.get("dp", 1)


def pairs(results: dict[str, tuple[Case, float]]) -> None:
    """Print each pair's published throughputs, their ratio, and parasim's ratio (`results`:
    parasim's figure per case name, in the case's unit)."""
    print("Same work per pipeline, both papers (TFLOP/s per GPU by eq. 3):")
    for older, newer in PAIRS:
        if older not in results or newer not in results:
            continue
        (a, ours_a), (b, ours_b) = results[older], results[newer]
        assert same_work(a, b), (older, newer)
        published = a.published / per_gpu_tflops(b, b.published)
        ours = ours_a / per_gpu_tflops(b, ours_b)
        print(f"  {older} (2021) {a.published:.0f} vs {newer} (2022) "
              f"{per_gpu_tflops(b, b.published):.0f}: published ratio {published:.3f}, "
              f"parasim {ours:.3f} (one model within 5% of both needs >= {0.95 / 1.05:.3f})")


def simulate(case: Case) -> tuple[float, float, float]:
    """(parasim's figure in the case's unit, its step time, simulation wall seconds)."""
    exp = experiment_from_dict({"model": case.model, "parallel": case.parallel,
                                "cluster": {"preset": "dgx-a100", "nodes": case.gpus // 8}},
                               name=case.name)
    began = time.perf_counter()
    summary, _ = predict(exp)
    wall = time.perf_counter() - began
    step = summary.step_time_s
    if case.unit == "s":
        return step, step, wall
    flops = megatron_step_flops(exp.model, exp.layout.global_batch, full_recompute=True)
    return flops / case.gpus / step / 1e12, step, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--max-gpus", type=int, default=4096, help="skip larger cases")
    parser.add_argument("--no-layers", action="store_true", help="skip Table 4's layers")
    args = parser.parse_args()
    print(f"{'case':28} {'GPUs':>5} {'layout':>22} {'published':>10} {'parasim':>9} "
          f"{'error':>7} {'step s':>8} {'wall s':>7}  source")
    errors: dict[str, list[float]] = {}
    trend: list[tuple[float, float]] = []
    results: dict[str, tuple[Case, float]] = {}
    for case in CASES:
        if args.only not in case.name or case.gpus > args.max_gpus:
            continue
        ours, step, wall = simulate(case)
        results[case.name] = (case, ours)
        error = (ours - case.published) / case.published
        errors.setdefault(case.source.split(",")[0] + (
            ", Table 1" if case.source == NARAYANAN else ", Table 5" if case.source ==
            KORTHIKANTI else ", §5.1"), []).append(abs(error))
        if case.source == NARAYANAN:
            trend.append((case.published, ours))
        p = case.parallel
        layout = (f"t{p['tp']} p{p.get('pp', 1)} d{p.get('dp', 1)} b{p['micro_batch']}"
                  + (f" v{p['vp']}" if p.get("vp", 1) > 1 else "")
                  + f" {p['recompute'][:3]}" + (" sp" if p.get("sp") else ""))
        unit = " s" if case.unit == "s" else ""
        print(f"{case.name:28} {case.gpus:5d} {layout:>22} {case.published:8.2f}{unit:2} "
              f"{ours:7.2f}{unit:2} {100 * error:+6.1f}% {step:8.3f} {wall:7.1f}  "
              f"{case.source}", flush=True)
    pairs(results)
    if not args.no_layers and not args.only:
        errors.update(table_4())
    for source, errs in errors.items():
        print(f"MAPE {source}: {100 * statistics.mean(errs):.1f}% over {len(errs)} figures")
    if len(trend) > 2:
        published, ours = zip(*trend)
        print(f"trend over Table 1's {len(trend)} sizes: published {published[0]:.0f} -> "
              f"{published[-1]:.0f} TFLOP/s ({100 * (published[-1] / published[0] - 1):+.0f}%), "
              f"parasim {ours[0]:.0f} -> {ours[-1]:.0f} ({100 * (ours[-1] / ours[0] - 1):+.0f}%), "
              f"correlation {statistics.correlation(published, ours):.2f}")


def table_4() -> dict[str, list[float]]:
    """Korthikanti et al. 2022 Table 4 (bench_layer_times): print each row's per-layer
    forward and backward against the paper; the absolute errors per pass."""
    from bench_layer_times import TABLE_4, layer_ops, span_ms

    out: dict[str, list[float]] = {"Korthikanti et al. 2022, Table 4 forward": [],
                                   "Korthikanti et al. 2022, Table 4 backward": []}
    print("Korthikanti et al. 2022, Table 4: 22B, one DGX-A100, layer 24, ms")
    for row in TABLE_4:
        fwd_ops, bwd_ops = layer_ops(row.sp, row.recompute, 24)
        cells = []
        for key, ours, theirs in (("forward", span_ms(fwd_ops), row.forward_ms),
                                  ("backward", span_ms(bwd_ops), row.backward_ms)):
            error = (ours - theirs) / theirs
            out[f"Korthikanti et al. 2022, Table 4 {key}"].append(abs(error))
            cells.append(f"{key} {ours:5.2f} (paper {theirs:4.1f}, {100 * error:+5.1f}%)")
        print(f"  {row.name:22} " + "  ".join(cells), flush=True)
    return out


if __name__ == "__main__":
    main()
