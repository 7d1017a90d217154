"""What a CPU validation says (issue 36): the calibration's notes merged by reason, this
host's noise floor beside the step error, and the error against each measured step."""

from __future__ import annotations

import pytest

from sim.calibrate.summary import merged_notes
from sim.validation import noise_floor, summary_text
from tests.sim.report.validation_page import simulated_validation

WIDE = "its 95% interval is wider than its whole search (0.001 to 100000 TFLOP/s)"
KEPT = "; kept the base profile's value"


def test_notes_with_one_reason_are_one_line():
    notes = (f"kernel fc1 FLOP rate not identifiable: {WIDE}{KEPT}",
             f"kernel fc2 FLOP rate not identifiable: {WIDE}{KEPT}",
             f"link loopback bandwidth not identifiable: at the upper bound{KEPT}",
             f"kernel qkv FLOP rate not identifiable: {WIDE}{KEPT}",
             "comm interference: the probes overlapped nothing")
    assert merged_notes(notes) == [
        f"3 figures not identifiable, each for the same reason: {WIDE}; kept the base "
        "profile's values of kernel fc1 FLOP rate, kernel fc2 FLOP rate, kernel qkv FLOP rate",
        f"link loopback bandwidth not identifiable: at the upper bound{KEPT}",
        "comm interference: the probes overlapped nothing"]
    assert merged_notes(notes[:1]) == list(notes[:1]) and merged_notes(()) == []


def test_the_noise_floor_is_half_the_steps_spread():
    assert noise_floor([1.0, 1.2, 1.1]) == pytest.approx(0.1 / 1.1)
    assert noise_floor([2.0]) is None


@pytest.mark.parametrize(("steps", "where"), [((1.20, 1.25, 1.30), "beyond it"),
                                               ((0.60, 1.25, 1.90), "within it")])
def test_the_noise_floor_stands_beside_the_step_error(steps, where):
    v = simulated_validation(steps)
    floor = (steps[2] - steps[0]) / 2 / steps[1]
    line = next(x for x in summary_text(v).splitlines() if x.startswith("  noise floor"))
    assert line == (f"  noise floor    ±{floor:.1%} (half the measured steps' spread): the "
                    f"step error is {where}; against each measured step it runs from "
                    f"{1 / steps[2] - 1:+.1%} to {1 / steps[0] - 1:+.1%}")
    assert v.step_error == pytest.approx(1 / steps[1] - 1)


def test_one_measured_step_says_its_noise_is_unknown():
    text = summary_text(simulated_validation((1.25,)))
    assert "  noise floor    unknown from 1 measured step (--steps 3 or more" in text
