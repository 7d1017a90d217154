"""The executor runs no per-op selective checkpointing: `check_supported` refuses it in one
line (the plan's partial GEMMs are simulated only)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor.options import check_supported  # noqa: E402
from traces.errors import ConfigError  # noqa: E402
from traces.layout import Layout  # noqa: E402
from traces.model import ModelSpec  # noqa: E402

MODEL = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128)


def test_selective_op_is_refused_in_one_line_and_the_others_run():
    with pytest.raises(ConfigError) as info:
        check_supported(MODEL, Layout(global_batch=1, recompute="selective_op"))
    assert str(info.value).startswith("parallel.recompute: 'selective_op'")
    assert "\n" not in str(info.value)
    for recompute in ("none", "selective", "full"):
        check_supported(MODEL, Layout(global_batch=1, recompute=recompute))
