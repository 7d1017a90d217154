"""Profiles a hostile user wrote (issue 22, items 1-3): every figure that would make a duration
non-finite or absurd, a link class no cluster has, a name of two lines, `"version": true` — each
one line and exit 2 through the command line, naming the field, the value and the rule; and the
profiles parasim writes itself still load."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from sim.cli import main
from sim.profile import DEFAULTS, KernelCost, LinkParams, Profile, load_profile, profile_from_json
from tests.sim.commands.test_simulate_cli import SMALL
from topology.cluster import LINK_KINDS
from topology.config import build_cluster
from topology.presets import PRESETS
from traces.errors import ConfigError, show
from traces.fields import MIN_EFFICIENCY

PROFILE = {"schema": "parasim.profile", "version": 2, "name": "p",
           "compute": {"gemm_efficiency": 0.7, "memory_efficiency": 0.8, "kernels": {}}}
EFFICIENCY_RULE = (f"must be an efficiency in [{MIN_EFFICIENCY:g}, 1] (below "
                   f"{MIN_EFFICIENCY:g} a kernel runs a million times under its roof)")
KNOWN_LINKS = "(known: nvlink, pcie, ib, ici, loopback)"


def _profile(tmp_path: Path, **changes: object) -> Path:
    """PROFILE with top-level keys replaced; `compute.X=` keys go into compute."""
    data = json.loads(json.dumps(PROFILE))
    for key, value in changes.items():
        if key.startswith("compute_"):
            data["compute"][key.removeprefix("compute_")] = value
        else:
            data[key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


def _refused(capsys, tmp_path: Path, expected: str, profile: Path) -> None:
    """`simulate --profile` exits 2 with nothing on stdout and exactly this one stderr line."""
    config = tmp_path / "c.toml"
    config.write_text(SMALL)
    code = main(["simulate", str(config), "--profile", str(profile)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err == f"parasim: error: --profile: {profile}: {expected}\n"


# --- 1. figures that make a duration non-finite or absurd ---------------------------------------

@pytest.mark.parametrize("value", [5e-324, 1e-300, 1e-100, 9.99e-7])
@pytest.mark.parametrize("where", ["gemm_efficiency", "memory_efficiency",
                                   "kernels.flash_attn.flops_efficiency",
                                   "kernels.fc1.memory_efficiency"])
def test_an_efficiency_below_the_floor_is_refused(capsys, tmp_path, where, value):
    if where.startswith("kernels."):
        _, kernel, key = where.split(".")
        path = _profile(tmp_path, compute_kernels={kernel: {key: value}})
    else:
        path = _profile(tmp_path, **{f"compute_{where}": value})
    _refused(capsys, tmp_path, f"profile.compute.{where}: {value!r} {EFFICIENCY_RULE}", path)


@pytest.mark.parametrize(("changes", "expected"), [
    ({"compute_launch_overhead_s": 1e300},
     "profile.compute.launch_overhead_s: 1e+300 must be at least 0 s and at most 1 s"),
    ({"compute_kernels": {"fc1": {"overhead_s": 5.0}}},
     "profile.compute.kernels.fc1.overhead_s: 5.0 must be at least 0 s and at most 1 s"),
    ({"compute_comm_interference": 1e300},
     "profile.compute.comm_interference: 1e+300 must be at least 0 and at most 10"),
    ({"compute_compute_interference": -1.0},
     "profile.compute.compute_interference: -1.0 must be at least 0 and at most 10"),
    ({"compute_compute_interference_delay_s": 2.0},
     "profile.compute.compute_interference_delay_s: 2.0 must be at least 0 s and at most 1 s"),
    ({"compute_roofline_exponent": 1e300},
     "profile.compute.roofline_exponent: 1e+300 must be at least 1 and at most 64"),
    ({"links": {"nvlink": {"bandwidth_Bps": 5e-324, "latency_s": 1e-6}}},
     "profile.links.nvlink.bandwidth_Bps: 5e-324 must be at least 1e+06 and at most 1e+14"),
    ({"links": {"ib": {"bandwidth_Bps": 1e9, "latency_s": 1e100}}},
     "profile.links.ib.latency_s: 1e+100 must be at least 0 s and at most 1 s"),
    ({"links": {"ib": {"bandwidth_Bps": 1e9, "latency_s": 0.0, "call_s": 1e9}}},
     "profile.links.ib.call_s: 1000000000.0 must be at least 0 s and at most 1 s"),
    ({"accelerator": {"peak_flops": 5e-324, "hbm_bandwidth_Bps": 1e9}},
     "profile.accelerator.peak_flops: 5e-324 must be at least 1e+09 and at most 1e+17"),
    ({"accelerator": {"peak_flops": 1e12, "hbm_bandwidth_Bps": 1e-300}},
     "profile.accelerator.hbm_bandwidth_Bps: 1e-300 must be at least 1e+06 and at most 1e+14"),
])
def test_every_other_figure_is_bounded(capsys, tmp_path, changes, expected):
    _refused(capsys, tmp_path, expected, _profile(tmp_path, **changes))


def test_the_floor_itself_loads_and_gives_a_finite_step(capsys, tmp_path):
    path = _profile(tmp_path, compute_gemm_efficiency=MIN_EFFICIENCY,
                    compute_memory_efficiency=MIN_EFFICIENCY, compute_roofline_exponent=64,
                    compute_kernels={k: {"flops_efficiency": MIN_EFFICIENCY,
                                         "memory_efficiency": MIN_EFFICIENCY}
                                     for k in ("flash_attn", "fc1")})
    config = tmp_path / "c.toml"
    config.write_text(SMALL)
    assert main(["simulate", str(config), "--profile", str(path), "--json"]) == 0
    step = json.loads(capsys.readouterr().out)["step_time_s"]
    assert math.isfinite(step) and step > 0


def test_an_efficiency_in_code_is_checked_too():
    with pytest.raises(ConfigError, match="compute.gemm_efficiency: 1e-100 must be an eff"):
        dataclasses.replace(DEFAULTS["A100-SXM4-80GB"], gemm_efficiency=1e-100)
    with pytest.raises(ConfigError, match="flops_efficiency: 5e-324 must be an efficiency"):
        KernelCost(flops_efficiency=5e-324)


# --- 2. a link class no cluster has ---------------------------------------------------------------

def test_a_misspelt_link_class_is_refused(capsys, tmp_path):
    path = _profile(tmp_path, links={"loopbak": {"bandwidth_Bps": 1e9, "latency_s": 1e-5}})
    _refused(capsys, tmp_path, f"links.loopbak: unknown link class {KNOWN_LINKS}", path)


def test_a_class_this_cluster_lacks_but_others_have_is_left_alone(capsys, tmp_path):
    """A profile fitted on servers with InfiniBand applies to a cluster without it (a TPU torus
    has no NVLink): the class is known, so the profile loads and the run succeeds."""
    path = _profile(tmp_path, links={"ici": {"bandwidth_Bps": 1e9, "latency_s": 1e-5}})
    config = tmp_path / "c.toml"
    config.write_text(SMALL)
    assert main(["simulate", str(config), "--profile", str(path), "--json"]) == 0


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_cluster_uses_known_link_classes(preset):
    kinds = set(build_cluster(preset).link_kind)
    assert kinds and kinds <= set(LINK_KINDS)


# --- 3. names of one line, versions that are integers ---------------------------------------------

@pytest.mark.parametrize(("name", "shown"), [("a\nb", "'a\\nb'"), ("", "''"),
                                              ("tab\there", "'tab\\there'"),
                                              ("x" * 201, show("x" * 201))])
def test_a_name_is_one_printable_line(capsys, tmp_path, name, shown):
    _refused(capsys, tmp_path, f"profile.name: {shown} must be one printable line of 1 to 200 "
             "characters", _profile(tmp_path, name=name))


def test_measured_on_is_one_printable_line(capsys, tmp_path):
    _refused(capsys, tmp_path, "profile.measured_on: 'H100\\r' must be one printable line of 1 "
             "to 200 characters", _profile(tmp_path, measured_on="H100\r"))


@pytest.mark.parametrize(("version", "shown"), [(True, "True"), (False, "False"), (2.0, "2.0"),
                                                (1.0, "1.0"), ("2", "'2'")])
def test_a_version_is_an_integer(capsys, tmp_path, version, shown):
    _refused(capsys, tmp_path, f"has version {shown}; this parasim reads version 2",
             _profile(tmp_path, version=version))


def test_version_1_is_still_named_as_such(capsys, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(SMALL)
    path = _profile(tmp_path, version=1)
    assert main(["simulate", str(config), "--profile", str(path)]) == 2
    assert "a version-1 profile" in capsys.readouterr().err


# --- what parasim writes still loads ----------------------------------------------------------

@pytest.mark.parametrize("accelerator", sorted(DEFAULTS))
def test_the_built_in_profiles_round_trip(tmp_path, accelerator):
    profile = Profile(name=f"default-{accelerator}", compute=DEFAULTS[accelerator],
                      links={"loopback": LinkParams(bandwidth_Bps=1.4e9, latency_s=8e-5,
                                                    call_s=3e-4)},
                      calibrated=True, measured_on=accelerator)
    profile.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == profile
    assert profile_from_json(profile.to_json()) == profile


def test_a_profile_in_code_refuses_a_link_class_no_cluster_has():
    with pytest.raises(ConfigError, match=r"^links.nvlnk: unknown link class \(known: nvlink,"):
        Profile(name="p", compute=DEFAULTS["CPU-localhost"],
                links={"nvlnk": LinkParams(bandwidth_Bps=1e9, latency_s=0.0)})
