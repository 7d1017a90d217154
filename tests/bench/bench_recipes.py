"""Benchmark: parasim against published training throughputs of today's recipes (issue 32).

    python tests/bench/bench_recipes.py [--only SUBSTRING] [--table NAME] [--max-gpus N]

Every row is a figure a source published for a run it describes, entered exactly as the source
states it (model, layout, batch, sequence, precision, hardware; `recipes_rows.py` and
`recipes_bridge.py` cite each), simulated with `sim.simulate.predict` (the path of `parasim
simulate`), folded. Per row: the published figure, parasim's, the signed error and the step;
per table the MAPE over the rows parasim can express and how many it can. A row that needs a
key or preset parasim does not have prints "not expressible: " and parasim's one-line
ConfigError, so the script runs before and after the keys other branches add are merged.
Nothing is fitted to a table; there is no timed assertion.

Tables (`--table`):

1. `llama3`: Llama 3 paper, Table 4 (405B on 8,192 and 16,384 H100; TFLOP/s per GPU).
2. `torchtitan`: torchtitan paper / docs/performance.md, Tables 1-6 (tokens/s per GPU).
   `asynctp`: torchtitan's June 2025 AsyncTP benchmark, Table 4's 70B run on later torch,
   bf16 / Float8 tensorwise / rowwise, without and with AsyncTP (tokens/s per GPU).
3. `bridge`: Megatron-Bridge / NeMo performance summary, dense Llama 3 / 3.1 rows of the 25.11
   and 26.02 containers on H100, B200, GB200 and GB300 (tokens/s per GPU).
4. `megatron`: Megatron-LM's r0.8 weak-scaling table: its model table and MFU plot are
   images (images/model_table.png, images/weak_scaling.png); the README's text gives only
   "MFU increases from 41% ... to 47-48%", so no row can be entered as stated.
5. `megascale`: MegaScale (NSDI 2024), Table 2, the Megatron-LM rows (MFU %), and the two
   scale-out losses.
6. `dgxc`: NVIDIA's dgxc-benchmarking Llama 3.1 405B recipes publish configurations and how
   to measure, not measured figures the corpora hold: no row.

Units, each in its source's own count: tokens/s/GPU = global batch x sequence / step / GPUs.
TFLOP/s per GPU for Llama 3 counts Megatron's num_floating_point_operations with causal
attention (half of the s/h term: the work flash attention does); NVIDIA's published Model
TFLOP/s are that count to their rounding (printed below the Bridge table), Meta does not state
its count (Megatron's full-square count is printed beside it). MegaScale's MFU is Megatron's
full count over the A100's 312 TFLOP/s (its throughput and MFU columns agree on it).
torchtitan's rows are tokens/s, so its 6N + 12·l·h·q·t FLOP count is not needed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipes_bridge import BRIDGE_ROWS, PAIRS_2511
from recipes_rows import (
    LLAMA3_ROWS,
    MEGASCALE_ROWS,
    MEGASCALE_SECONDS,
    TITAN_ASYNCTP_ROWS,
    TORCHTITAN_ROWS,
    Row,
)

from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.errors import ConfigError

A100_PEAK = 312e12
"""MegaScale's MFU denominator: A100's dense BF16 tensor-core peak (A100 data sheet)."""

SCALE_OUT = ((256, 1024), (3072, 12288))
"""MegaScale's two strong-scaling spans (the 768 and the 6144 batch)."""


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    rows: Sequence[Row]
    note: str = ""


