"""The plan builder's output, op by op, for many layouts: to check a change keeps every op.

    PYTHONPATH=/work/main python tests/bench/plan_digest.py /tmp/before    # the old tree's plans
    PYTHONPATH=$PWD python tests/bench/plan_digest.py /tmp/after           # this tree's
    python tests/bench/plan_digest.py --compare /tmp/before /tmp/after

Each case (a shipped example, or one changed in a few `[parallel]` / `[model]` keys) builds its
plan as `parasim simulate` does (folded: one rank per pipeline coordinate; `--no-fold` cases:
every rank) and writes one line per op, `repr(op)`, which names every field with its type
(a `Stream` member and the string "compute" differ), gzipped. `--compare` reports each case
equal or the first op that differs. The children import whatever `PYTHONPATH` names.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim.config import example_path, experiment_from_dict
from traces.files import load_toml
from traces.plan import build

GPT3 = "gpt3-175b-1024-a100.toml"
H100 = {"cluster": {"preset": "dgx-h100", "nodes": 64}, "parallel": {"dp": 4, "sp": True,
                                                                       "global_batch": 512}}
CASES: dict[str, tuple[str, dict[str, dict[str, Any]], bool]] = {
    # name: (example, changed keys per table, folded)
    "gpt3-1024": (GPT3, {}, True),
    "gpt3-512-h100-sp": (GPT3, H100, True),
    "gpt3-512-h100-overlap": (GPT3, {**H100, "parallel": {**H100["parallel"],
                                                          "tp_comm_overlap": True}}, True),
    "gpt3-overlap-selective-vpp": (GPT3, {"parallel": {
        "sp": True, "tp_comm_overlap": True, "recompute": "selective", "pp": 8, "vp": 2,
        "schedule": "interleaved", "dp": 16, "overlap_grad_reduce": True}}, True),
    "gpt3-overlap-norecompute-zero1-pg": (GPT3, {"parallel": {
        "sp": True, "tp_comm_overlap": True, "recompute": "none", "zero": 1,
        "overlap_param_gather": True, "overlap_grad_reduce": True}}, True),
    "gpt3-zero3": (GPT3, {"parallel": {"zero": 3, "sp": True}}, True),
    "llama3-70b": ("llama3-70b-h100.toml", {}, True),
    "llama3-70b-overlap-allgather": ("llama3-70b-h100.toml", {"parallel": {
        "tp_comm_overlap": True, "cp_comm": "all_gather"}}, True),
    "llama3-8b-128k": ("llama3-8b-128k-h100.toml", {}, True),
    "llama-7b-zero3": ("llama-7b-zero3-64-h100.toml", {}, True),
    "deepseek-v3": ("deepseek-v3-1024-h100.toml", {}, True),
    "deepseek-v3-tp2-sp": ("deepseek-v3-1024-h100.toml", {"parallel": {
        "tp": 2, "dp": 32, "ep": 32, "sp": True}}, True),
    "gpt-6.7b-tpu": ("gpt-6.7b-tpu-v4-torus.toml", {}, True),
    "gpt-tiny-unfolded": ("gpt-tiny-localhost.toml", {}, False),
    "gpt-tiny-2rank-unfolded": ("gpt-tiny-2rank-localhost.toml", {}, False),
    "llama3-405b": ("llama3-405b-16k-h100-goodput.toml", {}, True),
}


def config(example: str, change: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = load_toml(example_path(example))
    for table, keys in change.items():
        data[table] = {**data[table], **keys}
    return data


def plan_lines(name: str) -> tuple[Iterator[str], float, float, int]:
    """The case's ops as lines (rank, index, repr), the build's wall and CPU seconds and its
    op count."""
    example, change, folded = CASES[name]
    exp = experiment_from_dict(config(example, change), name=name)
    ranks = exp.layout.representatives() if folded else None
    t0, c0 = time.perf_counter(), time.process_time()
    plan = build(exp.model, exp.layout, ranks=ranks)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    lines = (f"{rank} {i} {op!r}\n" for rank in plan.ranks for i, op in enumerate(plan.ops[rank]))
    return lines, seconds, cpu, plan.num_ops()


def dump(folder: Path, only: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in only or CASES:
        lines, seconds, _, ops = plan_lines(name)
        digest = hashlib.sha256()
        with gzip.open(folder / f"{name}.ops.gz", "wt", compresslevel=1) as f:
            for line in lines:
                digest.update(line.encode())
                f.write(line)
        print(f"{name}: {ops:,} ops, built in {seconds:.2f} s, sha256 {digest.hexdigest()[:16]}")


def compare(before: Path, after: Path) -> int:
    bad = 0
    for path in sorted(before.glob("*.ops.gz")):
        other = after / path.name
        if not other.exists():
            print(f"{path.name}: missing in {after}")
            bad += 1
            continue
        with gzip.open(path, "rt") as a, gzip.open(other, "rt") as b:
            n = 0
            for n, (x, y) in enumerate(zip(a, b, strict=False), 1):
                if x != y:
                    print(f"{path.name}: op line {n} differs\n  before {x}  after  {y}")
                    bad += 1
                    break
            else:
                rest_a, rest_b = a.read(1), b.read(1)
                if rest_a or rest_b:
                    print(f"{path.name}: lengths differ after {n} lines")
                    bad += 1
                else:
                    print(f"{path.name}: {n:,} ops identical")
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    if args.compare:
        sys.exit(1 if compare(*args.folders) else 0)
    dump(args.folders[0], args.only)


if __name__ == "__main__":
    main()
