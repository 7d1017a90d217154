"""Activation CPU offloading: Megatron-Core's refusals, closed-form memory and bytes, and a
two-stream timeline that can only lengthen a micro-batch."""

import pytest

from traces.cpu_offload import (
    NVLINK_C2C_BPS,
    OffloadPlan,
    check,
    freed_layers,
    host_link_Bps,
    micro_batch_s,
    windows,
)
from traces.errors import ConfigError
from traces.layout import Layout


def test_freed_and_moved_bytes_closed_form() -> None:
    plan = OffloadPlan(layers=40, act_bytes_per_layer=3.0e9, host_Bps=NVLINK_C2C_BPS)
    assert plan.freed_bytes == 39 * 3.0e9  # the last offloaded layer is back for the backward
    assert plan.moved_bytes == 2 * 40 * 3.0e9
    assert plan.transfer_s == pytest.approx(3.0e9 / 450e9)
    assert OffloadPlan(1, 5.0, 1.0).freed_bytes == 0.0


def test_host_link_is_c2c_on_grace_and_pcie_elsewhere() -> None:
    assert host_link_Bps("GB200", 64e9) == 450e9
    assert host_link_Bps("GB300", 64e9) == 450e9
    assert host_link_Bps("H100-SXM", 64e9) == 64e9


@pytest.mark.parametrize("layers,pp,recompute,msg", [
    (80, 1, "none", "must be in [0, 80)"),
    (-1, 1, "none", "must be in [0, 80)"),
    (40, 2, "none", "needs pp = 1"),
    (40, 1, "full", "cannot be used with recompute"),
])
def test_refusals(layers: int, pp: int, recompute: str, msg: str) -> None:
    with pytest.raises(ConfigError, match="cpu_offloading_num_layers") as e:
        check(layers, 80, pp, recompute)
    assert msg in str(e.value)


def test_accepted_settings() -> None:
    check(0, 80, 8, "full")
    check(79, 80, 1, "none")


def test_no_offload_is_plain_compute() -> None:
    fwd, bwd = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]
    assert micro_batch_s(fwd, bwd, OffloadPlan(0, 1e9, 1.0)) == 18.0


def test_slow_link_exposes_transfers_exactly() -> None:
    # one of three layers offloaded, its window w[0] = 2: layer 0's copy (10 s) starts at 1,
    # the compute after layer 2's forward waits for it (11); layer 2's backward starts the
    # reload (11 -> 21), layers 2 and 1 end at 13, layer 0's backward waits for the reload
    # and ends at 22.
    assert micro_batch_s([1.0] * 3, [1.0] * 3, OffloadPlan(1, 10.0, 1.0)) == 22.0


def test_windows_are_transformer_engines() -> None:
    """`layer_window_map` of AsyncDoubleBufferGroupOffloadHandler (cpu_offload_v1.py):
    (L // N)(j + 1) - 1, plus j + 1 for the first L % N groups and L % N after them."""
    assert windows(80, 40) == tuple(range(1, 80, 2))
    assert windows(80, 20) == tuple(range(3, 80, 4))
    assert windows(8, 7) == (1, 2, 3, 4, 5, 6, 7)
    assert windows(10, 3) == (3, 6, 9)
    assert windows(10, 0) == ()


@pytest.mark.parametrize("layers", [0, 1, 2, 5, 11])
@pytest.mark.parametrize("bw", [1e6, 1e9, 64e9, 450e9, 1e15])
def test_offload_never_shortens_a_step(layers: int, bw: float) -> None:
    fwd = [0.01 * (1 + i % 3) for i in range(12)]
    bwd = [2 * f for f in fwd]
    plain = sum(fwd) + sum(bwd)
    t = micro_batch_s(fwd, bwd, OffloadPlan(layers, 1e9, bw))
    assert t >= plain
    if bw == 1e15:
        assert t == pytest.approx(plain, rel=1e-6)


def _example(**parallel: object) -> dict:
    import tomllib

    from sim.config import example_path
    data = tomllib.loads(example_path("llama3-70b-h100.toml").read_text())
    data["parallel"].update({"tp": 8, "cp": 1, "pp": 1, "vp": 1, "dp": 8, "schedule": "1f1b",
                             **parallel})
    return data


