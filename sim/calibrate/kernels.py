"""Fitting the compute model's parameters from compute samples, with `sim.models.compute`'s own
formula as the model: t = (C^p + I^p + M^p)^(1/p) + launches · overhead, C the GEMM work over
the achieved FLOP rate, M the bytes over the achieved memory rate, I the random draws' integer
time (known: the accelerator's figure, not fitted). Fitted per kernel class by
`scipy.optimize.least_squares` on relative residuals; a figure the data do not pin down carries
the reason (`KernelEstimate.rate_unidentified`, ...) and keeps the base profile's value.

The method in full: docs/calibration.md ("Kernels").
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

import numpy as np
from scipy import optimize

from sim.calibrate.observe import ComputeSample
from sim.models.compute import draw_seconds
from sim.profile import Profile
from topology.cluster import Accelerator
from traces.errors import ConfigError
from traces.fields import MAX_BANDWIDTH_BPS, MAX_TFLOPS, MIN_BANDWIDTH_BPS, MIN_TFLOPS

MIN_OVERHEAD_S = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEstimate:
    name: str
    flops_rate: float | None
    """Achieved FLOP/s (kernels with FLOPs)."""
    memory_rate: float | None
    """Achieved bytes/s (kernels without FLOPs; the others share the common rate)."""
    overhead_s: float
    rel_ci: float
    """95% half-width of the kernel's rate, relative (0.02: ±2%; inf: no interval)."""
    samples: int
    rms_error: float
    rate_unidentified: str | None = None
    """Why the data do not pin the rate down (None: they do). A kernel whose time is all
    overhead at every shape measured says nothing about its rate: the fit sends it to its
    bound, or leaves it free."""
    overhead_unidentified: str | None = None
    """Why the data do not pin the overhead down (None: they do)."""

    @property
    def identified(self) -> bool:
        return self.rate_unidentified is None

    @property
    def sets_roof(self) -> bool:
        """Pinned down well enough to be a measured roof: identified, within ±50%."""
        return self.identified and self.rel_ci < IDENTIFIED_REL_CI


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeFit:
    kernels: tuple[KernelEstimate, ...]
    memory_rate: float
    """The common achieved bytes/s of kernels with FLOPs."""
    exponent: float
    rms_error: float
    distinct: int
    """Distinct (kernel, phase, shape) points fitted."""
    num_parameters: int = 0
    memory_rate_unidentified: str | None = None
    exponent_unidentified: str | None = None


IDENTIFIED_REL_CI = 0.5
"""Below this 95% half-width (±50%) a rate may set a measured roof (`sim.calibrate.fit`)."""
BOUND_MARGIN = 0.01
"""A figure within 1% of a bound of its search (in log terms) went there because its term
never mattered: the bound, not the data, set it."""


def gemm_work(gemm: tuple[int, ...], backward: bool, tiles: Sequence[tuple[int, int]],
              units: int) -> float:
    """FLOPs the tile and wave model charges a GEMM op (`ComputeModel.gemm_time` times the
    per-unit rate): for each product, the best tile's waves · units · 2·tm·tn·K."""
    batch, m, n, k = gemm
    shapes = [(batch, m, k, n), (batch, k, n, m)] if backward else [(batch, m, n, k)]
    work = 0.0
    for b, mm, nn, kk in shapes:
        work += min(ceil(b * ceil(mm / tm) * ceil(nn / tn) / units) * 2.0 * tm * tn * kk
                    for tm, tn in tiles) * units
    return work


@dataclass(frozen=True, slots=True)
class _Point:
    name: str
    work: float
    bytes: float
    launches: int
    seconds: float
    count: int
    draws: float = 0.0


def _points(samples: Sequence[ComputeSample], tiles: Sequence[tuple[int, int]],
            units: int) -> list[_Point]:
    grouped: dict[tuple[object, ...], list[ComputeSample]] = defaultdict(list)
    for s in samples:
        grouped[s.key].append(s)
    points = []
    for group in grouped.values():
        s = group[0]
        seconds = statistics.fmean(x.seconds for x in group)
        if seconds <= 0:
            continue
        if s.gemm:
            work, launches = gemm_work(s.gemm, s.backward, tiles, units), 1 + s.backward
        else:
            work, launches = s.flops, 1
        points.append(_Point(s.name, work, s.mem_bytes, launches, seconds, len(group), s.draws))
    return sorted(points, key=lambda p: (p.name, p.work, p.bytes, p.launches, p.draws))


