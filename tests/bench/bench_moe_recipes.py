"""Benchmark: parasim against published MoE training throughputs (issue 33).

    python tests/bench/bench_moe_recipes.py [--only SUBSTRING] [--table NAME] [--max-gpus N]
                                              [--host | --no-host] [--causal-flops]

Every row is a figure a source published for a run it describes, entered as the source
states it (`moe_rows_folding.py` and `moe_rows_bridge.py` cite each and say what is assumed),
simulated with `sim.simulate.predict` (the path of `parasim simulate`), folded. Per row: the
published figure, parasim's, the signed error, the step and the wall time the simulation took;
per source the MAPE over the rows parasim can express. A row whose run used a setting parasim
has no key for yet (DualPipe, node-limited routing, the HybridEP / DeepEP dispatchers, the
overlapped expert all-to-all) prints "not expressible: <key>"; a row parasim refuses for
another reason prints its one-line ConfigError; neither is approximated. Nothing is fitted to
a table; there is no timed assertion.

The host: a row whose run launches its kernels from Megatron's eager loop (`MoeRow.host`: the
Megatron-Bridge rows but the full-iteration-graph recipes) is simulated with the launching
thread modelled (`[sim] host = true`, the recipe's `cuda_graph_scope`: `sim.models.host`);
`--no-host` turns that off, `--host` turns it on for every row.

Tables (`--table`):

folding-t2..t5: Liu et al., "MoE Parallel Folding", arXiv 2504.14960 v2: Table 2 (Mixtral
    8x22B on 128 H100, BF16 and FP8, model TFLOP/s per GPU), Table 3 (each model's best
    mapping per method, GBS 256, MFU %), Table 4 (strong scaling to 1,024 GPUs, GBS 1024),
    Table 5 (context scaling to 128K, Mixtral 8x22B).
bridge: Megatron-Bridge performance summary (docs.nvidia.com/nemo/megatron-bridge/latest/
    performance-summary.html and its archive page), DeepSeek-V3, Qwen3-30B-A3B and
    Qwen3-235B-A22B on H100, B200, B300, GB200 and GB300 (tokens/s per GPU). No Mixtral row:
    neither these pages nor NeMo's (NVIDIA/NeMo docs/source/performance/performance_summary.md
    @070a0bb, the 24.07 container) publish one.
bridge-card: Megatron-Bridge's Qwen3-30B-A3B model card: GB300 MXFP8 (8 GPUs, and its weak
    scaling to 256) with full-iteration CUDA graphs, H100 BF16 on 16 GPUs (tokens/s per GPU;
    `moe_rows_qwen30b.py`).
pai: Pai-Megatron-Patch issue #643: Qwen3-30B-A3B on 16 H800, sequence 8192, PP 2 x EP 8 and
    PP 4 x EP 4 (tokens/s per GPU; `moe_rows_qwen30b.py`).
bridge-4439: Megatron-Bridge issue #4439: Qwen3-30B-A3B on a DGX B200, MXFP8, MBS 4, the B200
    recipe of 26.04 (its ~562 TFLOP/s over Megatron's causal count per token).
deepseek: DeepSeek-V3's own 2,048-H800 run: "180K H800 GPU hours" per trillion tokens (report
    §1), so 1e12 / (180e3 x 3600) = 1,543.2 tokens/s per GPU.

Units: tokens/s/GPU = global batch x sequence / step / GPUs. The Folding paper's MFU and model
TFLOP/s count Megatron-LM's num_floating_point_operations (attention's full s/h square, the
routed top-k experts plus shared ones: `traces.step_flops.megatron_num_flops`) over H100's
989.5 TFLOP/s (its §4.1; Table 2's 458.3 TFLOP/s is Table 3's 46.3% of 989.5 to 0.1). Which
version of that count the paper's runs printed it does not say: Megatron-LM later halves
attention's s/h for the causal mask, and `--causal-flops` prints that reading (it moves
Table 5's long-context rows most: docs/moe-recipes.md, "Table 5").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from moe_rows import MoeRow
from moe_rows_bridge import BRIDGE_ROWS, DEEPSEEK_ROWS
from moe_rows_folding import FOLDING_ROWS, H100_PEAK
from moe_rows_qwen30b import CARD_ROWS, ISSUE_ROWS, PAI_ROWS

from sim.config import MODEL_KEYS, PARALLEL_KEYS, Experiment, experiment_from_dict
from sim.simulate import predict
from traces.errors import ConfigError
from traces.layout import Schedule
from traces.recompute import MODELLED
from traces.step_flops import megatron_num_flops

TITLES = {
    "folding-t2": "Folding paper, Table 2: Mixtral 8x22B, 128 H100, model TFLOP/s per GPU",
    "folding-t3": "Folding paper, Table 3: best mapping per method, GBS 256, MFU %",
    "folding-t4": "Folding paper, Table 4: strong scaling, GBS 1024, MFU %",
    "folding-t5": "Folding paper, Table 5: context scaling, Mixtral 8x22B, MFU %",
    "bridge": "Megatron-Bridge performance summary, MoE rows: tokens/s per GPU",
    "deepseek": "DeepSeek-V3 report, 2,048 H800: tokens/s per GPU (180K GPU-h / 1e12 tokens)",
    "bridge-card": "Megatron-Bridge Qwen3-30B-A3B model card (26.08 recipes): tokens/s per GPU",
    "pai": "Pai-Megatron-Patch issue #643, Qwen3-30B-A3B on 16 H800: tokens/s per GPU",
    "bridge-4439": "Megatron-Bridge issue #4439, Qwen3-30B-A3B on a DGX B200, MXFP8, MBS 4: "
                   "tokens/s per GPU (its TFLOP/s over the causal count)",
}
TABLES: dict[str, Sequence[MoeRow]] = {**FOLDING_ROWS, "bridge": BRIDGE_ROWS,
                                       "deepseek": DEEPSEEK_ROWS, "bridge-card": CARD_ROWS,
                                       "pai": PAI_ROWS, "bridge-4439": ISSUE_ROWS}


@dataclass(frozen=True, slots=True)
class Outcome:
    """parasim's figure for a row, in the row's unit, and what it came from."""

    figure: float
    step_s: float
    fits: bool
    wall_s: float


def missing(row: MoeRow) -> str | None:
    """The first of the row's `needs` parasim has no key (or schedule) for, else None."""
    for need in row.needs:
        key, _, value = need.partition("=")
        section, name = key.split(".")
        keys = MODEL_KEYS if section == "model" else PARALLEL_KEYS
        if name not in keys:
            return need
        if name == "schedule" and value not in {s.value for s in Schedule}:
            return need
        if name == "recompute_modules" and value not in MODELLED:
            return need
    return None


