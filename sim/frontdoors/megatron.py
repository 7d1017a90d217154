"""A Megatron-LM / Megatron-Bridge argument list turned into a parasim TOML.

    parasim from-megatron "--num-layers 80 --hidden-size 8192 ... --tensor-model-parallel-size 4"
        --gpus 64 --cluster dgx-h100 > llama70b.toml

Each argument is read (`megatron_flags.FLAGS`), known to change nothing parasim simulates
(`megatron_flags.HARMLESS`: learning rates, data, logging, checkpoints), or named in the one
warning line of what the TOML leaves out. Megatron's defaults are written where they differ
from parasim's (Megatron overlaps no gradient reduction unless told to; it runs MoE GEMMs one
expert at a time without --moe-grouped-gemm, and with it TE's GroupedLinear on 4 streams:
`moe_gemm_streams`), so the TOML says what Megatron would run. The
world size is `--gpus` or torchrun's --nnodes x --nproc-per-node among the arguments; data
parallelism is what the other axes leave of it, as in Megatron.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.frontdoors.megatron_flags import ALIASES, FLAGS, HARMLESS
from traces.errors import ConfigError, show
from traces.moe_spec import TE_GEMM_STREAMS
from traces.pipeline_layout import parse_pipeline_layout

REQUIRED = ("layers", "hidden", "heads", "seq_len", "vocab")
_SPECIAL = frozenset({"recompute-method", "recompute-num-layers", "moe-layer-freq", "nnodes",
                      "nproc-per-node", "moe-use-legacy-grouped-gemm"})
_BRIDGE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+=")
_FREQ = re.compile(r"^\(?\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\)?$")
_VALUES: Mapping[str, Mapping[str, Any]] = {
    "normalization": {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"},
    "position-embedding-type": {"rope": "rope", "yarn": "rope", "learned_absolute": "learned"},
    "fp8-format": {"hybrid": "fp8", "e4m3": "fp8"},
    "fp4-format": {"e2m1": "fp4"},
    "cp-comm-type": {"p2p": "p2p", "all_gather": "all_gather"},
    "recompute-granularity": {"full": "full", "selective": "selective"},
    "moe-token-dispatcher-type": {"alltoall": "nccl", "flex": "deepep"},
    "moe-flex-dispatcher-backend": {"deepep": "deepep", "hybridep": "hybridep"},
    "attention-backend": {"flash": "flash", "fused": "flash", "auto": "flash",
                          "unfused": "unfused", "local": "unfused"},
}
"""Megatron's words for the choices parasim has; any other is left out, named."""


@dataclass
class Translation:
    """What an argument list says: the [model] and [parallel] keys, the special arguments kept
    for the arithmetic at the end, and the arguments left out (as the user wrote them)."""

    model: dict[str, Any] = field(default_factory=dict)
    parallel: dict[str, Any] = field(default_factory=dict)
    special: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


def arguments(words: Sequence[str]) -> Iterator[tuple[str, str | None, str]]:
    """(flag name with dashes, its value or None, the text as written) for each argument;
    Bridge overrides `a.b_c=V` read as `--b-c V`; a script or launcher word is skipped."""
    try:
        tokens = [t for w in words for t in shlex.split(w)]
    except ValueError as err:  # an unclosed quotation
        raise ConfigError(f"ARGS: cannot be split as a shell would: {err}") from None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if _BRIDGE.match(token):
            name, _, value = token.partition("=")
            flag = ALIASES.get(name.rsplit(".", 1)[1].replace("_", "-"),
                               name.rsplit(".", 1)[1].replace("_", "-"))
            yield flag, value, token
            continue
        if not token.startswith("-"):
            if token.endswith(".py") or token in ("torchrun", "python", "python3"):
                continue
            yield token, None, token
            continue
        name, equals, value = token.lstrip("-").partition("=")
        name = ALIASES.get(name.replace("_", "-"), name.replace("_", "-"))
        switch = name in FLAGS and FLAGS[name].value is None
        if not equals and not switch and i < len(tokens) and not tokens[i].startswith("--"):
            value = tokens[i]
            i += 1
            yield name, value, f"{token} {value}"
        else:
            yield name, value if equals else None, token


def translate(words: Sequence[str]) -> Translation:
    """The keys an argument list sets (module docstring)."""
    out = Translation()
    for name, value, text in arguments(words):
        if name in _SPECIAL:
            out.special[name] = value or ""
        elif name in HARMLESS:
            continue
        elif name not in FLAGS:
            out.left_out.append(text)
        else:
            _read(out, name, value, text)
    return out


def _on(value: str | None, text: str) -> bool:
    """A switch: present (Megatron-LM) or a Bridge override's true/false."""
    if value is None:
        return True
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise ConfigError(f"{text}: {show(value)} must be true or false")


def _read(out: Translation, name: str, value: str | None, text: str) -> None:
    """One argument of FLAGS into its key."""
    flag = FLAGS[name]
    table = out.model if flag.table == "model" else out.parallel
    if flag.value is None:
        on = _on(value, text)
        switched: Mapping[str, Any] = {
            "swiglu": "swiglu" if on else "gelu", "disable-bias-linear": not on,
            "untie-embeddings-and-output-weights": not on, "use-distributed-optimizer": int(on),
            "bf16": "bf16", "fp16": "fp16", "recompute-activations": "selective",
            "moe-enable-deepep": "deepep"}
        if name in ("bf16", "fp16", "recompute-activations", "moe-enable-deepep") and not on:
            return
        if name in ("bf16", "fp16") and table.get("dtype") in ("fp8", "fp4"):
            return  # --fp8-format / --fp4-format run the GEMMs in FP8 / FP4 over bf16
        table[flag.key] = switched.get(name, on)
        return
    if value is None:
        raise ConfigError(f"--{name}: needs a value")
    if name in _VALUES:
        if value not in _VALUES[name]:
            out.left_out.append(text)
            return
        table[flag.key] = _VALUES[name][value]
        return
    read = flag.value(f"--{name}", value)
    if flag.key == "dropout" and "dropout" in table and table["dropout"] != read:
        out.left_out.append(f"{text} (parasim has one dropout for both; kept {table['dropout']})")
        return
    if name == "num-layers-per-virtual-pipeline-stage":
        out.special[name] = value
        return
    table[flag.key] = read


