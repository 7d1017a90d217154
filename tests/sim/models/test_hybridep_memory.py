"""HybridEP's buffers in the memory model (sim.models.working_memory.dispatch_buffer_bytes):
per-rank bytes in closed form for the Megatron-Bridge 26.02 GB200 Qwen3-235B-A22B recipe's
layout (TP1 PP8 EP32, DP32 on 256 GPUs, micro-batch 1 of 4,096 tokens, hybridep), on the
64-GPU NVLink domains the bench gives GB200 and on DGX B200's 8-GPU ones."""

from __future__ import annotations

import dataclasses

from sim.config import example_path, load_experiment
from sim.models.hybridep_buffers import domain_members
from sim.models.memory import memory_by_pp_rank, memory_timeline
from traces.layout import Layout
from traces.pipeline import layout_schedule

H, E, M = 4096, 128, 4096  # Qwen3-235B-A22B: hidden, experts; s·b/tp tokens a rank

EXAMPLE = load_experiment(example_path("qwen3-235b-a22b-256-b200.toml"))
LAYOUT = dataclasses.replace(EXAMPLE.layout, ep=32)  # the GB200 row's EP32 (bench row 139)
HYBRIDEP = dataclasses.replace(EXAMPLE.model, dispatch="hybridep")
NCCL = dataclasses.replace(EXAMPLE.model, dispatch="nccl")


def extra_bytes(domain: int) -> list[float]:
    """Working bytes each pipeline rank holds beyond NCCL's dispatch."""
    schedule = layout_schedule(LAYOUT)
    return [a.working_bytes - b.working_bytes for a, b in
            zip(memory_by_pp_rank(HYBRIDEP, LAYOUT, schedule, domain),
                memory_by_pp_rank(NCCL, LAYOUT, schedule, domain), strict=True)]


def test_one_64_gpu_domain_holds_the_whole_ep_group():
    # R = 32 members on the domain, N = 1: X = M·32 tokens, P = (128/32)·32 = 128 probs;
    # dispatch shares the combine's buffers: X·h·2 + X·P·4
    x, p = M * 32, 128
    assert domain_members(LAYOUT, 64) == 32
    assert extra_bytes(64) == [x * H * 2 + x * p * 4] * 8 == [1_140_850_688] * 8


def test_8_gpu_domains_add_the_rdma_buffers():
    # R = 8, N = 4: X = M·8·4, P = 4·8 = 32, M·(N - 1) = 12,288 remote tokens
    x, p, remote = M * 32, 32, M * 3
    combine = x * H * 2 + x * p * 4 + 2 * (remote * H * 2 + remote * p * 4)
    dispatch = remote * H * 2 + remote * p * 4 + x * H * 2 + x * p * 4
    assert domain_members(LAYOUT, 8) == 8
    assert extra_bytes(8) == [combine + dispatch] * 8 == [2_487_746_560] * 8


def test_strided_ep_members_count_per_domain():
    # ETP 2 spaces EP members two ranks apart: 4 of an 8-GPU domain's ranks are members
    layout = Layout(tp=2, dp=8, ep=8, etp=2, global_batch=16)
    assert domain_members(layout, 8) == 4 and domain_members(layout, 64) == 8


def test_the_timeline_holds_them_from_the_start():
    timeline = memory_timeline(HYBRIDEP, LAYOUT, 0, [], 64)
    plain = memory_timeline(NCCL, LAYOUT, 0, [], 64)
    assert timeline[0][1] - plain[0][1] == 1_140_850_688