def figure(row: MoeRow, exp: Experiment, step: float, causal: bool = False) -> float:
    """parasim's step time in the row's unit; `causal`: FLOP/s and MFU from Megatron-LM's later
    count, attention's s/h halved for the causal mask (`megatron_num_flops`)."""
    per_gpu = row.tokens / step / row.gpus
    if row.unit == "tokens/s":
        return per_gpu
    per_token = megatron_num_flops(exp.model, exp.layout.global_batch, causal) / row.tokens
    if row.unit == "TFLOP/s":
        return per_gpu * per_token / 1e12
    if row.unit == "MFU %":
        return 100 * per_gpu * per_token / H100_PEAK
    raise ValueError(row.unit)


def evaluate(row: MoeRow, host: bool = False, causal: bool = False) -> Outcome | str:
    """Simulate `row` (with `host`, the launching thread modelled: `sim.models.host`, the
    recipe's CUDA graphs; `causal`, `figure`'s); "not expressible: ..." where parasim cannot
    say it."""
    lacking = missing(row)
    if lacking:
        return f"not expressible: {lacking}"
    began = time.perf_counter()
    try:
        exp = experiment_from_dict(row.config(host), name=row.name)
        summary, _ = predict(exp)
    except ConfigError as err:
        return f"not expressible: {err}"
    step = summary.step_time_s
    return Outcome(figure(row, exp, step, causal), step, summary.fits,
                   time.perf_counter() - began)


