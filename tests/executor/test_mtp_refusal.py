"""The executor runs no multi-token prediction: `check_supported` refuses it in one line."""

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
