"""The executor runs no multi-token prediction and no GEMM per expert: `check_supported`
refuses each in one line (sigmoid and bias routing it runs: tests/executor/test_deepep_run.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor.options import check_supported  # noqa: E402
from traces.errors import ConfigError  # noqa: E402
from traces.layout import Layout  # noqa: E402
from traces.model import ModelSpec  # noqa: E402


def test_mtp_layers_are_refused_in_one_line_and_zero_runs():
    model = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, mtp_layers=1)
    with pytest.raises(ConfigError) as info:
        check_supported(model, Layout(global_batch=1))
    assert str(info.value) == ("model.mtp_layers: 1: multi-token prediction is simulated, "
                               "not run by the executor; use 0 to run")
    check_supported(ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128),
                    Layout(global_batch=1))


@pytest.mark.parametrize(("fields", "needle"), [
    ({"moe_grouped_gemm": False}, "model.moe_grouped_gemm: false"),
])
def test_moe_kernel_keys_the_executor_does_not_run_are_refused(fields, needle):
    """A GEMM per expert is simulated only; the fusion keys change only costs, so the
    executor runs them."""
    moe = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, experts=4, top_k=2,
               bias=False)
    with pytest.raises(ConfigError, match=needle):
        check_supported(ModelSpec(**moe, **fields), Layout(global_batch=1))
    check_supported(ModelSpec(**moe, moe_permute_fusion=False, moe_router_fusion=False),
                    Layout(global_batch=1))
