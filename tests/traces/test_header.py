"""The typed trace header: `TraceMeta` to JSON and back, older spellings, one-line errors.
Run: pytest tests/traces/test_header.py -q
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from traces import io
from traces.errors import ConfigError
from traces.header import ClusterTable, FoldClasses, TraceMeta, check_fold_ranks
from traces.header_json import meta_from_json, meta_to_json
from traces.layout import Layout
from traces.model import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = Layout(tp=2, pp=2, dp=4, global_batch=16)
MODEL = ModelSpec(layers=4, hidden=128, heads=4, seq_len=64, vocab=512, dtype="fp32")
FULL = TraceMeta(
    model=MODEL, layout=LAYOUT, world=16, fold=LAYOUT,
    fold_classes=FoldClasses((0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12)),
    experiment="tiny",
    cluster_name="dgx-h100 x2 rail",
    cluster_spec=ClusterTable(preset="dgx-h100", nodes=2, fabric="rail",
                              overrides=(("dims", (4, 4)), ("nic_bandwidth", "200Gb/s"),
                                         ("sharp", True))),
    network="flow", timed=True, memory={0: ((0.0, 2.0**30), (0.5, 1.5)), 8: ((0.0, 1.0),)},
    devices="GPUs", source="kineto", world_size=16, ranks=(0, 8), measured=True, host="h",
    platform="Linux", torch="2.13.0", backend="gloo",
    config={"steps": 1, "layout": LAYOUT.to_dict()}, complete=False, error="rank 1 failed",
    clock="shared clock", step_seconds=(0.25, 0.125), peak_memory_bytes={0: 10, 8: 12},
    clock_offsets_ns={0: 0, 8: -5}, clock_error_ns={0: 0, 8: 3},
    host_probe={"collective": "all_reduce", "ranks": 16, "samples": [[4, 1e-4]]},
    process_groups={0: [{"name": "0", "ranks": [0, 8]}]}, files={0: "r0.json"},
    compute_from="cpu", num_group_assumed=1, num_size_unknown=2, skipped={"phase C": 1},
    bench={"version": 1, "sections": []}, extras={"mfu": 0.4, "note": [1, "x"]})


def _back(meta: TraceMeta, version: int = io.VERSION) -> TraceMeta:
    return meta_from_json(json.loads(json.dumps(meta_to_json(meta))), version)


# --- round trips -----------------------------------------------------------------------------

def test_every_field_survives_the_json_round_trip():
    assert all(getattr(FULL, f.name) not in (None, {}) for f in dataclasses.fields(FULL)), \
        "the fixture states every field, so a new field must be added here"
    assert _back(FULL) == FULL
    assert _back(TraceMeta()) == TraceMeta() and meta_to_json(TraceMeta()) == {}


def test_the_json_keys_are_the_files_and_extras_come_last():
    document = meta_to_json(FULL)
    assert document["cluster"] == "dgx-h100 x2 rail"
    assert document["cluster_spec"] == {"preset": "dgx-h100", "nodes": 2, "fabric": "rail",
                                        "dims": [4, 4], "nic_bandwidth": "200Gb/s",
                                        "sharp": True}
    assert document["fold"] == {"axes": ["tp", "dp"], "layout": LAYOUT.to_dict()}
    assert document["memory"]["8"] == [[0.0, 1.0]] and document["peak_memory_bytes"] == {
        "0": 10, "8": 12}
    assert list(document)[:4] == ["model", "layout", "world", "fold"]
    assert list(document)[-2:] == ["mfu", "note"]


def test_a_plan_trace_file_round_trips_its_header(tmp_path):
    trace = io.Trace({0: (), 8: ()}, dataclasses.replace(FULL, source=None))
    io.save(trace, tmp_path / "t.json")
    assert io.load(tmp_path / "t.json").meta == trace.meta


def test_replace_sets_a_field_and_keeps_the_rest():
    timed = dataclasses.replace(TraceMeta(world=4), timed=True)
    assert (timed.world, timed.timed, meta_to_json(timed)) == (4, True, {"world": 4,
                                                                         "timed": True})


# --- older files -----------------------------------------------------------------------------

def test_version_1_folded_true_reads_the_plan_folded_with_its_own_layout():
    meta = meta_from_json({"folded": True, "layout": LAYOUT.to_dict(), "world": 16}, 1)
    assert meta.fold == meta.layout == LAYOUT and "folded" not in meta.extras
    assert meta_to_json(meta)["fold"]["layout"] == LAYOUT.to_dict()  # written the new way
    assert meta_from_json({"folded": False, "layout": LAYOUT.to_dict()}, 1).fold is None
    with pytest.raises(ConfigError, match=r"^trace: meta\.layout\.tensor: unknown key"):
        meta_from_json({"folded": True, "layout": {"tensor": 2}}, 1)


def test_before_version_3_the_display_name_states_the_cluster():
    old = meta_from_json({"cluster": "dgx-a100 x128 fat-tree"}, 2)
    assert old.cluster_spec == ClusterTable(preset="dgx-a100", nodes=128, fabric="fat-tree")
    assert old.cluster_name == "dgx-a100 x128 fat-tree"
    assert meta_from_json({"cluster": "my lab"}, 2).cluster_spec is None
    assert meta_from_json({"cluster": "a xb c"}, 1).cluster_spec is None
    # from version 3 on the name is a label only: no spec is made up from it
    assert meta_from_json({"cluster": "dgx-a100 x128 fat-tree"}, 3).cluster_spec is None


def test_a_version_2_file_loads_with_its_meta(tmp_path):
    document = {"schema": io.SCHEMA, "version": 2, "ranks": {"0": []}, "meta": {
        "layout": LAYOUT.to_dict(), "world": 16, "cluster": "dgx-h100 x2 rail",
        "fold": {"axes": ["tp", "dp"], "layout": LAYOUT.to_dict()}, "timed": True}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    meta = io.load(path).meta
    assert (meta.fold, meta.world, meta.timed) == (LAYOUT, 16, True)
    assert meta.cluster_spec == ClusterTable(preset="dgx-h100", nodes=2, fabric="rail")


def test_no_code_reads_a_cluster_display_name_but_the_legacy_loader():
    """The display name is parsed back in one place only: the marked version-2 reader."""
    sources = [p for folder in ("sim", "topology", "traces", "executor")
               for p in (ROOT / folder).rglob("*.py")]
    assert not [p for p in sources if "_CLUSTER_NAME" in p.read_text() or
                r"x(\d+)" in p.read_text()]
    readers = [p.relative_to(ROOT).as_posix() for p in sources
               if "cluster_name" in p.read_text() and ".split(" in p.read_text()]
    assert readers == ["traces/header_json.py"]
    assert "LEGACY (trace versions 1 and 2)" in (ROOT / "traces/header_json.py").read_text()
    found = subprocess.run(["grep", "-rn", "--include=*.py", "read_fold", "sim", "traces",
                            "executor"], cwd=ROOT, capture_output=True, text=True)
    assert found.stdout == ""  # the fold is read once, by the loader


# --- bad input: one line naming the field ----------------------------------------------------

@pytest.mark.parametrize(("raw", "line"), [
    ({"world": "16"}, "trace: meta.world: '16' must be a positive integer"),
    ({"world": 0}, "trace: meta.world: 0 must be a positive integer"),
    ({"timed": "yes"}, "trace: meta.timed: 'yes' must be true or false"),
    ({"model": {"layers": 2, "hidden": 10, "heads": 3, "seq_len": 8, "vocab": 8}},
     "trace: meta.model.hidden: 10 is not divisible by model.heads = 3"),
    ({"model": {"layers": 2, "depth": 1}}, "trace: meta.model.depth: unknown key"),
    ({"model": "gpt"}, "trace: meta.model: 'gpt' must be an object"),
    ({"layout": [1]}, "trace: meta.layout must be an object of the [parallel] keys"),
    ({"layout": {"tp": "x"}}, "trace: meta.layout.tp: 'x' must be an"),
    ({"fold": {"axes": ["tp"], "layout": {}}}, "trace: meta.fold must be an object with "
                                               "\"axes\": ['tp', 'dp']"),
    ({"fold": {"axes": ["tp", "dp"], "layout": {"zero": 1.0}}},
     "trace: meta.fold.layout.zero: 1.0 must be 0, "),
    ({"fold": {"axes": ["tp", "dp"], "layout": {"dp": 4, "global_batch": 4}}, "world": 16},
     "trace: meta.fold.layout: tp 1 x cp 1 x pp 1 x dp 4 = 4 ranks, but meta.world is 16"),
    ({"fold_classes": {"rep_of": [0]}},
     "trace: meta.fold_classes: classes of ranks need the meta's 'layout'"),
    ({"layout": LAYOUT.to_dict(), "fold_classes": {"rep_of": [0, 0]}},
     "trace: meta.fold_classes.rep_of: 2 ranks, but meta.layout has 16"),
    ({"layout": LAYOUT.to_dict(), "fold_classes": {"rep_of": [0, 0, 1] + [0] * 13}},
     "trace: meta.fold_classes.rep_of: rank 2's representative 1 is not a rank at or before "
     "it that stands for itself"),
    ({"layout": LAYOUT.to_dict(), "fold_classes": {"rep_of": [0] * 16, "cp_step": 1}},
     "trace: meta.fold_classes.cp_step: 1 does not divide cp 1"),
    ({"fold_classes": {"reps": []}}, "trace: meta.fold_classes.reps: unknown key"),
    ({"cluster_spec": {"preset": "dgx-h100", "fabric": "rail"}},
     "trace: meta.cluster_spec: no 'nodes' (a cluster table states its preset, nodes and "
     "fabric)"),
    ({"cluster_spec": {"preset": "dgx-h100", "nodes": 2, "fabric": "rail", "dims": {}}},
     "trace: meta.cluster_spec.dims: {} must be a string, number, boolean or list of numbers"),
    ({"memory": {"0": [1, 2]}}, "trace: meta.memory must map ranks to [[time_s, bytes], ...]"),
    ({"memory": {"x": []}}, "trace: meta.memory must map ranks to [[time_s, bytes], ...]"),
    ({"peak_memory_bytes": {"01": 5}}, "trace: meta.peak_memory_bytes: key '01' is not a rank"),
    ({"peak_memory_bytes": {"0": -5}}, "trace: meta.peak_memory_bytes.0: -5 must be a "
                                       "non-negative integer"),
    ({"step_seconds": [0.1, "x"]}, "trace: meta.step_seconds: 'x' must be a finite number"),
    ({"ranks": 3}, "trace: meta.ranks: 3 must be a list"),
    ({"skipped": {"phase C": 1.5}}, "trace: meta.skipped.phase C: 1.5 must be a non-negative "
                                    "integer"),
])
def test_a_bad_field_is_one_line_naming_it(raw, line):
    with pytest.raises(ConfigError) as info:
        meta_from_json(raw, io.VERSION)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_a_bad_meta_in_a_file_is_one_line_on_load(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema": io.SCHEMA, "version": 3, "ranks": {},
                                "meta": {"world": -1}}))
    with pytest.raises(ConfigError, match=r"^trace: meta\.world: -1 must be a positive"):
        io.load(path)


def test_a_folded_plan_holds_its_representatives():
    check_fold_ranks(LAYOUT, [8, 0])
    check_fold_ranks(None, [3])
    with pytest.raises(ConfigError, match=r"^trace: meta\.fold\.layout: folds onto ranks "
                                          r"\[0, 8\] \(one per pipeline stage\), but the trace "
                                          r"holds ranks \[0\]$"):
        check_fold_ranks(LAYOUT, [0])
    classes = FULL.fold_classes
    assert classes is not None
    check_fold_ranks(classes, [12, 8, 4, 0])
    with pytest.raises(ConfigError, match=r"^trace: meta\.fold_classes: folds onto ranks "
                                          r"\[0, 4, 8, 12\] \(one per class\), but the "
                                          r"trace holds ranks \[0, 8\]$"):
        check_fold_ranks(classes, [0, 8])


def test_the_header_module_imports_no_topology():
    code = ("import sys, traces.io, traces.header_json; "
            "assert not [m for m in sys.modules if m.startswith(('topology', 'sim'))]")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
