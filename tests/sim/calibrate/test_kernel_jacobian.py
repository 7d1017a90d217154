"""The compute fit's analytic Jacobian (`_Model.jacobian`) is the derivative of its residuals:
a central finite difference agrees at random points of the search, over every kind of slot
(a GEMM's rate, a memory-bound kernel's rate, the common rate, the overheads, the exponent)
and both forms of the formula (C and M both > 0; one of them 0)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.calibrate.kernels import _Model, _Point
from topology import build_cluster

POINTS = [
    # GEMMs: work and bytes (the common rate) of like times at the rates drawn below, forward
    # (1 launch) and backward (2)
    *(_Point("fc1", w, b, launches, t, 1) for w, b, launches, t in (
        (2e9, 1e8, 1, 3e-2), (8e9, 2e8, 1, 1e-1), (4e9, 8e8, 2, 1e-1), (5e8, 1e7, 1, 9e-3))),
    *(_Point("qkv", w, b, launches, t, 1) for w, b, launches, t in (
        (6e9, 3e8, 1, 7e-2), (1.2e10, 1.2e9, 2, 2e-1), (3e9, 0.0, 1, 4e-2))),  # no bytes: C + M
    # memory-bound kernels: no work, their own rate
    *(_Point("gelu", 0.0, b, 1, t, 1) for b, t in ((1e6, 2e-4), (1e7, 1.1e-3), (4e7, 4e-3))),
    *(_Point("ln1", 0.0, b, 1, t, 1) for b, t in ((5e5, 9e-5), (5e6, 6e-4), (2e7, 2e-3))),
]

def central_difference(model: _Model, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    out = np.empty((len(model.points), len(x)))
    for j in range(len(x)):
        step = np.zeros_like(x)
        step[j] = h
        out[:, j] = (model.residuals(x + step) - model.residuals(x - step)) / (2 * h)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_analytic_jacobian_is_a_central_difference_of_the_residuals(seed):
    model = _Model(POINTS, build_cluster("localhost", gpus_per_node=2).accelerator)
    assert (model.nf, model.nm, model.nk) == (2, 2, 4)  # 2 + 2 + common + 4 + p: 10 slots
    lower, upper = model.bounds()
    rng = np.random.default_rng(seed)
    # Rates near 100 GFLOP/s and 10 GB/s (far from them one term is all of T and the other's
    # derivative is nil: nothing to check), overheads 1 µs to 10 ms, p to 16 (beyond, C^p
    # underflows at some of these times and the residuals go flat in it).
    x = np.concatenate([np.log(1e11) + rng.uniform(-1, 1, size=2),
                        np.log(1e10) + rng.uniform(-1, 1, size=3),
                        rng.uniform(np.log(1e-6), np.log(1e-2), size=4),
                        [rng.uniform(1.0, 16.0)]])
    assert np.all((lower < x) & (x < upper))
    jac = model.jacobian(x)
    fd = central_difference(model, x)
    assert jac.shape == (len(POINTS), 10)
    assert np.all(np.abs(jac).max(axis=0) > 1e-6)  # every slot is felt somewhere
    np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-9)


def test_points_with_c_or_m_zero_have_no_exponent_term():
    model = _Model(POINTS, build_cluster("localhost", gpus_per_node=2).accelerator)
    x = model.x0.copy()
    jac = model.jacobian(x)
    split = (model.work == 0) | (model.bytes == 0)
    assert split.sum() == 7
    assert np.all(np.isfinite(jac))
    assert np.all(jac[split, -1] == 0) and np.all(jac[~split, -1] != 0)
