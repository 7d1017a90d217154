"""`parasim sweep KEY VALUE...`: one config simulated once per value of one key, side by side.

    parasim sweep parallel.micro_batch 1 2 4 8
    parasim sweep parallel.tp 1 2 4 8 --config my.toml --set parallel.pp=4 --report sweep.html

Each value is applied as `--set KEY=VALUE` would apply it (`sim.settings`), after the config's
own `--set`s, so a point of the sweep is exactly `parasim simulate --set ... --set KEY=VALUE`.
Every point's experiment is built and checked before any is simulated: the bad values are
named together in one line (exit 2), and nothing runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import Experiment
from sim.metrics import StepSummary
from sim.settings import CONFIG_KEYS, Setting, load_set_experiment, parse_setting
from sim.simulate import size_text
from traces.errors import ConfigError, show

MAX_VALUES = 64
"""The most values one sweep takes (each is a full simulation)."""


@dataclass(frozen=True)
class Point:
    """One value of the swept key and what the simulation of the config with it predicts."""

    value: Any
    exp: Experiment
    summary: StepSummary

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.summary.tokens_per_s / self.exp.layout.world


def sweep_settings(key: str, values: Sequence[str]) -> list[Setting]:
    """One setting of `key` per value, read as `--set KEY=VALUE` reads it; too many values, a
    value given twice or a key that is no config key is refused first."""
    if not 1 <= len(values) <= MAX_VALUES:
        raise ConfigError(f"sweep: {len(values):,} values; give 1 to {MAX_VALUES}")
    try:
        settings = [parse_setting(f"{key}={value}", CONFIG_KEYS) for value in values]
    except ConfigError as err:
        raise ConfigError(f"sweep {_after_flag(str(err))}") from None
    seen: dict[str, str] = {}
    for setting, value in zip(settings, values):
        canonical = repr(setting.value)
        if canonical in seen:
            raise ConfigError(f"sweep {key}: {show(value)} is the same value as "
                              f"{show(seen[canonical])}; give each value once")
        seen[canonical] = value
    return settings


def _after_flag(message: str) -> str:
    """"--set 'k=v': rule" as "'k=v': rule" (the sweep names itself)."""
    return message.removeprefix("--set ")


def sweep_experiments(config: Path, settings: Sequence[Setting], swept: Sequence[Setting],
                      overrides: dict[str, Any] | None = None) -> list[Experiment]:
    """The config with its settings and each swept value, every one checked before any is
    simulated; the bad values named together in one line."""
    exps: list[Experiment] = []
    bad: list[str] = []
    for point in swept:
        try:
            exps.append(load_set_experiment(config, [*settings, point], overrides))
        except ConfigError as err:
            bad.append(f"{point.text.partition('=')[2]} ({_after_flag(str(err))})")
    if bad:
        raise ConfigError(f"sweep {swept[0].key}: {len(bad)} of {len(swept)} values refused: "
                          + "; ".join(bad))
    return exps


def sweep_json(key: str, points: Sequence[Point]) -> dict[str, Any]:
    """The `--json` object: the key and one row per value, in the order given."""
    return {
        "experiment": points[0].exp.name,
        "key": key,
        "points": [{"value": p.value, "world": p.exp.layout.world,
                    "step_time_s": p.summary.step_time_s,
                    "tokens_per_s": p.summary.tokens_per_s,
                    "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "mfu": p.summary.mfu,
                    "peak_memory_bytes": p.summary.peak_memory_bytes,
                    "memory_capacity_bytes": p.summary.memory_capacity_bytes,
                    "fits": p.summary.fits} for p in points],
    }


HEADER = ("value", "step time", "tokens/s/GPU", "MFU", "peak memory", "fits")


def sweep_rows(points: Sequence[Point]) -> list[tuple[str, ...]]:
    """The table's rows as text, one per value (the text and the report show the same)."""
    return [(_value_text(p.value), f"{p.summary.step_time_s:.4g} s",
             f"{p.tokens_per_s_per_gpu:,.1f}", f"{p.summary.mfu:.1%}",
             f"{size_text(p.summary.peak_memory_bytes)} of "
             f"{size_text(p.summary.memory_capacity_bytes)}",
             "yes" if p.summary.fits else "NO") for p in points]


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else str(value).lower() if isinstance(
        value, bool) else str(value)


def sweep_text(key: str, points: Sequence[Point]) -> str:
    """The table `parasim sweep` prints."""
    rows = [HEADER, *sweep_rows(points)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    first = points[0].exp
    lines = [f"parasim sweep: {key} over {len(points)} values, {first.name} on "
             f"{first.cluster.name}", ""]
    for row in rows:
        lines.append("  " + "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)
