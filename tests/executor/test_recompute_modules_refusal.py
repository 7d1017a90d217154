"""The executor runs no per-module recomputation and no FP8 activation cache:
`check_supported` refuses them in one line (simulated only)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor.options import check_supported  # noqa: E402
from traces.errors import ConfigError  # noqa: E402
from traces.layout import Layout  # noqa: E402
from traces.model import ModelSpec  # noqa: E402

MODEL = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128)


@pytest.mark.parametrize("parallel", [{"recompute": "selective",
                                       "recompute_modules": ["layernorm"]},
                                      {"recompute": "selective",
                                       "recompute_modules": ["mlp"]},
                                      {"fp8_activation_cache": True}])
def test_recompute_modules_and_the_fp8_cache_are_refused_in_one_line(parallel):
    with pytest.raises(ConfigError) as info:
        check_supported(MODEL, Layout(global_batch=1, **parallel))
    assert str(info.value).startswith("parallel.recompute_modules: ")
    assert "\n" not in str(info.value)
    check_supported(MODEL, Layout(global_batch=1, recompute="selective"))
