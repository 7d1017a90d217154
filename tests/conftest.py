"""Shared fixtures: small clusters, and timing one collective with either path."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.collectives import Collectives, analytic_time
from sim.collectives.sweep import flow_time
from topology import build_cluster
from topology.cluster import Cluster
from traces.ops import OpKind


@pytest.fixture(scope="session")
def h100() -> Cluster:
    """One DGX H100: 8 GPUs on NVSwitch."""
    return build_cluster("dgx-h100", nodes=1)


@pytest.fixture(scope="session")
def h100_rail4() -> Cluster:
    """Four DGX H100 on a rail-optimized fabric."""
    return build_cluster("dgx-h100", nodes=4, fabric="rail")


@pytest.fixture(scope="session")
def tpu() -> Cluster:
    """A 4x4x4 TPU-v4-like torus."""
    return build_cluster("tpu-v4")


def timed(cluster: Cluster, kind: OpKind, group: tuple[int, ...], size: float, algo: str,
          channels: int | None = None, model: str = "flow") -> float:
    """Seconds for one collective alone on `cluster`."""
    lowering = Collectives(cluster).lowering(kind, group, algo, channels)
    assert lowering is not None, f"{algo} does not apply"
    return (flow_time if model == "flow" else analytic_time)(cluster, lowering, size)


@pytest.fixture
def write(tmp_path):
    """Write a config (or any file, text or bytes) into the test's folder; its path."""
    def write(text: str | bytes, name: str = "c.toml") -> Path:
        path = tmp_path / name
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        return path
    return write
