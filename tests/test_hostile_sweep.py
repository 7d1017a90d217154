"""Issue 36's hostile sweep (2026-12-04), the cluster classes: an HBM slower than NCCL's own
traffic in it, an NVSwitch node too big for NVLS, TP groups that cross nodes under a fold,
and link efficiencies with no lower bound. Each case and siblings of it (other values of the
same kind) end in one line and exit 2, or in the correct result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.collectives.nccl_system import NcclSystem
from sim.collectives.protocols import GBPS, SPEEDS_INTRA
from tests.test_hostile_inputs import refused, run

MODEL = """[model]
layers = 4
hidden = 1024
heads = 16
seq_len = 128
vocab = 1024
"""


def write(tmp_path: Path, parallel: str, cluster: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(f"{MODEL}[parallel]\n{parallel}\n[cluster]\n{cluster}\n")
    return str(path)


# --- an HBM slower than NCCL's traffic in it -------------------------------------------------

@pytest.mark.parametrize(("preset", "nodes", "hbm", "traffic"), [
    # one node: 3 x NVLink's data rate (A100 300 GB/s, H100 450 GB/s, at the preset's efficiency)
    ("dgx-a100", 1, "500GB/s", "740 GB/s"),
    ("dgx-a100", 1, "1e-3GB/s", "740 GB/s"),
    ("dgx-h100", 1, "1.1TB/s", "1,110 GB/s"),
])
def test_an_hbm_below_ncclss_traffic_is_one_line(tmp_path, capsys, preset, nodes, hbm, traffic):
    config = write(tmp_path, "tp = 2\npp = 2\ndp = 2\nglobal_batch = 4",
                   f'preset = "{preset}"\nnodes = {nodes}\nhbm_bandwidth = "{hbm}"')
    refused(capsys, f"must be above the {traffic} NCCL's reductions move through HBM",
            "simulate", config)


def test_an_hbm_above_it_is_simulated(tmp_path, capsys):
    config = write(tmp_path, "tp = 2\npp = 2\ndp = 2\nglobal_batch = 4",
                   'preset = "dgx-a100"\nnodes = 1\nhbm_bandwidth = "800GB/s"')
    code, out, err = run(capsys, "simulate", config, "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] > 0


# --- NVLS on a node too big for its search ---------------------------------------------------
# NCCL's NVLS search keeps at most NCCL_MAX_NVLS_ARITY (32) heads, so every GPU's link carries
# (heads + 1) x bw: on 18 H100 links (370.8 GB/s) 33 x 3 GB/s always fits and a node of any size
# has NVLS; the search fails only where (heads + 1) x the slowest speed exceeds the link.

@pytest.mark.parametrize("gpus", [8, 32, 64, 122, 128, 1024])
def test_nvls_keeps_at_most_32_heads(gpus):
    nvls = NcclSystem(num_nodes=1, gpus_per_node=gpus, compute_capability=90, nvlinks=18).nvls
    heads = min(gpus, 32)
    assert nvls is not None and nvls.channels == heads
    assert (heads + 1) * nvls.bw_intra_Bps <= 18 * 20.6 * GBPS


def largest_nvls_node(nvlinks: int) -> int:
    """(n + 1) x the slowest search speed must fit the NVLink (n <= 32): n + 1 <= link / 3."""
    return int(nvlinks * 20.6 // min(SPEEDS_INTRA[90])) - 1


@pytest.mark.parametrize("gpus", [largest_nvls_node(2) + 1, 16, 32, 1024])
def test_no_nvls_where_33_heads_cannot_fit_as_ncclss_search_fails(gpus):
    assert largest_nvls_node(2) == 12
    assert NcclSystem(num_nodes=1, gpus_per_node=gpus, compute_capability=90,
                      nvlinks=2).nvls is None
    assert NcclSystem(num_nodes=1, gpus_per_node=largest_nvls_node(2), compute_capability=90,
                      nvlinks=2).nvls is not None


def test_a_128_gpu_hopper_node_all_reduces(tmp_path, capsys):
    """32 NVLS heads at 6 GB/s (33 x 6 <= 370.8): 160 GB/s and 23 us beat the ring's 181 GB/s
    behind 254 steps of latency at 1 GiB."""
    cluster = tmp_path / "c.toml"
    cluster.write_text('[cluster]\npreset = "dgx-h100"\nnodes = 1\ngpus_per_node = 128\n')
    code, out, err = run(capsys, "collective", "--cluster", cluster, "--op", "all_reduce",
                         "--sizes", "1G", "--json")
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    assert row["algo"] == "nvls/Simple" and row["busbw_GBps"] > 0


# --- TP groups that cross nodes under a fold -------------------------------------------------

@pytest.mark.parametrize(("preset", "gpus", "parallel"), [
    ("gb200-nvl72", 6, "tp = 4\npp = 2\ndp = 3\nglobal_batch = 6"),
    ("dgx-a100", 6, "tp = 4\npp = 2\ndp = 3\nglobal_batch = 6"),
    ("dgx-h100", 12, "tp = 8\npp = 2\ndp = 3\nglobal_batch = 6"),
])
def test_tp_across_nodes_is_simulated_unfolded(tmp_path, capsys, preset, gpus, parallel):
    config = write(tmp_path, parallel, f'preset = "{preset}"\nnodes = 4\n'
                                       f"gpus_per_node = {gpus}")
    code, out, err = run(capsys, "simulate", config, "--json")
    assert code == 0, err
    assert "some TP groups cross nodes (slow); the step is simulated with every rank" in err
    code, unfolded, _ = run(capsys, "simulate", config, "--json", "--no-fold")
    assert code == 0
    assert json.loads(out)["step_time_s"] == json.loads(unfolded)["step_time_s"]


# --- link efficiencies -----------------------------------------------------------------------

@pytest.mark.parametrize("key", ["nic_efficiency", "nvlink_efficiency"])
@pytest.mark.parametrize("value", ["1e-30", "5e-324", "0.0099", "0", "-0.5", "1.01"])
def test_a_link_efficiency_outside_a_percent_to_one_is_refused(tmp_path, capsys, key, value):
    config = write(tmp_path, "tp = 2\npp = 2\ndp = 4\nglobal_batch = 8",
                   f'preset = "dgx-h100"\nnodes = 2\n{key} = {value}')
    refused(capsys, f"cluster.{key}: {value} must be a link efficiency in [0.01, 1]",
            "simulate", config)


@pytest.mark.parametrize("value", ["0.01", "0.5", "1"])
def test_a_link_efficiency_at_its_bounds_is_accepted(tmp_path, capsys, value):
    config = write(tmp_path, "tp = 2\npp = 2\ndp = 4\nglobal_batch = 8",
                   f'preset = "dgx-h100"\nnodes = 2\nnic_efficiency = {value}')
    code, _, err = run(capsys, "simulate", config, "--json")
    assert code == 0, err


# --- moderate: a choice left empty, a width TP does not divide -------------------------------

@pytest.mark.parametrize("preset", ["dgx-b200", "dgx-h100"])
def test_an_empty_fp8_recipe_is_refused_not_read_as_delayed(tmp_path, capsys, preset):
    path = tmp_path / "c.toml"
    path.write_text(MODEL + 'dtype = "fp8"\nfp8_recipe = ""\n[parallel]\ntp = 2\ndp = 4\n'
                    f'global_batch = 8\n[cluster]\npreset = "{preset}"\nnodes = 1\n')
    refused(capsys, 'model.fp8_recipe: "" is not one of delayed, tensorwise, rowwise, '
            "blockwise, mxfp8; leave the key out", "simulate", path)


MOE = ("experts = 8\ntop_k = 2\nmoe_ffn_hidden = {f}\nshared_experts = {s}\n[parallel]\n"
       "tp = {tp}\nsp = true\nep = 8\ndp = 8\nglobal_batch = 8\n[cluster]\n"
       'preset = "dgx-h100"\nnodes = {nodes}\n')


@pytest.mark.parametrize(("f", "s", "tp"), [(100, 1, 8), (50, 2, 8), (36, 3, 8), (10, 1, 4)])
def test_shared_experts_tp_does_not_divide_are_refused(tmp_path, capsys, f, s, tp):
    path = tmp_path / "c.toml"
    path.write_text(MODEL + MOE.format(f=f, s=s, tp=tp, nodes=tp))
    refused(capsys, f"parallel.tp: {tp} does not divide the shared experts' width, "
            f"model.shared_experts x model.moe_ffn_hidden = {f * s}", "simulate", path)


# --- a collective too big to lower -----------------------------------------------------------

@pytest.mark.parametrize("preset", ["gb200-nvl72", "gb300-nvl72"])
def test_a_rack_scale_collective_too_big_to_lower_is_one_line(capsys, preset):
    refused(capsys, "collective: 131,040 ranks x 72 channels = 9,434,880 rank-channels, more "
            "than the 4,194,304 parasim's flow model lowers", "collective", "--cluster", preset,
            "--nodes", 1820, "--op", "all_reduce", "--sizes", "1G")


def test_the_lowering_bound_is_ranks_times_channels():
    from sim.collectives.size import MAX_RANK_CHANNELS, check_lowering_size
    from traces.errors import ConfigError

    check_lowering_size(MAX_RANK_CHANNELS // 16, 16)  # DGX H100's 16 channels, at the bound
    with pytest.raises(ConfigError, match="rank-channels"):
        check_lowering_size(MAX_RANK_CHANNELS // 16 + 1, 16)
