"""The figures of `tests/gpu/device_check.sh`, in three subcommands:

    python tests/gpu/device_figures.py env --device cuda OUT/env.json
    python tests/gpu/device_figures.py bench --device cuda OUT/bench.json   # GEMMs by shape, HBM
    python tests/gpu/device_figures.py summary OUT                          # the JSON and text

`bench` times torch's own GEMMs (bf16 on CUDA, fp32 on the CPU) at the shapes of the check's job
(`JOB`: tokens x hidden into each projection) and at a square 8192 one, and a device-to-device
copy for the memory bandwidth (bytes read plus bytes written), with CUDA events or, on the CPU,
the wall clock. `summary` gathers every step's output (parasim's own --json objects, the gpu
tests' junit file) into OUT/device_check.json and OUT/device_check.txt; a step that failed or
timed out is recorded with its exit status and the last line it printed, never dropped.
"""

from __future__ import annotations

import argparse
import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

JOB = {"tokens": 4096, "hidden": 2048, "qkv": 3072, "ffn": 8192, "vocab": 128256}
"""The check's 1-GPU job (device_check.sh writes its TOML): 4,096 tokens a micro-batch, width
2,048, q + k + v of 32 + 2 x 8 heads of 64, a SwiGLU MLP of 8,192, Llama 3's vocabulary."""
CPU_SCALE = 16
"""On the CPU rehearsal every GEMM dimension is divided by this (seconds, not minutes)."""


