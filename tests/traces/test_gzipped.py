"""Gzipped parasim traces: `--trace X.json.gz` writes gzip, and every reader takes it back.

    pytest tests/traces/test_gzipped.py -q
"""

from __future__ import annotations

import gzip
import json

import pytest

from sim.cli import main
from tests.sim.commands.test_simulate_cli import SMALL
from traces.errors import ConfigError
from traces.gzipped import gunzip
from traces.io import load


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(SMALL)
    return path


def test_a_gz_trace_is_gzip_of_the_plain_one_and_loads_the_same(config, tmp_path, capsys):
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    assert main(["simulate", str(config), "--trace", str(plain)]) == 0
    assert main(["simulate", str(config), "--trace", str(packed)]) == 0
    raw = packed.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw) == plain.read_bytes()
    assert load(packed) == load(plain)
    capsys.readouterr()
    for path in (plain, packed):  # replay reads it as a parasim trace, not a profiler's
        assert main(["replay", str(path), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["source"] == "parasim"
        del out["trace"], out["parasim"]
        if path is plain:
            first = out
    assert out == first


def test_a_gz_name_that_is_not_gzip_is_one_line(config, tmp_path, capsys):
    fake = tmp_path / "t.json.gz"
    assert main(["simulate", str(config), "--trace", str(tmp_path / "t.json")]) == 0
    fake.write_bytes((tmp_path / "t.json").read_bytes())
    with pytest.raises(ConfigError, match=r"t\.json\.gz: not a gzip file \(named \.gz"):
        load(fake)


def test_gunzip_is_bounded_and_names_a_broken_file():
    bomb = gzip.compress(b"0" * 10_000, mtime=0)
    with pytest.raises(ConfigError, match=r"^x: decompresses to more than 100 bytes"):
        gunzip(bomb, "x", 100)
    with pytest.raises(ConfigError, match=r"^x\.gz: corrupt or truncated gzip"):
        gunzip(bomb[:20], "x.gz", 10**6)
    assert gunzip(b"{}", "x.json", 10) == b"{}"
