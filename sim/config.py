"""An experiment: a TOML file with [model], [parallel], [cluster] and optional [sim].

    [model]      layers, hidden, heads, seq_len, vocab, ffn_hidden, dtype, tied_embeddings,
                 attention, kv_heads, ffn, norm, position, bias, dropout, fp8_recipe,
                 kernels (fused | compiled | eager: `traces.stack`), head_dim, qk_norm
                 (traces.heads), mtp_layers (traces.mtp)
    [parallel]   tp, pp, dp, vp, sp, zero, schedule, micro_batch, global_batch, recompute,
                 bucket_bytes, overlap_grad_reduce, fp32_main_grads, tp_comm_overlap,
                 overlap_param_gather, cp, reshard_after_forward, grad_sync, pp_first_layers,
                 pp_last_layers, account_for_embedding, account_for_loss, pipeline_layout,
                 overlap_moe_comm (traces.moe_overlap), optimizer (traces.torch_optim)
    [cluster]    see topology.config
    [sim]        network = "flow" | "analytic" | "ideal", algo = "auto" | ..., profile = "p.json",
                 host, cuda_graph_scope (the launching CPU thread: sim.models.host)
                 (a profile's measured links and roofs replace the cluster's: `Profile.applied_to`)
    [reliability] failures, checkpoints and restarts of a whole run (`parasim goodput`): see
                 sim.goodput.settings

Every key is checked; a bad one raises ConfigError naming the table, key, value and rule. The
order matters for big mistakes: the layout is checked against the cluster's size before the
cluster's graph is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from sim.collectives import ALGORITHM_NAMES, Algorithm
from sim.engine.transport import NETWORK_NAMES, NetworkMode
from sim.frontdoors.model_source import resolve_model
from sim.goodput.settings import Reliability, read_reliability
from sim.models.host import KEYS as HOST_KEYS
from sim.models.host import HostSettings
from sim.models.sharing import check_comm_sms
from sim.models.stack_rates import stack_profile
from sim.profile import Profile, default_profile, load_profile
from topology.cluster import Accelerator, Cluster
from topology.config import read_cluster
from traces.errors import ConfigError, show
from traces.fields import Fields, check_choice
from traces.files import load_toml
from traces.fp8 import recipe as fp8_recipe_of
from traces.fp8_params import check_fp8_param_gather
from traces.fp8_recipes import check_recipe_layout, check_recipe_named
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec

EXAMPLES = ("gpt3-175b-1024-a100.toml", "llama-7b-zero3-64-h100.toml",
            "gpt-6.7b-tpu-v4-torus.toml", "gpt-tiny-localhost.toml",
            "gpt-tiny-2rank-localhost.toml", "llama3-70b-h100.toml", "llama3-8b-128k-h100.toml",
            "llama3-405b-16k-h100-goodput.toml", "deepseek-v3-1024-h100.toml",
            "qwen3-32b-h100.toml", "qwen3-235b-a22b-256-b200.toml")
TABLES = ("model", "parallel", "cluster", "sim", "reliability")
DERIVED_MODEL_KEYS = ("fp8_non_tn",)
"""ModelSpec fields the config derives from the cluster (`resolve_non_tn`), never reads."""
MODEL_KEYS = tuple(f.name for f in fields(ModelSpec) if f.name not in DERIVED_MODEL_KEYS)
PARALLEL_KEYS = tuple(f.name for f in fields(Layout))
SIM_KEYS = ("network", "algo", "profile", *HOST_KEYS)


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """A model, a layout and a cluster that fit together: valid once constructed."""

    name: str
    model: ModelSpec
    layout: Layout
    cluster: Cluster
    network: NetworkMode = NetworkMode.FLOW
    algo: Algorithm = Algorithm.AUTO
    profile: Profile
    profile_path: Path | None = None
    """The profile file the config names ([sim] profile or --profile), an input of the run."""
    reliability: Reliability | None = None
    """The `[reliability]` table, when the config has one (`parasim goodput` reads it)."""
    host: HostSettings = HostSettings()
    """`[sim] host` and `cuda_graph_scope`: the launching thread (`sim.models.host`)."""
    warnings: tuple[str, ...] = field(init=False, default=())
    """Combinations that work but are slow (TP groups across servers)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", resolve_non_tn(self.model, self.cluster.accelerator))
        # Checked as the strings they may be (check_choice compares types as well).
        object.__setattr__(self, "network", NetworkMode(check_choice(
            _plain(self.network), "sim.network", NETWORK_NAMES)))
        object.__setattr__(self, "algo", Algorithm(check_choice(
            _plain(self.algo), "sim.algo", ALGORITHM_NAMES)))
        notes = check_layout(self.model, self.layout, world=self.cluster.num_devices,
                             devices_per_server=self.cluster.devices_per_server)
        check_fp8(self.model, self.cluster.accelerator)
        if self.model.fp8:
            check_recipe_layout(self.model.fp8_recipe, self.model.experts, self.layout.etp)
        check_fp8_param_gather(self.model, self.layout)
        object.__setattr__(self, "warnings", notes)


