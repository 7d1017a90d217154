"""Executor tests: one torch thread in the test process too (the CI box has 2 cores, and
OpenMP threads spinning against the ranks' processes slow everything down).

torch is optional: the modules that need it skip themselves with `pytest.importorskip`, and
the rest (the consistency checks on plain traces) run without it."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
