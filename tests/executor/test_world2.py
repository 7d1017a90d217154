"""Two gloo ranks, one world for every case: DP with ZeRO 0-3, TP, TP+SP, Llama blocks (GQA,
SwiGLU, RMSNorm, RoPE, no biases) under TP and a two-stage
pipeline train as the single-process reference; a TP layer and the vocab-parallel
cross-entropy equal the unsharded ones; ZeRO shards round-trip; each rank's communication is
its plan's, call for call."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch
import torch.nn.functional as F

from executor.launch import spawn
from executor.params import init_full_unit, layer_unit, tp_shard
from executor.reference import ReferenceGPT, train
from tests.executor.checks import GRAD_ATOL, GRAD_RTOL, check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.workers import ADAMW, LLAMA, OPTIONS, Case, suite
from traces.plan import build
from traces.stack import regathers
from traces.stored_activations import activation_bytes_per_layer

TIMEOUT_S = 15 * 4  # one world runs every case below
TRAIN = {
    "ddp": Case(dict(dp=2, global_batch=4, schedule="gpipe", bucket_bytes=30_000), record=True),
    "zero1": Case(dict(dp=2, zero=1, global_batch=4, schedule="gpipe", bucket_bytes=10_000),
                  record=True),
    "zero2": Case(dict(dp=2, zero=2, global_batch=4, schedule="gpipe", bucket_bytes=10_000),
                  record=True),
    "zero3": Case(dict(dp=2, zero=3, global_batch=4, schedule="gpipe"), record=True),
    "tp": Case(dict(tp=2, global_batch=2, schedule="gpipe"), record=True),
    "tp-sp": Case(dict(tp=2, sp=True, global_batch=2, schedule="gpipe"), record=True),
    "tp-sp-after": Case(dict(tp=2, sp=True, global_batch=2, schedule="gpipe"), sp_after=True),
    "tp-sp-unfused-full": Case(dict(tp=2, sp=True, micro_batch=2, global_batch=4,
                                    recompute="full", schedule="gpipe"),
                               model=dict(attention="unfused")),
    "gpipe-tied": Case(dict(pp=2, global_batch=4, schedule="gpipe"), record=True),
    "gpipe-untied-selective": Case(dict(pp=2, global_batch=4, schedule="gpipe",
                                        recompute="selective"),
                                   model=dict(tied_embeddings=False)),
    "llama-tp": Case(dict(tp=2, global_batch=2, schedule="gpipe"), model=LLAMA, record=True),
    "llama-mha-tp-sp-biases": Case(dict(tp=2, sp=True, global_batch=2, schedule="gpipe"),
                                   model=dict(LLAMA, kv_heads=4, bias=True), record=True),
}
LAYERS = {name: Case(layout, model=dict(layers=1, attention=attention, kernels=stack))
          for name, layout, attention, stack in [
              ("tp-flash", dict(tp=2), "flash", "fused"),
              ("tp-unfused", dict(tp=2), "unfused", "fused"),
              ("sp-flash", dict(tp=2, sp=True), "flash", "fused"),
              ("sp-unfused", dict(tp=2, sp=True, micro_batch=2, global_batch=2), "unfused",
               "fused"),
              # torch's DTensor SP: qkv and fc1 keep their gathered inputs
              ("sp-unfused-eager", dict(tp=2, sp=True, micro_batch=2, global_batch=2),
               "unfused", "eager")]}
ZERO = {z: Case(dict(dp=2, zero=z, global_batch=2, bucket_bytes=5_000)) for z in (1, 2, 3)}
SEED = 99


@pytest.fixture(scope="module")
def world() -> dict:
    tasks: list[tuple[str, tuple]] = [("train_cases", (list(TRAIN.values()),))]
    tasks += [("layer_case", (case, SEED)) for case in LAYERS.values()]
    tasks += [("ce_case", (Case(dict(tp=2)), SEED))]
    tasks += [("zero_case", (case,)) for case in ZERO.values()]
    tasks += [("clock_case", ()), ("clock_hosts_case", ())]
    results, _ = spawn(suite, 2, (tasks,), timeout_s=TIMEOUT_S)
    by_rank = list(zip(*results))  # task -> per-rank results
    rest = by_rank[1 + len(LAYERS):]
    return {"train": dict(zip(TRAIN, zip(*by_rank[0]))),
            "layer": dict(zip(LAYERS, by_rank[1:1 + len(LAYERS)])),
            "ce": rest[0], "zero": dict(zip(ZERO, rest[1:4])), "clock": rest[4],
            "clock_hosts": rest[5]}


@pytest.mark.parametrize("name", list(TRAIN))
def test_training_equals_the_reference(world: dict, name: str) -> None:
    model, layout = TRAIN[name].specs()
    run = train(model, layout.global_batch, TRAIN[name].steps, OPTIONS.seed, ADAMW)
    check_training(model, layout, list(world["train"][name]), run)


@pytest.mark.parametrize("name", [n for n, c in TRAIN.items() if c.record])
def test_communication_is_the_plans(world: dict, name: str) -> None:
    """Every torch.distributed call of the steps, per communicator and in order, is an op of
    the plan (kind, group, bytes), and every communication op of the plan was called."""
    model, layout = TRAIN[name].specs()
    plan = build(model, layout)
    for rank, result in enumerate(world["train"][name]):
        calls = result["calls"]
        steps = TRAIN[name].steps
        assert len(calls) % steps == 0
        per_step = calls[:len(calls) // steps]
        assert call_sequences(per_step) == plan_sequences(plan.ops[rank]), f"rank {rank}"


@pytest.mark.parametrize("name", list(LAYERS))
def test_tensor_parallel_layer_equals_the_unsharded_layer(world: dict, name: str) -> None:
    model, layout = LAYERS[name].specs()
    ref = ReferenceGPT(model, OPTIONS.seed)
    gen = torch.Generator().manual_seed(SEED)
    shape = (model.seq_len, layout.micro_batch, model.hidden)
    x = torch.randn(shape, generator=gen).requires_grad_()
    gy = torch.randn(shape, generator=gen)
    # the reference is batch-first
    y = ref._block(x.transpose(0, 1), layer_unit(0)).transpose(0, 1)
    y.backward(gy)
    assert x.grad is not None
    full = init_full_unit(model, layer_unit(0), OPTIONS.seed)
    for res in world["layer"][name]:
        r = res["tp_rank"]
        want_y, want_gx = y.detach(), x.grad.detach()
        if layout.sp:  # this rank's sequence shard
            want_y, want_gx = want_y.chunk(layout.tp)[r], want_gx.chunk(layout.tp)[r]
        torch.testing.assert_close(res["y"], want_y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(res["gx"], want_gx, rtol=1e-5, atol=1e-5)
        for pname, grad in res["grads"].items():
            ref_grad = ref.p(layer_unit(0), pname).grad
            assert ref_grad is not None
            want = tp_shard(model, pname, ref_grad, layout.tp, r)
            assert want.shape == grad.shape == tp_shard(model, pname, full[pname],
                                                        layout.tp, r).shape
            torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5, msg=pname)


@pytest.mark.parametrize("name", ["tp-unfused", "sp-unfused"])
def test_a_layer_keeps_for_backward_what_megatron_keeps(world: dict, name: str) -> None:
    """The memory meter after one layer's forward (unfused attention, no dropout: nothing
    implementation-dependent is saved), in fp32 elements: the layer's input, the inputs of
    qkv and fc1, the residual y and the output (5 tensors of rows·b·h) and the two layer norms'
    mean and rstd (4·rows·b), where rows is s, or s/t with SP: Megatron-LM's sequence-parallel
    qkv and fc1 keep only their input's shard and gather it again in backward (DTensor's,
    `kernels = "eager"`, keep the gathered s rows: `traces.stack.regathers`); the QKV output
    (s·b·3h/t), the probabilities (b·a/t·s²), the attention output (s·b·h/t), fc1's and GeLU's
    outputs (2·s·b·f/t); and the causal mask (s² bytes). After the backward only the data is
    left."""
    model, layout = LAYERS[name].specs()
    s, b, h, t = model.seq_len, layout.micro_batch, model.hidden, layout.tp
    rows = s // t if layout.sp else s
    kept = rows if regathers(model) else s  # the rows of qkv's and fc1's saved inputs
    elements = (3 * rows * b * h + 2 * kept * b * h + 4 * rows * b + s * b * 3 * h // t
                + b * model.heads // t * s * s + s * b * h // t + 2 * s * b * model.ffn_hidden // t)
    for res in world["layer"][name]:
        assert res["held"] - res["data"] == 4 * elements + s * s
        assert res["left"] == res["data"] and res["slots"] == [("D", "targets"), ("D", "tokens")]


def test_dtensor_layer_holds_what_the_memory_model_adds(world: dict) -> None:
    """The executor's extra held bytes under DTensor SP (fp32 elements, 4 bytes) are the memory
    model's extra stored bytes (`gathered_inputs`, counted in 2-byte values), twice over."""
    (model, layout), (eager, _) = LAYERS["sp-unfused"].specs(), LAYERS["sp-unfused-eager"].specs()
    extra = activation_bytes_per_layer(eager, layout) - activation_bytes_per_layer(model, layout)
    for fused, torch_sp in zip(world["layer"]["sp-unfused"], world["layer"]["sp-unfused-eager"]):
        assert torch_sp["held"] - fused["held"] == 2 * extra > 0


