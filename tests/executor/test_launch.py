"""Starting and ending worlds: bad sizes are refused up front, Ctrl-C ends every rank, and a
world that torchrun starts is joined (a failing rank there is named in one line and writes
the trace it recorded, marked incomplete)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.launch import spawn
from tests.child import sigint_default
from tests.executor.workers import Case, hang
from traces.chrome import event_name
from traces.errors import ConfigError
from traces.io import load
from traces.plan import build

ROOT = Path(__file__).resolve().parents[2]


def test_a_local_world_is_one_to_eight_ranks() -> None:
    for size in (0, 9):
        with pytest.raises(ConfigError, match=f"world size {size}: a local run spawns 1 to 8"):
            spawn(hang, size)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose: look at its state.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_ends_every_rank(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        from executor.launch import spawn
        from tests.executor.workers import hang
        if __name__ == "__main__":
            spawn(hang, 2, ({str(pid_file)!r},), timeout_s=60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=sigint_default)
    pids_files = [Path(f"{pid_file}.{r}") for r in range(2)]
    deadline = time.monotonic() + 30
    while not all(p.exists() and p.read_text() for p in pids_files):
        assert time.monotonic() < deadline and proc.poll() is None, "ranks did not start"
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in pids_files]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=15)
    assert proc.returncode != 0
    _, stderr = proc.communicate()
    assert b"KeyboardInterrupt" in stderr
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.slow
def test_join_a_torchrun_world_and_name_a_failing_rank(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from executor.torchrun import join

        def job(ctx):
            total = torch.ones(1) * (ctx.rank + 1)
            dist.all_reduce(total)
            print(f"rank {ctx.rank} of {ctx.world_size} on {ctx.backend}: {int(total)}",
                  flush=True)
            ctx.running(4)
            if ctx.rank == 1:
                raise RuntimeError("injected")

        if __name__ == "__main__":
            join(job, timeout_s=15)
    """))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert "rank 0 of 2 on gloo: 3" in proc.stdout and "rank 1 of 2 on gloo: 3" in proc.stdout
    assert "parasim: error: rank 1 failed in op 4: RuntimeError: injected" in proc.stderr


@pytest.mark.slow
def test_a_failing_rank_under_torchrun_writes_its_partial_trace(tmp_path: Path) -> None:
    model, layout = Case(dict(dp=2, global_batch=4)).specs()
    plan = build(model, layout)
    fail_at = len(plan.ops[1]) // 2
    out = tmp_path / "out"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        from executor.run import run
        from tests.executor.workers import OPTIONS, Case

        if __name__ == "__main__":
            run(Case(dict(dp=2, global_batch=4)).specs(), {str(out)!r}, steps=1, warmup=0,
                timeout=15, options=OPTIONS, fault=(1, {fail_at}))
    """))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    line = (f"parasim: error: rank 1 failed in op {fail_at} ({event_name(plan.ops[1][fail_at])})"
            f": ValueError: injected fault (partial trace, marked incomplete: {out}/rank1.json)")
    assert line in proc.stderr.splitlines(), proc.stderr
    trace = load(out / "rank1.json")
    assert trace.ranks == [1] and trace.meta.complete is False
    assert trace.meta.error == line.removeprefix("parasim: error: ").split(" (partial")[0]
    assert trace.meta.world == 2 and trace.meta.backend == "gloo"
    timed = [op.end is not None for op in trace.ops[1]]
    assert timed == [True] * fail_at + [False] * (len(timed) - fail_at)
