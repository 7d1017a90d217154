"""`parasim run` says which software stack the executor ran (eager PyTorch) where the config
states one (`[model] kernels`), and leaves a default run's summary as it was."""

from __future__ import annotations

import dataclasses

from sim.commands.run import ran_kernels, summary_text
from traces.model import ModelSpec

LLAMA = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, seq_len=2048, vocab=128256,
                  ffn="swiglu", ffn_hidden=14336, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)


def test_parasim_run_says_it_ran_eager_pytorch_where_a_stack_is_stated():
    class Exp:
        model = dataclasses.replace(LLAMA, kernels="compiled")

    said = ran_kernels(Exp)  # type: ignore[arg-type]
    assert said == {"kernels": "eager", "plan_kernels": "compiled"}
    Exp.model = LLAMA
    assert ran_kernels(Exp) == {}  # type: ignore[arg-type]  # a default run's summary as before
    text = summary_text({"experiment": "x", "world": 2, "backend": "gloo", "steps": 1,
                         "step_time_s": 1.0, "losses": [1.0], "peak_memory_bytes": {"0": 1},
                         "files": [], **said})
    assert text.endswith("kernels             eager PyTorch (the plan's: compiled)")
