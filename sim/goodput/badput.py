"""Badput by category, named as Google's ml-goodput-measurement names them, so that a
prediction can be held against a live run's measured breakdown.

The names are the members of `BadputType` in AI-Hypercomputer/ml-goodput-measurement
(`ml_goodput_measurement/src/goodput_utils.py`); what parasim puts in each:

* WASTED_PROGRESS_FROM_DISRUPTION: work since the last durable checkpoint, redone after a
  failure (and a silent corruption's time until the check that finds it);
* INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION: from the failure to the new job's start: detection,
  requeue, and the wait for a spare node or a repair (the library measures it as the gap
  between the disruption and the next job start);
* TPU_INITIALIZATION: the accelerators' set-up, here the process groups' initialisation;
* UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME: the checkpoint's load;
* PROGRAM_STARTUP: the first steps' extra time after a start (the library counts the first
  step's excess over the mean step): the warm-up steps;
* UNPRODUCTIVE_CHECKPOINT_SAVE_TIME: the checkpoints' stalls (and the last one's drain);
* CUSTOM_BADPUT_EVENTS: silent-data-corruption checks, which the library leaves to
  user-defined events (stragglers' time is inside the simulated step, as the library's step
  time deviation would see it: `sim.goodput.stragglers` reports it apart);
* OTHER: a restart set as a whole by `[reliability] restart` (its parts unknown).

TRAINING_PREP and DATA_LOADING_SYNC are parts of a step or a start parasim does not model:
they stay 0.
"""

from __future__ import annotations

from collections.abc import Sequence

WASTED = "WASTED_PROGRESS_FROM_DISRUPTION"
INFRASTRUCTURE = "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"
INITIALIZATION = "TPU_INITIALIZATION"
RESTORE = "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"
STARTUP = "PROGRAM_STARTUP"
SAVE = "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"
CUSTOM = "CUSTOM_BADPUT_EVENTS"
OTHER = "OTHER"
CATEGORIES = ("TPU_INITIALIZATION", "TRAINING_PREP", STARTUP, "DATA_LOADING_SYNC", SAVE,
              RESTORE, WASTED, INFRASTRUCTURE, CUSTOM, OTHER)
"""In the library's enum order (DATA_LOADING_ASYNC left out: the library excludes it, as it
does not block)."""

Phases = tuple[tuple[str, float], ...]
"""A restart's parts in the order they happen: (category, seconds)."""


def split(phases: Sequence[tuple[str, float]], elapsed: float,
          into: dict[str, float]) -> None:
    """Add the first `elapsed` seconds of `phases` to `into`, part by part, in order (a
    restart cut short by another failure spent only its first parts)."""
    for category, seconds in phases:
        if elapsed <= 0:
            return
        spent = min(seconds, elapsed)
        add(into, category, spent)
        elapsed -= spent
    if elapsed > 0:  # rounding: the rest is the last part's
        add(into, phases[-1][0] if phases else OTHER, elapsed)


def add(into: dict[str, float], category: str, seconds: float) -> None:
    into[category] = into.get(category, 0.0) + seconds


def empty() -> dict[str, float]:
    return dict.fromkeys(CATEGORIES, 0.0)
