"""Benchmark: the plan interpreter against a plain hand-written torch loop, DP on 2 CPU ranks.

    python tests/bench/bench_executor.py [--steps 5] [--warmup 2] [--hidden 256]

Both train the same GPT (unfused attention, fp32) on the same data for data parallelism over
two gloo processes: the plain loop runs whole-model autograd per micro-batch, all-reduces the
gradients in DDP-sized buckets after the backward and steps torch.optim.AdamW; the interpreter
runs the plan of the same config kernel by kernel, with its recorder on. Prints the median step
time of each and the interpreter's overhead. Target: within 10%.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from executor.comm import Comm
from executor.groups import Groups, plan_group_keys
from executor.interpreter import Interpreter
from executor.launch import RankContext, spawn
from executor.optim import AdamWConfig
from executor.options import RunOptions
from executor.recorder import Recorder, new_buffer
from executor.reference import ReferenceGPT, batch
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build

ADAMW = AdamWConfig()


def _specs(hidden: int, overlap: bool = True) -> tuple[ModelSpec, Layout]:
    model = ModelSpec(layers=4, hidden=hidden, heads=8, seq_len=128, vocab=1024, dtype="fp32",
                      attention="unfused")
    # 2 ranks x 2 micro-batches x 4 sequences; DDP's 25 MiB buckets
    return model, Layout(dp=2, micro_batch=4, global_batch=16, overlap_grad_reduce=overlap)


def plain_loop(ctx: RankContext, hidden: int, steps: int, warmup: int,
               overlap: bool = False) -> list[float]:
    model, layout = _specs(hidden)
    ref = ReferenceGPT(model, seed=1)
    params = list(ref.params.values())
    opt = torch.optim.AdamW(params, lr=ADAMW.lr, betas=(ADAMW.beta1, ADAMW.beta2),
                            eps=ADAMW.eps, weight_decay=ADAMW.weight_decay, foreach=False)
    buckets, current, size = [], [], 0
    for p in reversed(params):  # DDP's order: roughly the order gradients become ready
        current.append(p)
        size += p.numel() * 4
        if size >= layout.bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    buckets += [current] if current else []
    m, b = layout.num_microbatches, layout.micro_batch
    times = []
    for step in range(warmup + steps):
        rows = batch(model, layout.global_batch, 1, step)
        dist.barrier()
        start = time.perf_counter()
        for p in params:
            p.grad = None
        for mb in range(m):
            first = (ctx.rank * m + mb) * b
            (ref.loss(rows[first:first + b]) / (m * layout.dp)).backward()
        for bucket in buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])  # type: ignore[union-attr]
            dist.all_reduce(flat)
            offset = 0
            for p in bucket:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))  # type: ignore[union-attr]
                offset += p.numel()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[warmup:]


def interpreter(ctx: RankContext, hidden: int, steps: int, warmup: int,
                overlap: bool = True) -> list[float]:
    model, layout = _specs(hidden, overlap)
    plan = build(model, layout)
    groups = Groups.create(plan_group_keys(plan, layout), ctx.timeout_s)
    recorder = Recorder(new_buffer(len(plan.ops[ctx.rank])))
    interp = Interpreter(plan, model, layout, ctx.rank, Comm(groups),
                         RunOptions(seed=1, adamw=ADAMW), ctx.device, recorder)
    times = []
    for _ in range(warmup + steps):
        recorder.reset()
        dist.barrier()
        start = time.perf_counter()
        interp.step()
        times.append(time.perf_counter() - start)
    groups.destroy()
    return times[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="plain/interpreter alternations")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--no-overlap", action="store_true",
                        help="the plan reduces its buckets after the backward, as the loop does")
    args = parser.parse_args()
    # Alternate the two, so that load from elsewhere on the machine hits both alike; a step's
    # time is its slower rank's.
    steps: dict[str, list[float]] = {"plain": [], "interpreter": []}
    for _ in range(args.rounds):
        for name, fn in (("plain", plain_loop), ("interpreter", interpreter)):
            results, _ = spawn(fn, 2, (args.hidden, args.steps, args.warmup,
                                       not args.no_overlap), timeout_s=600)
            steps[name] += [max(ts) for ts in zip(*results)]
    for name, times in steps.items():
        print(f"{name:12s} step: median {statistics.median(times) * 1e3:7.1f} ms, "
              f"fastest {min(times) * 1e3:7.1f} ms over {len(times)} steps")
    for stat, f in (("median", statistics.median), ("fastest", min)):
        overhead = f(steps["interpreter"]) / f(steps["plain"]) - 1
        print(f"interpreter overhead ({stat}): {overhead * 100:+.1f}% (target within 10%)")


if __name__ == "__main__":
    main()
