"""What `parasim search` prints: the ranked table, and the `--json` object.

The JSON holds every simulated candidate with its analytic estimate and rank, the pruning
counts, the Kendall tau and the rule of thumb; never wall times or the worker count, so the same
search gives byte-identical JSON on one worker, on many, or on Ray. The text adds the timings.
"""

from __future__ import annotations

from typing import Any

from sim.search.run import Ranked, SearchResult
from sim.search.space import MEMORY_REASON, describe

GiB = 2**30


def result_json(r: SearchResult) -> dict[str, Any]:
    """The `--json` object: headline first, then every simulated candidate in order."""
    pairs = r.top_k * (r.top_k - 1) // 2
    return {
        "search": r.name,
        "cluster": r.cluster,
        "world": r.world,
        "memory_capacity_bytes": r.memory_capacity_bytes,
        "candidates": r.num_candidates,
        "valid": len(r.feasible) + len(r.infeasible),
        "fit": len(r.feasible),
        "pruned": r.pruned,
        "top_k": r.top_k,
        "kendall_tau": r.kendall_tau,
        "discordant_pairs": r.discordant_pairs,
        "pairs": pairs,
        "best": _row(r.best, 1),
        "simulated": [_row(c, i + 1) for i, c in enumerate(r.simulated)],
        "rule_of_thumb": _rule_json(r),
    }


def _row(c: Ranked, rank: int) -> dict[str, Any]:
    s = c.simulated
    assert s is not None
    return {
        "rank": rank,
        "layout": c.layout.to_dict(),
        "summary": describe(c.layout),
        "step_time_s": s.step_time_s,
        "tokens_per_s": s.tokens_per_s,
        "model_tflops_per_gpu": s.model_tflops_per_gpu,
        "mfu": s.mfu,
        "peak_memory_bytes": s.peak_memory_bytes,
        "bubble_fraction": s.bubble_fraction,
        "exposed_comm_s": s.exposed_comm_s,
        "compute_s": s.compute_s,
        "fits": s.fits,
        "analytic_rank": c.analytic_rank,
        "analytic_step_time_s": c.estimate.step_time_s,
        "analytic_peak_memory_bytes": c.estimate.peak_memory_bytes,
    }


def _rule_json(r: SearchResult) -> dict[str, Any] | None:
    if r.rule is None:
        return None
    out = _row(r.rule, simulated_rank(r, r.rule))
    out["fits"] = r.rule_fits and out["fits"]
    out["slower_than_best"] = _des(r.rule) / r.best.simulated.step_time_s - 1  # type: ignore
    return out


def simulated_rank(r: SearchResult, c: Ranked) -> int:
    """Where `c`'s simulated time falls among the simulated top K (1 = the best)."""
    return 1 + sum(1 for s in r.simulated if _des(s) < _des(c) and s.layout != c.layout)


def _des(c: Ranked) -> float:
    assert c.simulated is not None
    return c.simulated.step_time_s


