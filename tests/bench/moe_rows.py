"""The MoE benchmark's row type and model shapes (`bench_moe_recipes.py`).

A `MoeRow` is one figure a source published, with the run it describes written as a parasim
config. `needs` names the settings the source's run used that parasim has no key (or no value)
for yet, entered in the config all the same under the names issue 33 gives them
(`model.dispatch`, `model.router_groups`, `parallel.overlap_moe_comm`, `parallel.schedule =
"dualpipe"`): the benchmark prints such a row as "not expressible: <key>" until the key exists,
then simulates it with the key set. Nothing is approximated in its place.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.config import example_path

UNITS = ("MFU %", "TFLOP/s", "tokens/s")
"""MFU % and TFLOP/s (per GPU) in Megatron-LM's num_floating_point_operations over H100's
989.5 TFLOP/s (the Folding paper's); tokens/s per GPU (NVIDIA's pages, DeepSeek's)."""


@dataclass(frozen=True, slots=True)
class MoeRow:
    """One published figure and the run it was measured on."""

    table: str
    name: str
    source: str
    model: Mapping[str, Any]
    parallel: Mapping[str, Any]
    cluster: Mapping[str, Any]
    published: float | None
    """None where the source publishes no number (the Folding paper's "OOM")."""
    unit: str
    needs: tuple[str, ...] = ()
    """"section.key" or "section.key=value" settings parasim may lack (module docstring)."""
    note: str = field(default="")
    graphs: str = ""
    """The recipe's --cuda-graph-scope (space-separated; "" none): `[sim] cuda_graph_scope`
    when the benchmark models the host (`--host`, or `host`)."""
    host: bool = False
    """The run launches its kernels from an eager Python loop (at most partial CUDA graphs,
    `graphs`): the benchmark models its host by default (`bench_moe_recipes.py --no-host`
    turns that off)."""

    @property
    def gpus(self) -> int:
        p = self.parallel
        return p.get("tp", 1) * p.get("cp", 1) * p.get("pp", 1) * p.get("dp", 1)

    @property
    def tokens(self) -> int:
        """Tokens a step processes: global batch x sequence."""
        return self.parallel["global_batch"] * self.model["seq_len"]

    def config(self, host: bool = False) -> dict[str, Any]:
        """The experiment table `sim.config.experiment_from_dict` reads; with `host`, the
        launching thread modelled (`sim.models.host`) with the recipe's CUDA graphs."""
        table = {"model": dict(self.model), "parallel": dict(self.parallel),
                 "cluster": dict(self.cluster)}
        if host:
            table["sim"] = {"host": True, **({"cuda_graph_scope": self.graphs}
                                             if self.graphs else {})}
        return table


def deepseek_v3(**extra: Any) -> dict[str, Any]:
    """DeepSeek-V3 as the shipped example states it (its [model] table: the report's §4.2 and
    the released config.json), with `extra` keys replacing or adding."""
    with example_path("deepseek-v3-1024-h100.toml").open("rb") as f:
        model = tomllib.load(f)["model"]
    return {**model, **extra}


QWEN3_BLOCK: dict[str, Any] = {
    "head_dim": 128, "qk_norm": True, "kv_heads": 4, "vocab": 151936, "ffn": "swiglu",
    "norm": "rmsnorm", "position": "rope", "bias": False, "tied_embeddings": False,
    "attention": "flash", "dropout": 0.0, "top_k": 8, "experts": 128, "seq_len": 4096,
}
"""Qwen3 MoE's block (Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json): 128 experts,
top-8, no shared expert, every layer MoE (decoder_sparse_step 1, no mlp_only_layers), GQA
with 4 key/value heads of head_dim 128, per-head q/k RMSNorm, untied embeddings, vocabulary
151,936, no dropout."""


def qwen3(size: str, **extra: Any) -> dict[str, Any]:
    """Qwen3-30B-A3B (48 layers, hidden 2048, 32 heads, experts 768 wide) or Qwen3-235B-A22B
    (94 layers, hidden 4096, 64 heads, experts 1536 wide), config.json of each."""
    layers, hidden, heads, expert = {"30b": (48, 2048, 32, 768),
                                     "235b": (94, 4096, 64, 1536)}[size]
    return {**QWEN3_BLOCK, "layers": layers, "hidden": hidden, "heads": heads,
            "ffn_hidden": expert, "moe_ffn_hidden": expert, **extra}
