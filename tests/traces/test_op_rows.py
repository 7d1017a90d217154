"""`row_of` and `stamp`: an op's row stamped again is a copy of it, every field kept."""

import dataclasses

from traces.alltoallv import AllToAllv
from traces.ops import Op, OpKind, Phase, Stream, op_row, row_of, stamp, stamp_phase
from traces.purpose import CpRing

SEND = Op(kind=OpKind.SEND, stream=Stream.CP_SEND, name="cp", purpose=CpRing(1, True),
          deps=(3, 4), layer=5, microbatch=6, phase=Phase.BWD, flops=1.5, mem_bytes=2.5,
          draws=3.5, gemm=(1, 2, 3, 4), group=(0, 1), size_bytes=7.5,
          split=AllToAllv((1.0, 2.0)), dtype="fp32", peer=9,
          tag="cp_grad", span=11, start=0.25, end=0.75)


def test_every_field_of_the_example_differs_from_its_default():
    for f in dataclasses.fields(Op):
        if f.default is not dataclasses.MISSING:
            assert getattr(SEND, f.name) != f.default, f.name


def test_an_ops_row_stamped_again_is_an_equal_op_of_its_own():
    copy = stamp(row_of(SEND), SEND.layer, SEND.microbatch)
    assert copy == SEND and copy is not SEND
    assert copy == dataclasses.replace(SEND)


def test_row_of_reads_the_row_op_row_makes():
    values = {f.name: getattr(SEND, f.name) for f in dataclasses.fields(Op)}
    assert row_of(SEND) == op_row(**values)
    moved = stamp_phase(row_of(SEND), 1, 2, Phase.FWD)
    assert moved == dataclasses.replace(SEND, layer=1, microbatch=2, phase=Phase.FWD)
