"""`parasim search` names devices as the step report does (`topology.cluster.Cluster.device_words`):
chips on a torus, GPUs elsewhere, in the text, the pruning reasons and the --report page.

    pytest tests/sim/search/test_search_words.py -q
"""

import dataclasses
import json

import pytest

from sim.search.engines import open_engine
from sim.search.output import result_text
from sim.search.problem import problem_from_dict
from sim.search.report import render_search_report, search_figure
from sim.search.run import search
from sim.search.space import MEMORY_REASON
from tests.sim.search.search_cases import TPU


@pytest.fixture(scope="module")
def tpu():
    with open_engine(workers=1) as engine:
        return search(problem_from_dict(TPU, name="tiny-tpu"), engine=engine, top_k=2)


def test_a_torus_search_says_chips(tpu):
    assert (tpu.device, tpu.devices) == ("chip", "chips")
    text = result_text(tpu)
    assert text.splitlines()[0] == "parasim search: tiny-tpu on tpu-v4 x2 torus (8 chips)"
    assert "fit in 32 GiB of chip memory" in text
    assert "GPU" not in text


def test_the_torus_report_says_chips(tpu):
    layout = search_figure(tpu).to_dict()["layout"]
    words = json.dumps(layout)
    assert "peak memory per chip (GiB)" in words and "chip memory" in words
    assert "GPU" not in words
    page = render_search_report(tpu)
    summary = page[page.index("<pre>"):page.index("</pre>")]
    assert "(8 chips)" in summary and "GPU" not in summary


def test_the_memory_reason_follows_the_device(tpu):
    pruned = dataclasses.replace(tpu, pruned={MEMORY_REASON: 3})
    assert "memory: the peak per chip exceeds the accelerator's memory" in result_text(pruned)
    on_gpus = dataclasses.replace(pruned, device="GPU", devices="GPUs")
    assert "memory: the peak per GPU exceeds the accelerator's memory" in result_text(on_gpus)