class _Model:
    """The kernel-time formula over parameter vector x (logs of rates and overheads, then p)."""

    def __init__(self, points: list[_Point], accelerator: Accelerator) -> None:
        self.points = points
        self.names = sorted({p.name for p in points})
        self.flops_kernels = [n for n in self.names
                              if any(p.work > 0 for p in points if p.name == n)]
        self.memory_kernels = [n for n in self.names if n not in self.flops_kernels]
        index = {n: i for i, n in enumerate(self.names)}
        self.kernel = np.array([index[p.name] for p in points])
        self.work = np.array([p.work for p in points])
        self.bytes = np.array([p.bytes for p in points])
        self.launches = np.array([p.launches for p in points], dtype=float)
        # the draws' integer seconds: known, not fitted
        self.integer = np.array([draw_seconds(p.draws, accelerator) for p in points])
        self.log_t = np.log([p.seconds for p in points])
        # x = [log R per flops kernel] + [log Rm per memory kernel] + [log Rm common]
        #     + [log overhead per kernel] + [p]
        nf, nm, nk = len(self.flops_kernels), len(self.memory_kernels), len(self.names)
        self.nf, self.nm, self.nk = nf, nm, nk
        rate_slot = {n: i for i, n in enumerate(self.flops_kernels)}
        mem_slot = {n: i for i, n in enumerate(self.memory_kernels)}
        self.rate_of = np.array([rate_slot.get(n, -1) for n in self.names])
        self.mem_of = np.array([mem_slot.get(n, nm) for n in self.names])
        """Index among the memory rates (x[nf:nf + nm + 1]); nm is the common rate."""
        # Where two or more of C, I and M are above 0 the p-norm applies. Rates are finite
        # and above 0 inside the bounds, so C > 0 exactly where the kernel has a FLOP rate
        # and work, M > 0 where it moves bytes: which points these are does not depend on x.
        self.mixed = ((self.work > 0) & (self.rate_of[self.kernel] >= 0)).astype(int) \
            + (self.integer > 0) + (self.bytes > 0) >= 2
        self.x0 = np.concatenate([
            np.full(nf, math.log(accelerator.sustained_flops * 0.5)),
            np.full(nm + 1, math.log(accelerator.sustained_hbm_Bps * 0.5)),
            np.log(np.maximum(self._overhead_guess(), MIN_OVERHEAD_S)),
            [2.0]])

    def _overhead_guess(self) -> np.ndarray:
        """Half the kernel's shortest time: a start the trust region refines."""
        out = np.full(self.nk, 1e-5)
        for i, name in enumerate(self.names):
            times = [p.seconds / p.launches for p in self.points if p.name == name]
            out[i] = 0.5 * min(times)
        return out

    def _terms(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """At x, per point: C, M, C^p, I^p, M^p, (C^p + I^p + M^p)^(1/p) (C + I + M where
        only one of them is above 0) and launches · overhead."""
        rates = np.exp(x[:self.nf])
        mems = np.exp(x[self.nf:self.nf + self.nm + 1])
        overhead = np.exp(x[self.nf + self.nm + 1:self.nf + self.nm + 1 + self.nk])
        p = x[-1]
        k = self.kernel
        rate_index = self.rate_of[k]
        # C only where the kernel has a FLOP rate (none at all: a fit of memory-bound
        # kernels only, whose `rates` is empty)
        flops = rate_index >= 0
        compute = np.zeros(len(self.work))
        compute[flops] = self.work[flops] / rates[rate_index[flops]]
        memory = self.bytes / mems[self.mem_of[k]]
        cp, mp = np.power(compute, p), np.power(memory, p)
        ip = np.power(self.integer, p)
        both = np.where(self.mixed, (cp + ip + mp) ** (1.0 / p), compute + self.integer + memory)
        return compute, memory, cp, ip, mp, both, self.launches * overhead[k]

    def unused(self) -> dict[int, str]:
        """The shared slots no point's time depends on, whatever the data, and why: the
        common memory rate without a kernel with FLOPs, the exponent without a point where
        the p-norm applies. The data say nothing about them (they are no parameters of
        this fit: a fit of one memory-bound class is its rate and overhead alone)."""
        out = {}
        if self.nf == 0:
            out[self.nf + self.nm] = "no kernel with FLOPs measured (it is theirs)"
        if not self.mixed.any():
            out[len(self.x0) - 1] = ("no kernel measured with two of GEMM work, random draws "
                                     "and bytes (it combines them)")
        return out

    def log_times(self, x: np.ndarray) -> np.ndarray:
        *_, both, spent = self._terms(x)
        return np.log(both + spent)

    def residuals(self, x: np.ndarray) -> np.ndarray:
        return self.log_times(x) - self.log_t

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        """∂residuals/∂x, points by parameters (derived in docs/calibration.md, "Kernels")."""
        compute, memory, cp, ip, mp, both, spent = self._terms(x)
        p, t = x[-1], both + spent
        mixed = self.mixed  # B = S^(1/p); elsewhere B = C + I + M
        s = cp + ip + mp
        live = mixed & (s > 0)  # S 0: B underflowed to 0, flat in the rates and p
        safe_s = np.where(live, s, 1.0)
        wc, wm, wi = (np.where(live, v / safe_s, 0.0) for v in (cp, mp, ip))

        def log(v: np.ndarray) -> np.ndarray:  # log of the live terms above 0 (others 0)
            return np.log(np.where(live & (v > 0), v, 1.0))

        d_compute = np.where(mixed, both * wc, compute)  # ∂B/∂log C
        d_memory = np.where(mixed, both * wm, memory)
        d_p = np.where(live, both / p * (wc * log(compute) + wi * log(self.integer)
                                         + wm * log(memory) - np.log(safe_s) / p), 0.0)
        nf, nm, k = self.nf, self.nm, self.kernel
        rows, rate = np.arange(len(t)), self.rate_of[k]
        jac = np.zeros((len(t), len(x)))
        flops = rate >= 0
        jac[rows[flops], rate[flops]] = -d_compute[flops] / t[flops]
        jac[rows, nf + self.mem_of[k]] = -d_memory / t
        jac[rows, nf + nm + 1 + k] = spent / t
        jac[:, -1] = d_p / t
        return jac

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Rates within what parasim accepts as physical, overheads above a nanosecond."""
        nf, nm, n = self.nf, self.nm, self.nf + self.nm + 1 + self.nk
        lower = np.concatenate([np.full(n, math.log(MIN_OVERHEAD_S)), [1.0]])
        upper = np.concatenate([np.full(n, math.log(1.0)), [64.0]])
        lower[:nf], upper[:nf] = math.log(MIN_TFLOPS * 1e12), math.log(MAX_TFLOPS * 1e12)
        lower[nf:nf + nm + 1] = math.log(MIN_BANDWIDTH_BPS)
        upper[nf:nf + nm + 1] = math.log(MAX_BANDWIDTH_BPS)
        return lower, upper


def fit_compute(samples: Sequence[ComputeSample], accelerator: Accelerator,
                tiles: Sequence[tuple[int, int]], base: Profile | None = None) -> ComputeFit:
    """Fit the compute model to the samples (see the module docstring). Parameters the data
    do not pin down are held at `base`'s values (its rates on its roofs, else the
    accelerator's) and the others fitted again beside them, so that the figures written
    agree with each other (an overhead fitted beside an unbounded rate is not the overhead
    beside the base's rate)."""
    points = _points(samples, tiles, accelerator.compute_units)
    if not points:
        raise ConfigError("calibrate: the traces hold no timed compute kernels to fit")
    model = _Model(points, accelerator)
    lower, upper = model.bounds()
    # Slots no point depends on are no unknowns: they stay at the start (or the base's).
    unused = model.unused()
    start = np.clip(model.x0, lower, upper)
    x, resid, ci = _solve(model, lower, upper, {slot: start[slot] for slot in unused})
    m = len(x)
    unknown = [slot for slot in range(m) if slot not in unused]
    reasons = {**unused, **_reasons(model, x, ci, lower, upper, unknown)}
    if reasons and base is not None:
        held = {slot: _base_value(model, slot, base, accelerator, lower, upper)
                for slot in reasons}
        rest = [slot for slot in unknown if slot not in held]
        if rest and any(slot not in unused for slot in held):
            x, resid, ci = _solve(model, lower, upper, held)
            reasons = {**{s: reasons[s] for s in held},
                       **_reasons(model, x, ci, lower, upper, rest)}
        else:  # nothing (else) to fit again: the base's figures, and how far they are off
            x = x.copy()
            for slot, value in held.items():
                x[slot] = value
            resid = model.residuals(x)
    why = reasons.get

    kernels = []
    nf, nm = model.nf, model.nm
    for i, name in enumerate(model.names):
        mine = resid[model.kernel == i]
        has_flops = model.rate_of[i] >= 0
        slot = model.rate_of[i] if has_flops else nf + model.mem_of[i]
        over = nf + nm + 1 + i
        kernels.append(KernelEstimate(
            name=name,
            flops_rate=float(math.exp(x[slot])) if has_flops else None,
            memory_rate=None if has_flops else float(math.exp(x[slot])),
            overhead_s=float(math.exp(x[over])),
            rel_ci=float(ci[slot]), samples=int(mine.size),
            rate_unidentified=why(slot), overhead_unidentified=why(over),
            rms_error=float(math.sqrt(np.mean(np.expm1(mine) ** 2)))))
    memory = nf + nm
    return ComputeFit(kernels=tuple(kernels), memory_rate=float(math.exp(x[memory])),
                      exponent=float(x[-1]),
                      rms_error=float(math.sqrt(np.mean(np.expm1(resid) ** 2))),
                      distinct=len(points), num_parameters=m,
                      memory_rate_unidentified=why(memory),
                      exponent_unidentified=why(m - 1))


def _solve(model: _Model, lower: np.ndarray, upper: np.ndarray, held: dict[int, float]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, the residuals and the half-widths (0 for held parameters), `held` fixed.

    Held parameters are no unknowns of the solve: the solver sees the others alone. (Held
    by a bound pair 1e-10 wide instead, each of them cut every trust-region step short in
    its scaling, and a fit that converges in tens of steps without them crept on to the
    cap: 2000 steps, 100 times the time, stopped short of the optimum.)"""
    free = np.array([s for s in range(len(model.x0)) if s not in held], dtype=int)
    fixed = model.x0.copy()
    for slot, value in held.items():
        fixed[slot] = value

    def full(z: np.ndarray) -> np.ndarray:
        x = fixed.copy()
        x[free] = z
        return x

    def jacobian(z: np.ndarray) -> np.ndarray:
        # the free columns in the Jacobian's own (row-major) order: the solver's SVD rounds
        # a column-major copy differently, and a direction the data leave free (below)
        # carries a last bit's difference a long way
        return np.ascontiguousarray(model.jacobian(full(z))[:, free])

    lo, hi = lower[free], upper[free]
    z0 = np.clip(model.x0[free], lo + 1e-11, hi - 1e-11)
    # A well-posed fit converges in tens of steps. One the data leave free in some direction
    # (p, a rate no shape feels) creeps along it towards a bound without end: the cap stops
    # it there, the figures it holds unidentified either way (the second solve starts anew).
    solved = optimize.least_squares(lambda z: model.residuals(full(z)), z0, jac=jacobian,
                                    bounds=(lo, hi), loss="soft_l1", f_scale=0.05,
                                    x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12,
                                    max_nfev=2000)
    x = full(solved.x)
    resid = model.residuals(x)
    ci = np.zeros(len(x))
    ci[free] = _half_widths(solved.jac, resid)
    return x, resid, ci


def _reasons(model: _Model, x: np.ndarray, ci: np.ndarray, lower: np.ndarray,
             upper: np.ndarray, unknown: list[int]) -> dict[int, str]:
    """Why each parameter of `unknown` is not identified (absent: it is)."""
    n = len(model.points)
    short = (f"{n} distinct shapes measured for {len(unknown)} parameters (an interval needs "
             "more points than parameters)") if n <= len(unknown) else None
    nf, nm = model.nf, model.nm
    counts = np.bincount(model.kernel, minlength=model.nk)
    out: dict[int, str] = {}
    for slot in unknown:
        lo, hi = lower[slot], upper[slot]
        if slot < nf + nm + 1:
            unit, scale = ("TFLOP/s", 1e12) if slot < nf else ("GB/s", 1e9)
            what = f"{math.exp(lo) / scale:g} to {math.exp(hi) / scale:g} {unit}"
        elif slot < len(x) - 1:
            what = "1 ns to 1 s"
        else:
            what = f"{lo:g} to {hi:g}"
        kernel = _kernel_of(model, slot)
        if short:
            out[slot] = short
        elif kernel is not None and int(counts[kernel]) < 3:
            count = int(counts[kernel])
            out[slot] = (f"{count} distinct shape{'s' * (count != 1)} of "
                         f"{model.names[kernel]} measured for its 2 parameters (rate and "
                         "overhead)")
        elif x[slot] <= lo + BOUND_MARGIN:
            out[slot] = f"at the lower bound of its search ({what})"
        elif x[slot] >= hi - BOUND_MARGIN:
            out[slot] = f"at the upper bound of its search ({what})"
        elif not math.isfinite(ci[slot]):
            out[slot] = "the data do not constrain it (no interval)"
        elif 2 * ci[slot] >= hi - lo:
            out[slot] = f"its 95% interval is wider than its whole search ({what})"
    return out


def _kernel_of(model: _Model, slot: int) -> int | None:
    """The kernel whose own parameter `slot` is (None: a shared one)."""
    nf, nm = model.nf, model.nm
    if slot < nf:
        return model.names.index(model.flops_kernels[slot])
    if slot < nf + nm:
        return model.names.index(model.memory_kernels[slot - nf])
    if nf + nm + 1 <= slot < nf + nm + 1 + model.nk:
        return slot - (nf + nm + 1)
    return None


def _base_value(model: _Model, slot: int, base: Profile, accelerator: Accelerator,
                lower: np.ndarray, upper: np.ndarray) -> float:
    """Parameter `slot` as `base` has it (log rates on base's roofs, else the accelerator's;
    log overheads; the exponent), inside the search."""
    nf, nm, c = model.nf, model.nm, base.compute
    roofs = base.accelerator
    peak = roofs.peak_flops if roofs else accelerator.sustained_flops
    hbm = roofs.hbm_bandwidth_Bps if roofs else accelerator.sustained_hbm_Bps
    if slot < nf:
        eff = base.kernel(model.flops_kernels[slot]).flops_efficiency or c.gemm_efficiency
        value = math.log(eff * peak)
    elif slot < nf + nm:
        eff = base.kernel(model.memory_kernels[slot - nf]).memory_efficiency \
            or c.memory_efficiency
        value = math.log(eff * hbm)
    elif slot == nf + nm:
        value = math.log(c.memory_efficiency * hbm)
    elif slot < len(model.x0) - 1:
        overhead = base.kernel(model.names[slot - (nf + nm + 1)]).overhead_s
        value = math.log(max(overhead if overhead is not None else c.launch_overhead_s,
                             MIN_OVERHEAD_S))
    else:
        value = c.roofline_exponent
    return float(min(max(value, lower[slot]), upper[slot] - 1e-10))


def _half_widths(jac: np.ndarray, resid: np.ndarray) -> np.ndarray:
    """95% half-widths of the parameters (of log-figures: ≈ relative half-widths), inf for
    a parameter the data leave free: too few points, or a direction of the parameter space
    the residuals do not see (a zero singular value of the Jacobian)."""
    n, p = jac.shape
    if n <= p:
        return np.full(p, math.inf)
    variance = float(resid @ resid) / (n - p)
    _, s, vt = np.linalg.svd(jac, full_matrices=False)
    null = s <= (s.max() if s.size else 0.0) * 1e-10
    inverse = np.where(null, 0.0, 1.0 / np.where(null, 1.0, s) ** 2)
    var = (vt.T ** 2) @ inverse * variance
    half = 1.96 * np.sqrt(np.maximum(var, 0.0))
    free = (vt[null].T ** 2).sum(axis=1) > 1e-6 if null.any() else np.zeros(p, dtype=bool)
    half[free] = math.inf
    return half