def layout(row: MoeRow) -> str:
    """The row's parallel layout in short."""
    p = row.parallel
    parts = [f"{k}{p[k]}" for k in ("tp", "cp", "pp", "vp", "dp", "ep", "etp")
             if p.get(k, 1) > 1]
    return " ".join(parts + [f"z{p.get('zero', 0)}", f"b{p['micro_batch']}"])


def report(row: MoeRow, outcome: Outcome | str) -> float | None:
    """Print one row; its signed error (a fraction) where there is one."""
    shown = "OOM" if row.published is None else f"{row.published:9.1f}"
    head = f"  {row.name:52} {row.gpus:5d} {layout(row):>30} {shown:>9}"
    if isinstance(outcome, str):
        print(f"{head}  {outcome}", flush=True)
        return None
    fits = "" if outcome.fits else " (does not fit)"
    tail = f"{outcome.step_s:9.3f} s{fits}  [{outcome.wall_s:.1f} s]"
    if row.published is None:
        print(f"{head} {outcome.figure:9.1f}    n/a  {tail}", flush=True)
        return None
    error = (outcome.figure - row.published) / row.published
    print(f"{head} {outcome.figure:9.1f} {100 * error:+6.1f}% {tail}", flush=True)
    return error


def run_table(key: str, rows: Sequence[MoeRow], args: argparse.Namespace) -> list[float]:
    """Print `key`'s rows (those --only and --max-gpus keep) and its MAPE; the errors."""
    print(f"\n{TITLES[key]}")
    kept = [r for r in rows if args.only in r.name and r.gpus <= args.max_gpus]
    errors = []
    simulated = 0
    for row in kept:
        outcome = evaluate(row, args.host or (row.host and not args.no_host),
                           args.causal_flops)
        simulated += not isinstance(outcome, str)
        error = report(row, outcome)
        if error is not None:
            errors.append(error)
    mape = f"MAPE {100 * statistics.mean(abs(e) for e in errors):.1f}%" if errors else \
        "MAPE n/a"
    worst = f", worst {100 * max(errors, key=abs):+.1f}%" if errors else ""
    print(f"  {key}: {simulated} of {len(kept)} rows expressible; {mape}{worst}")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the rows whose name contains this")
    parser.add_argument("--table", default="", choices=["", *TABLES],
                        help="run one table (default: all)")
    parser.add_argument("--max-gpus", type=int, default=4096, help="skip larger rows")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("--host", action="store_true",
                       help="model the launching CPU thread on every row ([sim] host = true, "
                            "the recipe's cuda_graph_scope)")
    hosts.add_argument("--no-host", action="store_true",
                       help="model it on no row (default: the rows whose runs pay it, "
                            "MoeRow.host)")
    parser.add_argument("--causal-flops", action="store_true",
                        help="FLOP/s and MFU from Megatron-LM's later count, attention's s/h "
                             "halved for the causal mask (the Folding rows; a reading, not "
                             "the row's)")
    args = parser.parse_args()
    print(f"  {'row':52} {'GPUs':>5} {'layout':>30} {'published':>9} {'parasim':>9} "
          f"{'error':>7} {'step':>11}  [simulate]")
    summary = {}
    for key, rows in TABLES.items():
        if args.table and key != args.table:
            continue
        errors = run_table(key, rows, args)
        if errors:
            summary[key] = 100 * statistics.mean(abs(e) for e in errors)
    print("\nMAPE per source: " + ", ".join(f"{k} {v:.1f}%" for k, v in summary.items()))


if __name__ == "__main__":
    main()
