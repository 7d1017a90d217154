"""traces.compare: measured against predicted, op by op, by the simulator's own rules."""

from __future__ import annotations

import dataclasses

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.compare import compare, held_times, op_class, step_time
from traces.errors import ConfigError
from traces.ops import OpKind, Trace

CONFIG = {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 128,
                    "dtype": "fp32"},
          "parallel": {"tp": 2, "pp": 2, "micro_batch": 1, "global_batch": 4},
          "cluster": {"preset": "localhost", "gpus_per_node": 4}}


@pytest.fixture(scope="module")
def predicted() -> Trace:
    _, times = predict(experiment_from_dict(CONFIG), fold=False)
    return times.timed_trace()


def scaled(trace: Trace, factor: float, shift: float = 0.0) -> Trace:
    return Trace({r: tuple(dataclasses.replace(op, start=op.start * factor + shift,
                                               end=op.end * factor + shift) for op in ops)
                  for r, ops in trace.ops.items()}, trace.meta)


def test_a_trace_against_itself_has_no_error(predicted):
    result = compare(predicted, predicted)
    assert result.step_error == 0
    assert all(row.error == 0 for row in result.rows)
    kinds = {row.op_class for row in result.rows}
    assert {"fc1 fwd", "fc1 bwd", "send/recv", "all_reduce tp"} <= kinds


def test_every_op_is_one_row_collectives_and_transfers_once(predicted):
    result = compare(predicted, predicted)
    compute = sum(1 for ops in predicted.ops.values() for op in ops
                  if op.kind is OpKind.COMPUTE)
    # one row per call: a TP pair's two ops, the step end's norm over all four ranks
    calls = round(sum(1 / len(op.group) for ops in predicted.ops.values() for op in ops
                      if op.kind.is_collective))
    sends = sum(1 for ops in predicted.ops.values() for op in ops if op.kind is OpKind.SEND)
    assert len(result.rows) == compute + calls + sends


def test_a_slower_measurement_shows_as_the_same_error_everywhere(predicted):
    """Measured 25% slower in every op and the step (a clock running at 1.25x): every
    prediction is 20% short; shifting the measured clock changes nothing."""
    result = compare(scaled(predicted, 1.25, shift=3.0), predicted)
    assert result.step_error == pytest.approx(-0.2)
    for row in result.rows:
        assert row.error == pytest.approx(-0.2)
    for k in result.classes:
        assert k.mape == pytest.approx(0.2) and k.bias == pytest.approx(-0.2)


def _delayed_after_a_kernel(predicted, gap):
    """Rank 0's ops, the index i of a kernel followed on its stream by a kernel that waits
    for nothing, and the same ops with everything after i started `gap` later."""
    ops = list(predicted.ops[0])
    i = next(k for k in range(len(ops) - 1) if ops[k].kind is OpKind.COMPUTE
             and ops[k + 1].kind is OpKind.COMPUTE and ops[k + 1].stream == ops[k].stream
             and not ops[k + 1].deps)
    return ops, i, [op if k <= i else dataclasses.replace(op, start=op.start + gap,
                                                          end=op.end + gap)
                    for k, op in enumerate(ops)]


def test_a_gap_before_an_op_counts_to_the_op_before(predicted):
    """The interpreter's time between two kernels is the earlier kernel's (occupancy)."""
    gap = 1e-3
    ops, i, measured_ops = _delayed_after_a_kernel(predicted, gap)
    held = held_times(measured_ops)
    assert held[i] == pytest.approx(ops[i].duration + gap)
    assert held[i + 1] == pytest.approx(ops[i + 1].duration)


def test_a_wait_held_back_from_outside_counts_to_no_op(predicted):
    """Before an op something outside the trace held back (a barrier before a microbenchmark
    section), the op before it held its stream for its own duration and the usual gap only:
    the barrier's wait is nobody's kernel time (calibration once fitted it to the optimizer)."""
    wait = 5e-3
    ops, i, measured_ops = _delayed_after_a_kernel(predicted, wait)
    assert held_times(measured_ops)[i] == pytest.approx(ops[i].duration + wait)
    held = held_times(measured_ops, starts={i + 1})
    assert held[i] == pytest.approx(ops[i].duration)  # the plan's own ops leave no gaps
    assert held[i + 1] == pytest.approx(ops[i + 1].duration)


def test_a_span_is_one_row_against_the_prediction_over_it(predicted):
    ops = list(predicted.ops[0])
    first, last = ops[0], ops[2]
    spanned = [dataclasses.replace(op, span=7, start=first.start, end=last.end + 1e-4)
               if k <= 2 else op for k, op in enumerate(ops)]
    measured = Trace({**predicted.ops, 0: tuple(spanned)}, predicted.meta)
    rows = [r for r in compare(measured, predicted).rows if r.op_class.endswith("(span)")]
    assert len(rows) == 1
    assert rows[0].measured_s == pytest.approx(last.end + 1e-4 - first.start)
    assert rows[0].predicted_s == pytest.approx(last.end - first.start)


def test_traces_of_different_plans_are_refused_in_one_line(predicted):
    other = Trace({**predicted.ops, 1: predicted.ops[1][1:]}, predicted.meta)
    with pytest.raises(ConfigError, match="rank 1 holds .* ops in one trace"):
        compare(other, predicted)
    swapped = list(predicted.ops[0])
    swapped[0], swapped[1] = swapped[1], swapped[0]
    with pytest.raises(ConfigError, match="rank 0 op 0 is"):
        compare(Trace({**predicted.ops, 0: tuple(swapped)}, predicted.meta), predicted)


def test_step_time_and_classes(predicted):
    assert step_time(predicted) == pytest.approx(
        max(op.end for ops in predicted.ops.values() for op in ops))
    op = predicted.ops[0][0]
    assert op_class(op) == f"{op.name} {op.phase}"
