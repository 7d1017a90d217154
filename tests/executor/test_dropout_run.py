"""The executor and `model.dropout`: it draws dropout only when asked, and a plan it runs
without dropout carries no draws (its recorded trace says what ran)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.options import RunOptions, as_run, check_supported
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build

GPT = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=64)


def test_the_executor_records_no_draws_where_it_drew_none():
    """The executor draws dropout only when asked (RunOptions.dropout); a plan it runs
    without carries no draws, so a calibration from its trace times none."""
    model = ModelSpec(**GPT, attention="unfused")
    plan = build(model, Layout(global_batch=1))
    ran = as_run(plan, RunOptions())
    assert any(op.draws for op in plan.ops[0]) and not any(op.draws for op in ran.ops[0])
    assert [op.name for op in ran.ops[0]] == [op.name for op in plan.ops[0]]
    assert as_run(plan, RunOptions(dropout=0.1)) is plan
    with pytest.raises(ConfigError, match=r"needs model\.dropout > 0"):
        check_supported(ModelSpec(**GPT, dropout=0.0), Layout(global_batch=1),
                        RunOptions(dropout=0.1))