def gemm_shapes(device: str) -> dict[str, tuple[int, int, int]]:
    """(m, k, n) of each timed GEMM: the job's projections and a square one."""
    t, h = JOB["tokens"], JOB["hidden"]
    shapes = {"qkv": (t, h, JOB["qkv"]), "proj": (t, h, h), "fc1": (t, h, 2 * JOB["ffn"]),
              "fc2": (t, JOB["ffn"], h), "logits": (t, h, JOB["vocab"]),
              "square8192": (8192, 8192, 8192)}
    if device == "cpu":
        shapes = {k: (m // CPU_SCALE, k_ // CPU_SCALE, n // CPU_SCALE)
                  for k, (m, k_, n) in shapes.items()}
    return shapes


def _timer(device: str, fn: Any, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls, after three unrecorded ones."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench(device: str) -> dict[str, Any]:
    """GEMM TFLOP/s by shape and the memory bandwidth of a copy (module docstring)."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gemms = []
    for name, (m, k, n) in gemm_shapes(device).items():
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        seconds = _timer(device, lambda a=a, b=b: torch.matmul(a, b), 10)
        gemms.append({"name": name, "m": m, "k": k, "n": n, "dtype": str(dtype)[6:],
                      "seconds": seconds, "tflops": 2 * m * k * n / seconds / 1e12})
        del a, b
    size = 2**31 if device == "cuda" else 2**26  # 2 GiB on the GPU, far beyond its caches
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _timer(device, lambda: dst.copy_(src), 10)
    return {"device": device, "gemm": gemms, "copy_bytes": size,
            "memory_bandwidth_GBps": 2 * size / seconds / 1e9}


def env(device: str) -> dict[str, Any]:
    """The machine: torch, CUDA, the device's name and memory."""
    import torch

    out: dict[str, Any] = {"device": device, "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out.update(name=props.name, memory_bytes=props.total_memory,
                   count=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return out


def _load(path: Path) -> Any:
    """A step's JSON output, or None where the step wrote none (failed, timed out)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tests(path: Path) -> dict[str, int] | None:
    """The gpu tests' counts from pytest's junit file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def _validation(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    keys = ("profile", "step_time_measured_s", "step_time_predicted_s", "step_error",
            "step_time_measured_spread_s", "op_abs_error", "mape_by_op_class",
            "peak_memory_measured_bytes", "peak_memory_predicted_bytes")
    return {k: data.get(k) for k in keys}


def _calibration(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict) or not isinstance(data.get("compute"), dict):
        return None
    compute = data["compute"]
    return {"memory_rate_GBps": compute["memory_rate_Bps"] / 1e9,
            "kernels": [{"name": k["name"],
                         "tflops": None if k["flops_rate"] is None else k["flops_rate"] / 1e12,
                         "memory_GBps": None if k["memory_rate_Bps"] is None
                         else k["memory_rate_Bps"] / 1e9,
                         "rate_identified": k["rate_identified"]}
                        for k in compute["kernels"]],
            "unidentified": data.get("unidentified", [])}


def summary(out: Path) -> dict[str, Any]:
    """Every step's figures (module docstring)."""
    steps = []
    for line in (out / "steps.tsv").read_text().splitlines() if (out / "steps.tsv").exists() \
            else []:
        name, rc, seconds = line.split("\t")
        err = (out / f"{name}.err").read_text(errors="replace").strip().splitlines() \
            if (out / f"{name}.err").exists() else []
        steps.append({"name": name, "rc": int(rc), "seconds": float(seconds),
                      "timed_out": int(rc) in (124, 137),
                      "last_error_line": err[-1] if err and int(rc) else None})
    run = _load(out / "run.out")
    simulate = _load(out / "simulate.out")
    return {
        "env": _load(out / "env.json"),
        "steps": steps,
        "ok": bool(steps) and all(s["rc"] == 0 for s in steps),
        "gpu_tests": _tests(out / "gpu_tests.xml"),
        "bench": _load(out / "bench.json"),
        "simulate": None if not isinstance(simulate, dict) else {
            k: simulate.get(k) for k in ("step_time_s", "mfu", "peak_memory_bytes", "fits")},
        "run": None if not isinstance(run, dict) else {
            k: run.get(k) for k in ("backend", "step_times_s", "step_time_s",
                                    "peak_memory_bytes")},
        "calibrate": _calibration(_load(out / "calibrate.out")),
        "validate": {"preset": _validation(_load(out / "validate_preset.out")),
                     "calibrated": _validation(_load(out / "validate_calibrated.out"))},
    }


def text(s: dict[str, Any]) -> str:
    """The summary for a person: one line a figure."""
    lines = [f"device check: {'ok' if s['ok'] else 'FAILED STEPS'}; env {s['env']}"]
    for step in s["steps"]:
        lines.append(f"  step {step['name']:<20} rc {step['rc']:>3}  {step['seconds']:7.1f} s"
                     + (f"  {step['last_error_line']}" if step["last_error_line"] else ""))
    lines.append(f"gpu tests: {s['gpu_tests']}")
    if s["bench"]:
        for g in s["bench"]["gemm"]:
            lines.append(f"  GEMM {g['name']:<11} {g['m']}x{g['k']}x{g['n']} {g['dtype']}: "
                         f"{g['tflops']:.3g} TFLOP/s")
        lines.append(f"  memory bandwidth (copy): {s['bench']['memory_bandwidth_GBps']:.0f} GB/s")
    if s["simulate"]:
        lines.append(f"simulate: {s['simulate']}")
    if s["run"]:
        lines.append(f"run: {s['run']}")
    if s["calibrate"]:
        lines.append(f"calibrate: memory {s['calibrate']['memory_rate_GBps']:.0f} GB/s; "
                     + ", ".join(f"{k['name']} {k['tflops']:.3g} TFLOP/s"
                                 for k in s["calibrate"]["kernels"] if k["tflops"]))
    for which, v in s["validate"].items():
        if v:
            lines.append(f"validate vs {which} profile: step error {v['step_error']:+.1%} "
                         f"(measured {v['step_time_measured_s']:.4g} s, predicted "
                         f"{v['step_time_predicted_s']:.4g} s); per-op |error| "
                         f"{v['op_abs_error']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("env", "bench", "summary"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    if args.what == "summary":
        s = summary(args.path)
        (args.path / "device_check.json").write_text(json.dumps(s, indent=1) + "\n")
        (args.path / "device_check.txt").write_text(text(s))
        return
    data = env(args.device) if args.what == "env" else bench(args.device)
    args.path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