def test_key_frees_exactly_the_offloaded_layers_but_one() -> None:
    from sim.config import experiment_from_dict
    from sim.models.memory import activation_bytes_per_layer, memory_by_pp_rank
    plain = experiment_from_dict(_example())
    off = experiment_from_dict(_example(cpu_offloading_num_layers=40))
    per_layer = activation_bytes_per_layer(plain.model, plain.layout)
    a = memory_by_pp_rank(plain.model, plain.layout)[0].activations_bytes
    b = memory_by_pp_rank(off.model, off.layout)[0].activations_bytes
    in_flight = a / (80 * per_layer)  # the micro-batches the schedule holds at its peak
    assert a - b == pytest.approx(in_flight * 39 * per_layer)
    assert "cpu_offloading_num_layers" not in plain.layout.to_dict()  # outputs stay the same
    assert off.layout.to_dict()["cpu_offloading_num_layers"] == 40


@pytest.mark.parametrize("extra,msg", [
    ({"pp": 2, "dp": 4}, "needs pp = 1"),
    ({"recompute": "full"}, "cannot be used with recompute"),
])
def test_config_refuses_as_megatron_does(extra: dict, msg: str) -> None:
    from sim.config import experiment_from_dict
    with pytest.raises(ConfigError, match=msg):
        experiment_from_dict(_example(cpu_offloading_num_layers=4, **extra))


def test_config_bounds() -> None:
    from sim.config import experiment_from_dict
    with pytest.raises(ConfigError, match="parallel.cpu_offloading_num_layers"):
        experiment_from_dict(_example(cpu_offloading_num_layers=80))


def test_timed_offload_warns_nothing() -> None:
    """The copies are plan ops now (tests/sim/test_offload_copies.py): no "not timed" note."""
    from sim.config import experiment_from_dict
    assert not any("offload" in w for w in experiment_from_dict(_example()).warnings)
    off = experiment_from_dict(_example(cpu_offloading_num_layers=40))
    assert not any("offload" in w for w in off.warnings)


def test_head_and_embedding_shift_the_closed_form_exactly() -> None:
    # As test_slow_link_exposes_transfers_exactly with an embedding of (0.5, 0.25) and a head
    # of (2, 3): layer 0's copy runs 1.5 -> 11.5, the head waits for it and ends at 16.5;
    # the reload runs 16.5 -> 26.5, layers 2 and 1 end at 18.5, layer 0's backward waits
    # for the reload and ends at 27.5, the embedding's at 27.75.
    assert micro_batch_s([1.0] * 3, [1.0] * 3, OffloadPlan(1, 10.0, 1.0),
                         head=(2.0, 3.0), embed=(0.5, 0.25)) == 27.75


def _resident_peak(layers: int, offloaded: int) -> int:
    """Most layers whose saved activations are on the GPU at once, walking TE's handler
    (AsyncDoubleBufferGroupOffloadHandler, cpu_offload_v1.py): after layer i's forward every
    layer up to i is held but the offloaded j already freed at their window (w[j] < i); the
    commit after layer i frees those with w[j] = i. Before layer i's backward the commit
    reloads j where w[j] = i; held then: the layers N..i not offloaded, and the reloaded j
    (w[j] >= i) whose own backward (j <= i) has not run."""
    w = windows(layers, offloaded)
    peak = 0
    for i in range(layers):
        held = [k for k in range(i + 1) if k >= offloaded or w[k] >= i]
        peak = max(peak, len(held))
    for i in reversed(range(layers)):
        kept = [k for k in range(offloaded, i + 1)]
        back = [j for j in range(offloaded) if w[j] >= i and j <= i]
        peak = max(peak, len(kept) + len(back))
    return peak


@pytest.mark.parametrize("layers,offloaded", [(8, 1), (8, 2), (8, 4), (8, 5), (8, 7),
                                              (80, 40), (32, 31), (3, 1)])
def test_resident_layers_at_the_peak_are_tes(layers: int, offloaded: int) -> None:
    """The memory model frees all offloaded layers but one (was: but two, a double buffer
    Megatron-Core's default `cpu_offloading_double_buffering = False` does not allocate)."""
    layout = Layout(cpu_offloading_num_layers=offloaded)
    assert layers - freed_layers(layout) == _resident_peak(layers, offloaded)
    assert _resident_peak(layers, offloaded) == layers - offloaded + 1
