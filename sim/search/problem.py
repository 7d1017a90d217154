"""What a search is about, as a value every worker process can rebuild: the config's tables.

A `Problem` holds the parsed TOML of the search config without its [search] table (the
[cluster] node count set by `--gpus`), its name and the folder a relative [sim] profile is
read from. It pickles small, so a local process or a Ray worker receives it with each task and
builds its `Context` — model, cluster, profile, the analytic model with its caches — once per
process (`context`), by the project's own reader (`sim.config.experiment_from_dict`).

The [parallel] table of a search is partial (the searched keys are missing), so the context
reads the model, the cluster and [sim] with a placeholder layout that is always valid: every
GPU a data-parallel replica of one sample.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config import Experiment, experiment_from_dict
from sim.search.analytic import Analytic
from sim.search.space import Space, read_space
from topology.config import read_cluster
from traces.errors import ConfigError, show
from traces.fields import MAX_ACCELERATORS, Fields
from traces.layout import Layout


@dataclass(frozen=True, slots=True)
class Problem:
    """A search config, ready to send to a worker."""

    data: Mapping[str, Any]
    """[model], [parallel] (partial), [cluster], optional [sim]; no [search]."""
    search: Mapping[str, Any]
    name: str = "search"
    base: str = "."
    key: str = field(init=False, default="")
    """The config as canonical JSON: a worker's context is cached under it."""

    def __post_init__(self) -> None:
        key = json.dumps([self.data, self.search, self.name, self.base], sort_keys=True,
                         default=str)
        object.__setattr__(self, "key", key)


def problem_from_dict(data: Mapping[str, Any], *, name: str = "search", base: Path = Path("."),
                      gpus: int | None = None) -> Problem:
    """Split a parsed search config into the experiment's tables and [search]; `gpus` sets
    the cluster's node count (it must fill whole nodes)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: {show(data)} must be a table")
    tables = {k: v for k, v in data.items() if k != "search"}
    search = Fields.of(data.get("search", {}), "search").table
    if gpus is not None:
        cluster = dict(Fields.of(tables.get("cluster", {}), "cluster").table)
        per_node = read_cluster(cluster).devices_per_server
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1 or gpus % per_node:
            raise ConfigError(f"--gpus: {show(gpus)} must be a positive multiple of the "
                              f"{per_node} GPUs of a node")
        if gpus > MAX_ACCELERATORS:  # named as the flag, not as the nodes it sets
            raise ConfigError(f"--gpus: {gpus:,} is more than the {MAX_ACCELERATORS:,} "
                              "accelerators parasim simulates")
        tables["cluster"] = {**cluster, "nodes": gpus // per_node}
    return Problem(data=tables, search=dict(search), name=name, base=str(base))


@dataclass(frozen=True, kw_only=True)
class Context:
    """A worker's view of the problem: built once per process."""

    problem: Problem
    base: Experiment
    """The model, cluster and [sim] settings, with the placeholder layout."""
    space: Space
    analytic: Analytic

    def experiment(self, layout: Layout) -> Experiment:
        """The experiment `parasim simulate` would run for this candidate."""
        b = self.base
        return Experiment(name=b.name, model=b.model, layout=layout, cluster=b.cluster,
                          network=b.network, algo=b.algo, profile=b.profile)


_CONTEXTS: dict[str, Context] = {}


def context(problem: Problem) -> Context:
    """The problem's context in this process (built on first use, then reused)."""
    found = _CONTEXTS.get(problem.key)
    if found is None:
        found = _CONTEXTS[problem.key] = _build(problem)
    return found


def _build(problem: Problem) -> Context:
    data = dict(problem.data)
    for table in ("model", "parallel", "cluster"):
        if table not in data:
            raise ConfigError(f"[{table}]: missing table")
    spec = read_cluster(data["cluster"])
    world = spec.num_devices
    placeholder = {"dp": world, "global_batch": world}
    base = experiment_from_dict({**data, "parallel": placeholder}, name=problem.name,
                                base=Path(problem.base))
    space = read_space(problem.search, data["parallel"], model=base.model, world=world,
                       devices_per_server=spec.devices_per_server)
    analytic = Analytic(base.model, base.cluster, base.profile, network=base.network,
                        algo=base.algo)
    return Context(problem=problem, base=base, space=space, analytic=analytic)