def result_text(r: SearchResult, *, timings: bool = True) -> str:
    """The human summary: space, pruning, timings, the ranked table, tau, the rule of thumb."""
    t = r.timings if timings else {}
    valid = len(r.feasible) + len(r.infeasible)
    lines = [
        f"parasim search: {r.name} on {r.cluster} ({r.world} {r.devices})",
        f"  space          {r.num_candidates:,} candidates: {valid:,} valid layouts, "
        f"{len(r.feasible):,} fit in {r.memory_capacity_bytes / GiB:.0f} GiB of {r.device} "
        "memory",
        f"  pruned         {r.num_candidates - len(r.feasible):,}:",
        *(f"    {count:>9,}  {_reason(r, reason)}" for reason, count in r.pruned.items()),
    ]
    shown = r.simulated + ([r.rule] if r.rule is not None else [])
    extra = differing_options(shown)
    width = max([len("layout"), *(len(layout_text(c, extra)) for c in shown)])
    if t:
        lines += [f"  screen         {r.num_candidates:,} candidates in {t['screen_s']:.1f} s "
                  f"({t['screen_cpu_s']:.1f} CPU s; analytic: closed-form bubble, alpha-beta "
                  "communication)",
                  f"  simulated      the best {r.top_k} (and the rule of thumb) in "
                  f"{t['simulate_s']:.1f} s ({t['simulate_cpu_s']:.1f} CPU s); "
                  f"{t['wall_s']:.1f} s in all on "
                  f"{t['workers']:g} worker{'s' if t['workers'] != 1 else ''}"]
    lines += ["", f"  {'#':>3}  {'layout':<{width}} {'step s':>7} {'tokens/s':>9} "
              f"{'MFU':>6} {'peak GiB':>8} {'bubble':>6} {'comm s':>7}  {'analytic s (#)':>15}"]
    lines += [_line(i + 1, c, extra, width) for i, c in enumerate(r.simulated)]
    if r.kendall_tau is not None:
        pairs = r.top_k * (r.top_k - 1) // 2
        lines += ["", f"  Kendall tau    {r.kendall_tau:.3f} between the analytic and the "
                  f"simulated order of the top {r.top_k} ({r.discordant_pairs} of {pairs} "
                  "pairs swapped by the simulation)"]
    lines.append(_rule_text(r, extra))
    return "\n".join(lines)


SHOWN_BY_DESCRIBE = frozenset({"tp", "cp", "pp", "dp", "cp_comm", "vp", "micro_batch", "zero",
                               "sp", "recompute", "schedule"})
"""Layout keys `space.describe` writes; any other that differs between the candidates
shown is written after it as key=value."""


def differing_options(shown: list[Ranked]) -> list[str]:
    """The layout keys `describe` leaves out whose values differ between `shown`, in the
    layout's own order (a search over overlap_grad_reduce or bucket_bytes lists them)."""
    dicts = [c.layout.to_dict() for c in shown]
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    return [k for k in keys if k not in SHOWN_BY_DESCRIBE
            and len({repr(d.get(k)) for d in dicts}) > 1]


def layout_text(c: Ranked, extra: list[str]) -> str:
    """`describe`, then each differing option: 'tp8 pp16 ... 1f1b overlap_grad_reduce=False'."""
    d = c.layout.to_dict()
    return " ".join([describe(c.layout), *(f"{k}={d.get(k, '-')}" for k in extra)])


def _reason(r: SearchResult, reason: str) -> str:
    """A pruning reason in the cluster's words (the JSON keeps the one key, its numbers
    blanked): the first candidate's own message, numbers and all, for the rules."""
    if reason == MEMORY_REASON:
        return f"memory: the peak per {r.device} exceeds the accelerator's memory"
    example = r.examples.get(reason)
    return f"e.g. {example}" if example else reason


def _line(rank: int | str, c: Ranked, extra: list[str], width: int) -> str:
    s = c.simulated
    assert s is not None
    analytic = f"{c.estimate.step_time_s:.3f} ({c.analytic_rank or '-'})"
    return (f"  {rank:>3}  {layout_text(c, extra):<{width}} {s.step_time_s:>7.3f} "
            f"{s.tokens_per_s:>9,.0f} {s.mfu:>6.1%} {s.peak_memory_bytes / GiB:>8.1f} "
            f"{s.bubble_fraction:>6.1%} {s.exposed_comm_s:>7.3f}  {analytic:>15}")


def _rule_text(r: SearchResult, extra: list[str]) -> str:
    if r.rule is None:
        return "  rule of thumb  yields no valid layout for this model and cluster"
    c = r.rule
    where = (f"analytic rank {c.analytic_rank:,} of {len(r.feasible):,}" if c.analytic_rank
             else "outside the searched space" if r.rule_fits else "does not fit in memory")
    slower = _des(c) / _des(r.best) - 1
    return (f"  rule of thumb  {layout_text(c, extra)}: {where}; simulated {_des(c):.3f} s, "
            f"rank {simulated_rank(r, c)} among the simulated, "
            + (f"{slower:.1%} slower than the best" if slower > 0 else "the best"))
