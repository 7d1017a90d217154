"""Benchmark: per-layer forward and backward times of the 22B GPT of Korthikanti et al. (2022)
on one DGX-A100 (TP 8), next to the times that paper measured (its Table 4).

    python tests/bench/bench_layer_times.py [--layer 24] [--kernels]

Source: V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", MLSys 2023 (arXiv 2205.05198). Table 3: the 22B model has 64 heads, hidden 6144,
48 layers, TP 8, PP 1, 8 GPUs, global batch 4, micro-batch 4; §6: s = 2048, V = 51200, mixed
precision on Selene (DGX-A100 80GB, NVLink/NVSwitch). 2022 Megatron-LM ran materialized
(unfused) attention. Table 4: time to complete the forward and backward pass of one
transformer layer, ms.

How the simulated figure is read: the Table 3 configuration itself (48 layers, one
micro-batch of 4 on 8 GPUs) is built as a plan and replayed by `sim.engine.replay` on one DGX-A100,
so every kernel is timed by `ComputeModel` and every tensor-parallel collective by the flow
model over the NVSwitch node with NCCL's protocol. A layer's forward time is the span from the
start of its first forward op to the end of its last (the `tp` all-reduces, or SP's all-gathers
and reduce-scatters, sit inline on the compute stream, as Megatron issues them); its backward
time is the span of its backward and recompute ops. That is what the paper measured: a
per-layer timer on the compute stream, which contains the blocking tensor-parallel
communication. `--kernels` prints each op of the layer.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from sim.config import experiment_from_dict
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.models.sharing import interference_for
from traces.ops import Op, Phase, Trace
from traces.plan import build

MODEL_22B = {"layers": 48, "hidden": 6144, "heads": 64, "seq_len": 2048, "vocab": 51200,
             "dtype": "fp16", "attention": "unfused"}
PARALLEL_22B = {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 4, "global_batch": 4}


@dataclass(frozen=True, slots=True)
class Published:
    name: str
    sp: bool
    recompute: str
    forward_ms: float
    backward_ms: float


TABLE_4 = (  # Korthikanti et al. 2022, Table 4 (forward, backward in ms; combined = their sum)
    Published("no recompute", False, "none", 7.7, 11.9),
    Published("sequence parallelism", True, "none", 7.2, 11.8),
    Published("full recompute", False, "full", 7.7, 19.5),
    Published("selective recompute", False, "selective", 7.7, 13.2),
    Published("selective + SP", True, "selective", 7.2, 13.1),
)


def layer_ops(sp: bool, recompute: str, layer: int) -> tuple[list[Op], list[Op]]:
    """The timed forward and backward (with recompute) ops of `layer` on rank 0."""
    exp = experiment_from_dict({"model": MODEL_22B,
                                "parallel": {**PARALLEL_22B, "sp": sp, "recompute": recompute},
                                "cluster": {"preset": "dgx-a100", "nodes": 1}})
    built = build(exp.model, exp.layout)
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    times = replay(Trace(built.ops, built.meta), exp.cluster, compute,
                   interference=interference_for(exp.cluster, exp.profile, compute))
    ops = times.timed_trace().ops[0]
    mine = [op for op in ops if op.layer == layer]
    return ([op for op in mine if op.phase is Phase.FWD],
            [op for op in mine if op.phase in (Phase.BWD, Phase.RECOMPUTE)])


def span_ms(ops: list[Op]) -> float:
    return (max(op.end for op in ops) - min(op.start for op in ops)) * 1e3  # type: ignore


def show_kernels(ops: list[Op]) -> None:
    for op in ops:
        what = op.kind.value if op.name == "tp" else ""
        print(f"    {str(op.phase):9} {op.name:13} {what:14} "
              f"{(op.end - op.start) * 1e6:8.1f} us")  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layer", type=int, default=24, help="which of the 48 layers")
    parser.add_argument("--kernels", action="store_true", help="print the layer's ops")
    args = parser.parse_args()
    print("22B GPT (Korthikanti et al. 2022, Table 3) on one DGX-A100, TP 8, b = 4, unfused "
          f"attention; layer {args.layer}; times in ms (paper: Table 4)")
    print(f"{'experiment':22} {'fwd':>5} {'paper':>5} {'err':>6}  {'bwd':>5} {'paper':>5} "
          f"{'err':>6}  {'sum':>5} {'paper':>5} {'err':>6}  {'overhead':>8} {'paper':>5}")
    errors: list[float] = []
    base: float | None = None
    base_paper = TABLE_4[0].forward_ms + TABLE_4[0].backward_ms
    for row in TABLE_4:
        fwd_ops, bwd_ops = layer_ops(row.sp, row.recompute, args.layer)
        fwd, bwd = span_ms(fwd_ops), span_ms(bwd_ops)
        total, paper_total = fwd + bwd, row.forward_ms + row.backward_ms
        base = total if base is None else base
        cells = []
        for ours, theirs in ((fwd, row.forward_ms), (bwd, row.backward_ms),
                             (total, paper_total)):
            error = (ours - theirs) / theirs
            errors.append(abs(error))
            cells.append(f"{ours:5.2f} {theirs:5.1f} {100 * error:+5.1f}%")
        print(f"{row.name:22} " + "  ".join(cells) +
              f"  {100 * (total / base - 1):+7.0f}% {100 * (paper_total / base_paper - 1):+4.0f}%")
        if args.kernels:
            show_kernels(fwd_ops + bwd_ops)
    print(f"MAPE over the 15 figures (fwd, bwd, sum per row): "
          f"{100 * sum(errors) / len(errors):.1f}%")


if __name__ == "__main__":
    main()
