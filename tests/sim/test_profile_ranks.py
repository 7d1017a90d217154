"""Issue 22, item 17: a profile records the ranks it was measured with, and `validate` says
how they compare with its run's.

    pytest tests/sim/test_profile_ranks.py -q
"""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.profile import ComputeParams, Profile, load_profile
from sim.validation import ranks_note
from tests.sim.commands.test_simulate_cli import SMALL
from tests.sim.test_profile import _profile

COMPUTE = ComputeParams(gemm_efficiency=0.7)


def test_the_rank_count_round_trips_and_is_left_out_when_unknown(tmp_path):
    path = tmp_path / "p.json"
    Profile(name="here", compute=COMPUTE, calibrated=True, measured_on="CPU-localhost",
            measured_ranks=2).save(path)
    assert load_profile(path).measured_ranks == 2
    Profile(name="old", compute=COMPUTE).save(path)
    assert "measured_ranks" not in json.loads(path.read_text())  # older files read the same
    assert load_profile(path).measured_ranks is None


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (True, "True"), (2.5, "2.5"),
                                              ("4", "'4'"), (1 << 21, str(1 << 21))])
def test_a_bad_rank_count_is_one_line(capsys, tmp_path, value, shown):
    path = _profile(tmp_path, measured_ranks=value)
    config = tmp_path / "c.toml"
    config.write_text(SMALL)
    assert main(["simulate", str(config), "--profile", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"profile.measured_ranks: {shown} must be" in err


def test_validate_says_how_the_counts_compare():
    def profile(ranks, calibrated=True):
        return Profile(name="here", compute=COMPUTE, calibrated=calibrated,
                       measured_on="CPU-localhost", measured_ranks=ranks)

    assert ranks_note(profile(4), 4) == "the profile was measured with 4 ranks, as this run has"
    note = ranks_note(profile(2), 4)
    assert note is not None and note.startswith("the profile was measured with 2 ranks, "
                                                "this run has 4:")
    assert "does not record" in (ranks_note(profile(None), 4) or "")
    assert ranks_note(profile(None, calibrated=False), 4) is None  # defaults: measured nowhere
