"""`simulate --fail-if-oom`: exit 1 and one line when the fullest rank does not fit, after the
normal output; exit 0 and nothing more when it fits."""

import json

from sim.cli import main
from sim.config import example_path
from sim.simulate import size_text

TINY = str(example_path("gpt-tiny-localhost.toml"))


def test_a_rank_that_does_not_fit_exits_1_after_the_output(capsys):
    code = main(["simulate", TINY, "--set", "cluster.gpu_memory=1MiB", "--fail-if-oom",
                 "--json"])
    out, err = capsys.readouterr()
    data = json.loads(out)  # the normal output is all there
    assert code == 1 and data["fits"] is False
    assert data["memory_capacity_bytes"] == 2**20
    assert err.splitlines() == [f"parasim: error: --fail-if-oom: peak memory "
                                f"{size_text(data['peak_memory_bytes'])} does not fit in 1.0 MiB"]


def test_a_rank_that_fits_exits_0_and_without_the_flag_oom_is_no_error(capsys):
    assert main(["simulate", TINY, "--fail-if-oom", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["fits"] is True and err == ""
    assert main(["simulate", TINY, "--set", "cluster.gpu_memory=1MiB", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["fits"] is False and err == ""