TABLES: dict[str, Table] = {
    "llama3": Table("1. Llama 3 (arXiv 2407.21783), Table 4: TFLOP/s per GPU", LLAMA3_ROWS),
    "torchtitan": Table("2. torchtitan (arXiv 2410.06511), H100: tokens/s per GPU",
                        TORCHTITAN_ROWS),
    "bridge": Table("3. Megatron-Bridge performance summary: tokens/s per GPU", BRIDGE_ROWS),
    "asynctp": Table("2b. torchtitan's AsyncTP benchmark (2025-06), 70B on 256 H100: "
                     "tokens/s per GPU", TITAN_ASYNCTP_ROWS),
    "megatron": Table("4. Megatron-LM r0.8 README, weak scaling", [],
                      "no row: the model table and the MFU figure are images; the text gives "
                      "only MFU 41% (2B) to 47-48% (largest) on up to 6,144 H100"),
    "megascale": Table("5. MegaScale (NSDI 2024), Table 2, Megatron-LM: MFU %",
                       MEGASCALE_ROWS),
    "dgxc": Table("6. NVIDIA dgxc-benchmarking, Llama 3.1 405B", [],
                  "no row: the recipes give configurations and how to read the step time, "
                  "not published measurements the search corpora hold"),
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """parasim's figure for a row, in the row's unit, and what it came from."""

    figure: float
    step_s: float
    fits: bool
    wall_s: float


def flops_per_token(model: Mapping[str, Any], causal: bool) -> float:
    """Megatron-LM's num_floating_point_operations per token for a dense decoder, read off a
    row's [model] table: 12·n·h²·(1 + kv/heads + c·s/h) + 12·n·h²·(g·ffn/h + V/(2nh)), c = 1/2
    for causal attention (its masked half not counted), 1 as Megatron writes it; g = 3/2
    for SwiGLU. The same count as traces.step_flops.megatron_num_flops at c = 1."""
    n, h, s, vocab = model["layers"], model["hidden"], model["seq_len"], model["vocab"]
    heads = model["heads"]
    kv = model.get("kv_heads", heads)
    swiglu = model.get("ffn") == "swiglu"
    ffn = model.get("ffn_hidden", 4 * h)
    attention = 1 + kv / heads + (0.5 if causal else 1.0) * s / h
    mlp_logits = ffn / h * (1.5 if swiglu else 1.0) + vocab / (2 * n * h)
    return 12 * n * h * h * (attention + mlp_logits)


def tokens(row: Row) -> int:
    """Tokens one step processes: global batch x sequence."""
    return row.parallel["global_batch"] * row.model["seq_len"]


def figure(row: Row, step: float) -> float:
    """parasim's step time in the row's unit."""
    per_gpu = tokens(row) / step / row.gpus
    if row.unit == "tokens/s":
        return per_gpu
    if row.unit == "TFLOP/s":
        return per_gpu * flops_per_token(row.model, causal=True) / 1e12
    if row.unit == "MFU %":
        return 100 * per_gpu * flops_per_token(row.model, causal=False) / A100_PEAK
    raise ValueError(row.unit)


def evaluate(row: Row) -> Outcome | str:
    """Simulate `row`; a config parasim refuses gives "not expressible: <its error>"."""
    began = time.perf_counter()
    try:
        exp = experiment_from_dict(row.config(), name=row.name)
        summary, _ = predict(exp)
    except ConfigError as err:
        return f"not expressible: {err}"
    step = summary.step_time_s
    return Outcome(figure(row, step), step, summary.fits, time.perf_counter() - began)


def megatron_count(row: Row, outcome: Outcome) -> float:
    """parasim's TFLOP/s per GPU for `row` in Megatron's full-square count (not causal)."""
    return outcome.figure * flops_per_token(row.model, False) / flops_per_token(row.model, True)


def layout(row: Row) -> str:
    """The row's parallel layout in short."""
    p = row.parallel
    parts = [f"{k}{p[k]}" for k in ("tp", "cp", "pp", "vp", "dp") if p.get(k, 1) > 1]
    return " ".join(parts + [f"z{p.get('zero', 0)}", f"b{p['micro_batch']}"])


def run_table(key: str, table: Table, args: argparse.Namespace) -> dict[str, Outcome]:
    """Print `table`'s rows (those --only and --max-gpus keep) and its MAPE; parasim's
    outcome per row name."""
    print(f"\n{table.title}")
    if table.note:
        print(f"  {table.note}")
    rows = [r for r in table.rows if args.only in r.name and r.gpus <= args.max_gpus]
    errors: list[float] = []
    outcomes: dict[str, Outcome] = {}
    for row in rows:
        outcome = evaluate(row)
        head = f"  {row.name:44} {row.gpus:6,d} {layout(row):>24} {row.published:9.1f}"
        if isinstance(outcome, str):
            print(f"{head}  {outcome}", flush=True)
            continue
        outcomes[row.name] = outcome
        error = (outcome.figure - row.published) / row.published
        errors.append(abs(error))
        extra = "" if key != "llama3" else f" (Megatron count {megatron_count(row, outcome):.0f})"
        print(f"{head} {outcome.figure:9.1f} {100 * error:+6.1f}% {outcome.step_s:9.3f} s"
              f"{'' if outcome.fits else ' (does not fit)'}{extra}  [{outcome.wall_s:.1f} s]",
              flush=True)
    mape = f"MAPE {100 * statistics.mean(errors):.1f}%" if errors else "MAPE n/a"
    print(f"  {key}: {len(outcomes)} of {len(rows)} rows expressible; {mape}")
    return outcomes


def flop_count_check() -> None:
    """NVIDIA's published Model TFLOP/s over its tokens/s, per 25.11 row, against the causal
    count: the unit the Llama 3 TFLOP/s are converted with."""
    print("  FLOP count: published TFLOP/s / tokens/s vs causal Megatron count (TFLOP/token)")
    for row, tflops in PAIRS_2511:
        published = tflops / row.published
        ours = flops_per_token(row.model, causal=True) / 1e12
        print(f"    {row.name:44} {published:.5f} vs {ours:.5f} "
              f"({100 * (ours / published - 1):+.2f}%)")


def scale_out_loss(seconds: Mapping[int, float], small: int, large: int) -> float:
    """Per-GPU throughput lost from `small` to `large` GPUs at a fixed batch, as the issue
    states it: GPU-seconds a step takes at `large` over those at `small`, minus 1 (Table 2's
    Megatron-LM times give 19.0% for 256 -> 1024 and 18.1% for 3072 -> 12288)."""
    return large * seconds[large] / (small * seconds[small]) - 1


def scale_out(outcomes: Mapping[str, Outcome]) -> None:
    """MegaScale's two scale-out losses, published (Table 2's times) and parasim's."""
    steps = {row.gpus: outcomes[row.name].step_s for row in MEGASCALE_ROWS
             if row.name in outcomes}
    for small, large in SCALE_OUT:
        published = 100 * scale_out_loss(MEGASCALE_SECONDS, small, large)
        if small in steps and large in steps:
            ours = 100 * scale_out_loss(steps, small, large)
            print(f"  scale-out loss {small} -> {large} GPUs: published {published:.1f}%, "
                  f"parasim {ours:.1f}% ({ours - published:+.1f} points)")
        else:
            print(f"  scale-out loss {small} -> {large} GPUs: published {published:.1f}%, "
                  f"parasim n/a (a row not simulated)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the rows whose name contains this")
    parser.add_argument("--table", default="", choices=["", *TABLES],
                        help="run one table (default: all)")
    parser.add_argument("--max-gpus", type=int, default=16384, help="skip larger rows")
    args = parser.parse_args()
    print(f"  {'row':44} {'GPUs':>6} {'layout':>24} {'published':>9} {'parasim':>9} "
          f"{'error':>7} {'step':>11}")
    for key, table in TABLES.items():
        if args.table and key != args.table:
            continue
        outcomes = run_table(key, table, args)
        if key == "bridge" and not args.only:
            flop_count_check()
        if key == "megascale":
            scale_out(outcomes)


if __name__ == "__main__":
    main()