def resolve_non_tn(model: ModelSpec, accelerator: Accelerator) -> ModelSpec:
    """`model` with `ModelSpec.fp8_non_tn` as `accelerator` has it: an fp8 model's GEMMs take
    non-TN layouts where TE's is_non_tn_fp8_gemm_supported() holds, compute capability 10.x
    (NVIDIA/TransformerEngine transformer_engine/pytorch/utils.py), which the presets mark by
    `Accelerator.fp8_block_scaling` (both Blackwell's, as `sim.models.fp8_weight_cache` takes
    it). Set only for the recipes it changes, the per-tensor ones (`Fp8Recipe.transposes`),
    so no other model's trace header carries it. Derived, never stated: an Experiment and
    `sim.search.analytic` set it."""
    non_tn = (model.dtype == "fp8" and accelerator.fp8_block_scaling
              and fp8_recipe_of(model).transposes)
    if model.fp8_non_tn == non_tn:
        return model
    return dataclasses.replace(model, fp8_non_tn=non_tn)


def check_fp8(model: ModelSpec, accelerator: Accelerator) -> None:
    """An fp8 model needs FP8 tensor cores, and MXFP8 needs Blackwell's block scaling; the
    other recipes run wherever FP8 does (`traces.fp8_recipes`: TE runs blockwise on Blackwell
    through MXFP8). An fp4 model needs FP4 tensor cores (Blackwell's: TE's NVFP4 recipe runs
    on compute capability 10.0 and up, nvfp4.rst "Supported devices")."""
    if model.fp4:
        if accelerator.peak_flops_fp4 <= 0:
            raise ConfigError(f"model.dtype: \"fp4\" needs FP4 tensor cores, which "
                              f"{accelerator.name} does not have (Blackwell does: B200, "
                              "GB200, B300, GB300)")
        return
    if not model.fp8:
        return
    if accelerator.peak_flops_fp8 <= 0:
        raise ConfigError(f"model.dtype: \"fp8\" needs FP8 tensor cores, which "
                          f"{accelerator.name} does not have (Hopper and Blackwell do)")
    if model.fp8_recipe == "mxfp8" and not accelerator.fp8_block_scaling:
        raise ConfigError(f"model.fp8_recipe: \"mxfp8\" needs hardware block scaling "
                          f"(Blackwell), which {accelerator.name} does not have; use "
                          "\"delayed\", \"tensorwise\", \"rowwise\" or \"blockwise\"")


def resolve_fp8(model: ModelSpec, accelerator: Accelerator, stated: bool) -> ModelSpec:
    """An fp8 model's recipe, where the config left it out (`stated` false): MXFP8 on an
    accelerator with block scaling (Blackwell), else delayed scaling."""
    if model.dtype == "fp8" and not stated and accelerator.fp8_block_scaling:
        model = dataclasses.replace(model, fp8_recipe="mxfp8")
    check_fp8(model, accelerator)
    return model


