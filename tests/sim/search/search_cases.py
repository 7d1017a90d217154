"""Shared search configs for the `parasim search` tests: a 1.3B GPT on 16 A100s (two nodes)."""

from __future__ import annotations

import copy
from typing import Any

SMALL_TOML = """
[model]
layers = 24
hidden = 2048
heads = 16
seq_len = 2048
vocab = 51200

[parallel]
global_batch = 16

[search]
tp = [1, 2, 4, 8]
pp = [1, 2, 4]
vp = [1]
micro_batch = [1, 2]
zero = [0, 1, 3]
sp = [false]
recompute = ["none", "full"]
schedule = ["1f1b"]

[cluster]
preset = "dgx-a100"
nodes = 2
gpu_memory = "16GiB"     # so that some layouts do not fit
"""

SMALL: dict[str, Any] = {
    "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 51200},
    "parallel": {"global_batch": 16},
    "search": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "vp": [1], "micro_batch": [1, 2],
               "zero": [0, 1, 3], "sp": [False], "recompute": ["none", "full"],
               "schedule": ["1f1b"]},
    "cluster": {"preset": "dgx-a100", "nodes": 2, "gpu_memory": "16GiB"},
}
"""The same config as a parsed table."""


def small(**search: Any) -> dict[str, Any]:
    """SMALL with some [search] lists replaced."""
    data = copy.deepcopy(SMALL)
    data["search"].update(search)
    return data


TPU: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 256, "vocab": 1024},
    "parallel": {"global_batch": 8},
    "search": {"tp": [1, 2, 4], "pp": [1, 2], "vp": [1], "micro_batch": [1], "zero": [0, 1],
               "sp": [False], "recompute": ["none"], "schedule": ["1f1b"]},
    "cluster": {"preset": "tpu-v4", "dims": [2, 2, 2]},
}
"""A tiny GPT on 8 TPU v4 chips (a 2 x 2 x 2 torus): 12 candidates, all valid, all fit."""
