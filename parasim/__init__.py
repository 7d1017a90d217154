"""parasim's public calls, for a notebook or a script: the few the command line is built on.

    import parasim

    exp = parasim.load_config("llama3-70b-h100", settings=["parallel.micro_batch=2"])
    step = parasim.simulate(exp)                  # or simulate("my.toml"), a shipped name
    step.summary.step_time_s, step.json()         # the figures `parasim simulate --json` prints
    parasim.replay("step.json").json()            # a parasim, profiler or Chakra trace
    parasim.search("gpt3-175b-1024-a100-search", top=4).result.best
    parasim.goodput("llama3-405b-16k-h100-goodput", days=30).json()

Each call wraps the function its command runs (`sim.simulate.predict`, `sim.measured`,
`sim.search.run.search`, `sim.goodput`) and returns a small record holding its results, with
`json()` (the command's `--json` object, without the `parasim` provenance key) and `text()`
(its printed summary). Bad input raises `traces.errors.ConfigError` with the command line's
one-line message. Importing parasim never imports torch; the internal packages (`sim`,
`traces`, `topology`, `executor`) stay importable under their own names.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.config import Experiment, example_path
from sim.engine.replay import StepTimes
from sim.goodput.montecarlo import Outcome
from sim.goodput.plan import GoodputPlan
from sim.measured import ReplayResult
from sim.metrics import StepSummary
from sim.search.problem import Problem
from sim.search.run import DEFAULT_TOP, SearchResult
from traces.errors import ConfigError

__all__ = ["ConfigError", "Goodput", "Replayed", "Search", "Step", "goodput", "load_config",
           "replay", "search", "simulate"]

Config = str | Path
"""A TOML file's path, or the name of a shipped example (`sim/examples/`, with or without
.toml) where no such file exists."""


def config_file(config: Config) -> Path:
    """The file `config` names: an existing path as it is, else the shipped example of that
    name, else the path as given (its loading then says it is missing)."""
    path = Path(config)
    if path.is_file():
        return path
    shipped = example_path(path.name if path.suffix == ".toml" else f"{path.name}.toml")
    return shipped if shipped.is_file() and path.parent == Path(".") else path


def load_config(config: Config, *, settings: Sequence[str] = (),
                profile: str | Path | None = None) -> Experiment:
    """The experiment a config describes, checked, as `parasim simulate` reads it: `settings`
    holds `--set` texts ("parallel.tp=4", "model.dtype=fp8"), `profile` a calibration profile's
    path. Its `warnings` are those the command line prints."""
    from sim.settings import load_set_experiment, parse_settings

    overrides = {"profile": str(Path(profile).resolve())} if profile is not None else None
    return load_set_experiment(config_file(config), parse_settings(settings), overrides)


@dataclass(frozen=True)
class Step:
    """One simulated step: the experiment, its summary (step time, MFU, memory...) and the
    timed step (`times.timed_trace()` is what `--trace` writes)."""

    experiment: Experiment
    summary: StepSummary
    times: StepTimes

    def json(self) -> dict[str, Any]:
        from sim.simulate import summary_json

        return summary_json(self.experiment, self.summary)

    def text(self) -> str:
        from sim.simulate import summary_text

        return summary_text(self.experiment, self.summary)


def simulate(config: Config | Experiment, *, settings: Sequence[str] = (),
             fold: bool = True) -> Step:
    """Predict one training step (`parasim simulate`); `fold=False` simulates every rank
    instead of one per class of equal ranks (the same figures, slower)."""
    from sim.simulate import predict

    exp = config if isinstance(config, Experiment) else load_config(config, settings=settings)
    summary, times = predict(exp, fold=fold)
    return Step(exp, summary, times)


@dataclass(frozen=True)
class Replayed:
    """A trace re-simulated (`parasim replay`): `result` holds the step and the census."""

    result: ReplayResult

    def json(self) -> dict[str, Any]:
        from sim.commands.replay import summary_json

        return summary_json(self.result)

    def text(self) -> str:
        from sim.commands.replay import summary_text

        return summary_text(self.result)


def replay(trace: str | Path, *, cluster: str | None = None, nodes: int | None = None,
           fabric: str | None = None, profile: str | Path | None = None,
           retime: bool = False, network: str | None = None, algo: str = "auto",
           host_gaps: bool = True, allow_incomplete: bool = False) -> Replayed:
    """Re-simulate a measured or predicted trace (`parasim replay`): a parasim trace, a
    PyTorch-profiler JSON, a folder of per-rank files or of Chakra ET files; the cluster is
    the one a parasim trace names unless `cluster` (a preset or a TOML file) is given."""
    from sim.collectives import parse_algorithm
    from sim.engine.transport import NetworkMode
    from sim.measured import choose_cluster, load_trace, replay_trace
    from sim.profile import load_profile

    loaded = load_trace(trace, allow_incomplete=allow_incomplete)
    built = choose_cluster(loaded.trace, cluster, nodes=nodes, fabric=fabric).build()
    calibrated = load_profile(str(profile)) if profile is not None else None
    if calibrated is not None:  # its measured link classes and roofs replace the preset's
        built = calibrated.applied_to(built)
    return Replayed(replay_trace(loaded, built, calibrated, retime=retime,
                                 network=None if network is None else NetworkMode(network),
                                 algo=parse_algorithm(algo), host_gaps=host_gaps))


@dataclass(frozen=True)
class Search:
    """A layout search (`parasim search`): the problem as read and its ranked result
    (`result.best`, `result.simulated`, `result.feasible`, `result.pruned`)."""

    problem: Problem
    result: SearchResult

    def json(self) -> dict[str, Any]:
        from sim.search.output import result_json

        return result_json(self.result)

    def text(self) -> str:
        from sim.search.output import result_text

        return result_text(self.result)


def search(config: Config, *, settings: Sequence[str] = (), gpus: int | None = None,
           top: int = DEFAULT_TOP, workers: int = 1) -> Search:
    """Screen a config's `[search]` space analytically, simulate the best `top` in full
    (`parasim search`); `gpus` sets the cluster's size, `workers` the local processes (1:
    this one)."""
    from sim.search.engines import open_engine
    from sim.search.problem import problem_from_dict
    from sim.search.run import search as run_search
    from sim.settings import load_search_config, named_as_flags, parse_settings, search_tables

    path = config_file(config)
    read = parse_settings(settings, search_tables())
    with named_as_flags(read):
        problem = problem_from_dict(load_search_config(path, read), name=path.stem,
                                    base=path.parent, gpus=gpus)
    with open_engine(workers) as engine:
        return Search(problem, run_search(problem, engine=engine, top_k=top))


@dataclass(frozen=True)
class Goodput:
    """A whole run with failures, checkpoints and restarts (`parasim goodput`): the plan (the
    step, the failure rates, the checkpoint interval) and the Monte-Carlo outcome."""

    plan: GoodputPlan
    outcome: Outcome

    def json(self) -> dict[str, Any]:
        from sim.goodput.outputs import goodput_json

        return goodput_json(self.plan, self.outcome)

    def text(self) -> str:
        from sim.goodput.text import goodput_text

        return goodput_text(self.plan, self.outcome)


def goodput(config: Config | Experiment, *, settings: Sequence[str] = (),
            days: float | None = None, tokens: float | None = None, runs: int | None = None,
            seed: int | None = None) -> Goodput:
    """The wall time and goodput of training to a target (`days` of failure-free training's
    tokens, 30 by default, or `tokens`), with the config's `[reliability]` or the default
    one; `runs` and `seed` replace its Monte-Carlo's."""
    from sim.commands.goodput import _flags
    from sim.goodput.montecarlo import check_events, simulate_run
    from sim.goodput.plan import plan_run, target_tokens
    from sim.goodput.settings import reliability_or_default
    from sim.simulate import predict

    if days is not None and tokens is not None:
        raise ConfigError("goodput: give days or tokens, not both")
    exp = config if isinstance(config, Experiment) else load_config(config, settings=settings)
    chosen = _flags(reliability_or_default(exp.reliability),
                    argparse.Namespace(runs=runs, seed=seed))
    exp = replace(exp, reliability=chosen)
    summary, _ = predict(exp)
    plan = plan_run(exp, summary, target=target_tokens(days, tokens, summary.tokens_per_s))
    check_events(plan.model, plan.runs, plan.expected_wall_s)
    return Goodput(plan, simulate_run(plan.model, runs=plan.runs, seed=plan.seed))