def test_vocab_parallel_cross_entropy_equals_torch(world: dict) -> None:
    model, layout = Case(dict(tp=2)).specs()
    gen = torch.Generator().manual_seed(SEED)
    s, b, V = model.seq_len, layout.micro_batch, model.vocab
    logits = (torch.randn((s, b, V), generator=gen) * 3).requires_grad_()
    targets = torch.randint(0, V, (s, b), generator=gen)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none")
    scale = world["ce"][0]["scale"]
    (loss.sum() * scale).backward()
    assert logits.grad is not None
    for res in world["ce"]:
        assert math.isclose(res["loss"], float(loss.detach().mean()), rel_tol=1e-6)
        want = logits.grad.chunk(layout.tp, dim=-1)[res["tp_rank"]]
        torch.testing.assert_close(res["glogits"], want, rtol=GRAD_RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_shards_round_trip(world: dict, zero: int) -> None:
    results = world["zero"][zero]
    dp = len(results)
    for res in results:
        # A reduce-scatter of (dp rank + 1) everywhere leaves 1 + 2 + ... + dp in each slice.
        for segment in res["reduced"]:
            assert torch.equal(segment, torch.full_like(segment, dp * (dp + 1) / 2))
        if zero == 3:
            assert max(res["diffs"]) == 0.0 and set(res["freed"]) == {0}
            continue
        # Each rank set its slice of every bucket to (dp rank + 1); the gather spread them.
        for start, end in res["slices"]:
            n = (end - start) // dp
            for d in range(dp):
                piece = res["full"][start + d * n:start + (d + 1) * n]
                assert torch.equal(piece, torch.full_like(piece, d + 1.0))


def test_ranks_on_one_host_share_a_clock(world: dict) -> None:
    assert list(world["clock"]) == [(0, 0, "shared clock"), (0, 0, "aligned to rank 0")]


def test_ranks_on_other_hosts_are_aligned_by_ping_pong(world: dict) -> None:
    """Host keys made to differ: the ping-pong estimates an offset whose error bound (half the
    best round trip) holds the true one, 0 on this host, and is small on loopback."""
    (offset0, error0, method0), (offset1, error1, method1) = world["clock_hosts"]
    assert (offset0, error0, method0) == (0, 0, "ping-pong (min round trip)")
    assert method1 == "aligned to rank 0"
    assert 0 < error1 < 10_000_000  # ns: a loopback round trip, even on a loaded machine
    assert abs(offset1) <= error1