def finish(out: Translation, world: int | None) -> Translation:
    """The arithmetic that needs every argument: world and DP, virtual stages, shared experts'
    count, dense leading layers, recomputation's extent, Megatron's defaults."""
    m, p, s = out.model, out.parallel, out.special
    if world is None:
        world = _world(s)
    axes = p.get("tp", 1) * p.get("cp", 1) * p.get("pp", 1)
    if world % axes:
        raise ConfigError(f"--gpus: {world} is not divisible by TP x CP x PP = {axes}")
    p["dp"] = world // axes
    if "global_batch" not in p:  # Megatron's default: one micro-batch per DP rank
        p["global_batch"] = p.get("micro_batch", 1) * p["dp"]
    if "num-layers-per-virtual-pipeline-stage" in s and "layers" in m:
        per = int(s["num-layers-per-virtual-pipeline-stage"])
        chunks = m["layers"] // (p.get("pp", 1) * per) if per > 0 else 0
        if chunks < 1 or chunks * p.get("pp", 1) * per != m["layers"]:
            raise ConfigError(f"--num-layers-per-virtual-pipeline-stage: {per} does not divide "
                              f"{m['layers']} layers over {p.get('pp', 1)} stages")
        p["vp"] = chunks
    if "pipeline_layout" in p and "vp" not in p:  # Megatron-Core: vp = stages / pp
        stages = len(parse_pipeline_layout(p["pipeline_layout"]))
        if stages % p.get("pp", 1) == 0 and stages > p.get("pp", 1):
            p["vp"] = stages // p.get("pp", 1)
    if p.get("vp", 1) > 1:
        p["schedule"] = "interleaved"
    _experts(out)
    _recompute(out)
    p.setdefault("overlap_grad_reduce", False)  # Megatron's default, unlike parasim's
    if "bucket_bytes" in p:  # Megatron counts a bucket in elements of the reduced gradients
        p["bucket_bytes"] *= 4 if p.get("fp32_main_grads") else 2
    return out


def _world(special: Mapping[str, str]) -> int:
    """torchrun's --nnodes x --nproc-per-node, when the arguments hold them."""
    if "nnodes" in special and "nproc-per-node" in special:
        try:
            return int(special["nnodes"]) * int(special["nproc-per-node"])
        except ValueError:
            pass
    raise ConfigError("--gpus: the world size is missing; give --gpus N (Megatron takes it "
                      "from torchrun, which these arguments do not name)")


def _experts(out: Translation) -> None:
    """Shared experts as a count of routed-expert widths; --moe-layer-freq's dense lead;
    Megatron's MoE kernel defaults (one GEMM per expert, unfused permute and router)."""
    m = out.model
    if not m.get("experts"):
        return
    width = m.get("moe_ffn_hidden") or m.get("ffn_hidden")
    if "shared_experts" in m:
        size = m["shared_experts"]
        if width and size % width == 0:
            m["shared_experts"] = size // width
        else:
            del m["shared_experts"]
            out.left_out.append(f"--moe-shared-expert-intermediate-size {size} (not a multiple "
                                "of the expert width)")
    freq = out.special.get("moe-layer-freq", "1").replace(" ", "")
    if freq != "1":
        match = _FREQ.match(freq)
        if match and int(match[1]) + int(match[2]) == m.get("layers"):
            m["dense_layers"] = int(match[1])
        else:
            out.left_out.append(f"--moe-layer-freq {freq}")
    for key in ("moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion"):
        m.setdefault(key, False)
    _grouped_streams(out)


def _grouped_streams(out: Translation) -> None:
    """--moe-grouped-gemm builds Megatron-Core's TEGroupedMLP on Transformer Engine's
    GroupedLinear (`traces.moe_spec.gemm_streams`): one cuBLAS GEMM per local expert on TE's
    4 compute streams, written out. --moe-use-legacy-grouped-gemm's GroupedMLP runs the
    grouped_gemm library, one CUTLASS kernel or a cuBLAS GEMM per expert as it was built
    (tgale96/grouped_gemm README, "Compiling from source"): left out, named."""
    if not out.model["moe_grouped_gemm"]:
        return
    legacy = out.special.get("moe-use-legacy-grouped-gemm")
    if legacy is not None and _on(legacy or None, "--moe-use-legacy-grouped-gemm"):
        out.left_out.append("--moe-use-legacy-grouped-gemm (the grouped_gemm library's kernels "
                            "depend on its build)")
        return
    out.model["moe_gemm_streams"] = TE_GEMM_STREAMS


def _recompute(out: Translation) -> None:
    """Full recomputation of some layers only is left out, named; of every layer it is full."""
    s, p = out.special, out.parallel
    if "recompute-num-layers" not in s or p.get("recompute") != "full":
        return
    n = int(s["recompute-num-layers"]) if s["recompute-num-layers"].isdigit() else -1
    layers = out.model.get("layers", 0) // max(1, p.get("pp", 1) * p.get("vp", 1))
    method = s.get("recompute-method", "uniform")
    if not ((method == "uniform" and n >= 1) or (method == "block" and n >= layers)):
        out.left_out.append(f"--recompute-method {method} --recompute-num-layers {n} "
                            "(parasim recomputes every layer or none)")
