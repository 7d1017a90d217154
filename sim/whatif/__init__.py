"""`parasim whatif`: a captured step (a `parasim run` trace set) predicts another job's step.

    captured = load_captured(["runs/dp2"])
    result = whatif(captured, target_experiment(captured, settings=...))

`capture` reads and checks the traces and says which job they ran; `book` learns each kernel
class's times (measured medians by shape, calibrate's fit for new shapes) and the host gaps;
`predict` builds the target's plan, times it from the book and replays it on the target
cluster, with a range from the fit's uncertainty.
"""

from sim.whatif.capture import Captured, load_captured, target_experiment
from sim.whatif.predict import WhatifResult, whatif

__all__ = ["Captured", "WhatifResult", "load_captured", "target_experiment", "whatif"]
