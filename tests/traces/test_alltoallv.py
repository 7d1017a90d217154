"""All-to-all-v: the compact split, its matrix, rows and columns, and its JSON, checked on load."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from traces.alltoallv import AllToAllv, split_of
from traces.errors import ConfigError
from traces.io import dumps, from_json, to_json
from traces.ops import Op, OpKind, Trace

A2A = OpKind.ALL_TO_ALL
DISPATCH = AllToAllv((10.0, 20.0, 0.0, 30.0), by_sender=False)


def test_a_dispatch_sends_each_receiver_its_size_from_every_member_and_the_combine_reverses():
    assert DISPATCH.matrix() == [[10, 20, 0, 30]] * 4
    assert DISPATCH.send_splits(2) == (10, 20, 0, 30)
    assert DISPATCH.recv_splits(3) == (30, 30, 30, 30)
    combine = DISPATCH.transpose()
    assert combine.matrix() == [list(col) for col in zip(*DISPATCH.matrix())]
    assert combine.send_splits(1) == (20, 20, 20, 20)
    assert combine.recv_splits(0) == (10, 20, 0, 30)
    # The mean buffer (nccl-tests' size) is the same either way: the total over n.
    assert DISPATCH.mean_send_bytes == combine.mean_send_bytes == 240 / 4
    assert DISPATCH.classes() == [(10, (0,)), (20, (1,)), (30, (3,))]  # no flows of 0 bytes


def test_an_even_split_is_none():
    assert split_of([5, 5, 5], by_sender=True) is None
    assert split_of([5, 6, 5], by_sender=True) == AllToAllv((5.0, 6.0, 5.0), True)


def _trace(op: Op) -> Trace:
    return Trace({r: (replace(op),) for r in op.group})


def test_a_split_round_trips_and_an_even_op_writes_none():
    op = Op(kind=A2A, stream="compute", group=(0, 1, 2, 3), size_bytes=60.0, split=DISPATCH)
    trace = _trace(op)
    assert from_json(json.loads(dumps(trace))) == trace
    assert to_json(trace)["ranks"]["0"][0]["split"] == {"sizes": [10.0, 20.0, 0.0, 30.0],
                                                          "by_sender": False}
    even = _trace(replace(op, split=None))
    assert '"split"' not in dumps(even)


@pytest.mark.parametrize(("split", "edit", "message"), [
    ({"sizes": [10, 20, 0], "by_sender": False}, {}, "3 sizes for a group of 4"),
    ({"sizes": [10, 20, 0, 31], "by_sender": False}, {}, "add up to 61 bytes, not the op's "
                                                         "size_bytes 60"),
    ({"sizes": [15, 15, 15, 15], "by_sender": False}, {}, "all equal"),
    ({"sizes": [10, -20, 0, 30], "by_sender": False}, {}, "finite byte counts >= 0"),
    ({"sizes": [10, 20, 0, 30], "by_sender": 1}, {}, "'by_sender' must be true or false"),
    ({"sizes": [10, 20, 0, 30]}, {}, "exactly 'sizes'"),
    ({"sizes": [10, 20, 0, 30], "by_sender": False}, {"kind": "all_gather"},
     "only an all_to_all has a split"),
])
def test_a_bad_split_is_one_line_naming_rank_op_and_field(split, edit, message):
    op = Op(kind=A2A, stream="compute", group=(0, 1, 2, 3), size_bytes=60.0)
    data = to_json(_trace(op))
    raw = data["ranks"]["0"][0]
    raw.update(edit)
    raw["split"] = split
    with pytest.raises(ConfigError) as err:
        from_json(data, "t.json")
    text = str(err.value)
    assert "\n" not in text and text.startswith("t.json: rank 0, op 0, field 'split': ")
    assert message in text
