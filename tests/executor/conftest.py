"""Executor tests: one torch thread in the test process too (the CI box has 2 cores, and
OpenMP threads spinning against the ranks' processes slow everything down)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    torch.set_num_threads(1)
