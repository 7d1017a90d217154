"""Issue 36's hostile sweep, memory: a small gzipped trace whose many ops parse into more
memory than the machine has (9.9 M ops in 6 MB reached 5.7 GB in json.loads) is refused by
one line before parsing, for parasim traces and profiler traces alike; a MemoryError that
still happens is one line, exit 1."""

from __future__ import annotations

import gzip
import json

import pytest

from sim.cli import main
from traces import parse_memory
from traces.errors import ConfigError
from traces.kineto.files import read_document
from traces.parse_memory import MIN_PARSED_BYTES, available_bytes, check_parse_memory

OPS = 20_000


def parasim_trace(tmp_path):
    ops = ",".join(['{"kind":"compute","stream":"compute"}'] * OPS)
    text = ('{"schema":"parasim.trace","version":3,"meta":{},"ranks":{"0":[' + ops + "]}}")
    path = tmp_path / "many.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return path, len(text)


def test_meminfo_is_read_in_bytes(tmp_path, monkeypatch):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    1234567 kB\n")
    monkeypatch.setattr(parse_memory, "MEMINFO", str(info))
    assert available_bytes() == 1234567 * 1024
    monkeypatch.setattr(parse_memory, "MEMINFO", str(tmp_path / "absent"))
    assert available_bytes() is None
    check_parse_memory(10**15, 10**12, "x")  # unknown memory: nothing refused


def test_the_bound_is_twice_the_text_and_the_smallest_op_each(monkeypatch):
    need = 2 * 1000 + 10 * MIN_PARSED_BYTES
    monkeypatch.setattr(parse_memory, "available_bytes", lambda: need)
    check_parse_memory(1000, 10, "t")  # exactly fits
    monkeypatch.setattr(parse_memory, "available_bytes", lambda: need - 1)
    with pytest.raises(ConfigError, match=r"^t: parsing its 10 ops needs at least 0.0 GB"):
        check_parse_memory(1000, 10, "t")


def test_a_replay_too_big_to_parse_is_one_line(tmp_path, capsys, monkeypatch):
    path, size = parasim_trace(tmp_path)
    free = 2 * size + OPS * MIN_PARSED_BYTES - 1
    monkeypatch.setattr(parse_memory, "available_bytes", lambda: free)
    code = main(["replay", str(path), "--cluster", "dgx-h100"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"parasim: error: {path}: parsing its {OPS:,} ops needs at least")
    assert "this machine has available" in err


def test_a_profiler_trace_too_big_to_parse_is_refused(tmp_path, monkeypatch):
    events = [{"ph": "X", "name": "k", "ts": i, "dur": 1} for i in range(OPS)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(parse_memory, "available_bytes", lambda: OPS * MIN_PARSED_BYTES)
    with pytest.raises(ConfigError, match=f"parsing its {OPS:,} events needs at least"):
        read_document(path)


def test_a_memory_error_is_one_line_and_exit_1(capsys, monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("sim.commands.simulate.predict", exhausted)
    code = main(["simulate"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == ("parasim: error: out of memory: this machine cannot hold what the command "
                   "builds; ask for a smaller input\n")