def _plain(value: object) -> object:
    """An enum member as its string; anything else as it is."""
    return str(value) if isinstance(value, (NetworkMode, Algorithm)) else value


def example_path(name: str = EXAMPLES[0]) -> Path:
    """A config shipped with the package (the first is `parasim simulate`'s default)."""
    return Path(str(resources.files("sim").joinpath("examples", name)))


def load_experiment(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Experiment:
    """Read and validate a config file; `overrides` (from flags) replace [sim] keys."""
    path = Path(path)
    data = load_toml(path)
    return experiment_from_dict(data, name=path.stem, base=path.parent, overrides=overrides)


def experiment_from_dict(data: Mapping[str, Any], *, name: str = "experiment",
                         base: Path = Path("."),
                         overrides: Mapping[str, Any] | None = None) -> Experiment:
    """The experiment a parsed config describes; `base` resolves a relative [sim] profile
    (and a [model] from = "hf:PATH": `sim.frontdoors.model_source`)."""
    data = resolve_model(data, base)
    for table in data:
        if table not in TABLES:
            raise ConfigError(f"[{show(table)[1:-1]}]: unknown table "
                              f"(known: {', '.join(TABLES)})")
    for table in ("model", "parallel", "cluster"):
        if table not in data:
            raise ConfigError(f"[{table}]: missing table")
    model_fields = Fields.of(data["model"], "model")
    if "fp8_non_tn" in model_fields:
        raise ConfigError("model.fp8_non_tn: not a config key; it follows the accelerator "
                          "(non-TN FP8 GEMM layouts on Blackwell)")
    model_table = model_fields.known(MODEL_KEYS).table
    model = ModelSpec(**model_table)
    layout = read_layout(data["parallel"])
    spec = read_cluster(data["cluster"])
    sim = Fields.of({**Fields.of(data.get("sim", {}), "sim").table, **(overrides or {})}, "sim")
    sim.known(SIM_KEYS)
    network = NetworkMode(sim.choice("network", "flow", NETWORK_NAMES))
    algo = Algorithm(sim.choice("algo", "auto", ALGORITHM_NAMES))
    host = HostSettings.read(sim)
    profile_path = sim.string("profile", "")
    if "profile" in sim and not profile_path:
        raise ConfigError("sim.profile: an empty path names no file")
    reliability = read_reliability(data["reliability"]) if "reliability" in data else None
    # Before the graph is built: 10**6 nodes against a 1024-GPU layout is one line, not 12 GB.
    check_layout(model, layout, world=spec.num_devices,
                 devices_per_server=spec.devices_per_server)
    check_comm_sms(layout.comm_sms, spec.accelerator)
    cluster = spec.build()
    where = "--profile" if "profile" in (overrides or {}) else "sim.profile"
    profile = (load_profile(base / profile_path, where) if profile_path
               else stack_profile(default_profile(cluster.accelerator), cluster.accelerator,
                                  model.kernels))
    cluster = profile.applied_to(cluster)  # measured link classes and roofs replace the preset's
    model = resolve_fp8(model, cluster.accelerator, "fp8_recipe" in model_table)
    check_recipe_named(model_table.get("fp8_recipe"))
    check_recipe_named(model_table.get("fp4_recipe"), "fp4_recipe")
    return Experiment(name=name, model=model, layout=layout, cluster=cluster, network=network,
                      algo=algo, profile=profile, reliability=reliability, host=host,
                      profile_path=base / profile_path if profile_path else None)


def read_layout(table: object) -> Layout:
    """The `[parallel]` table: sizes in human units, every other value as `Layout` checks it."""
    parallel = Fields.of(table, "parallel")
    if "flash_attention" in parallel:
        raise ConfigError("parallel.flash_attention: moved to [model] attention = \"flash\" | "
                          "\"unfused\" (the attention implementation is the model's)")
    parallel.known(PARALLEL_KEYS)
    values = dict(parallel.table)
    if "bucket_bytes" in parallel:
        values["bucket_bytes"] = parallel.size("bucket_bytes", 0)
    return Layout(**values)
