"""The byte-for-byte comparison of two output folders (`compare_outputs.py`, issue 37's check
that a refactoring changed no output) on two small folders: identical, one byte changed, a file
on one side only."""

from __future__ import annotations

from pathlib import Path

from compare_outputs import compare, main


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


FILES = {"a.simulate.json": b'{"step_time_s": 1.5}\n', "a.trace.json": bytes(range(256)) * 40,
         "a.simulate.exit": b"exit 0\n"}


def test_identical_folders_have_no_difference_and_exit_0(tmp_path, capsys):
    a, b = _folder(tmp_path / "a", FILES), _folder(tmp_path / "b", FILES)
    assert compare(a, b) == []
    assert main(["compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out.startswith("3 files byte-identical")


def test_one_byte_changed_in_a_file_of_the_same_size_is_named_and_exits_1(tmp_path, capsys):
    changed = bytearray(FILES["a.trace.json"])
    changed[5000] ^= 1
    a = _folder(tmp_path / "a", FILES)
    b = _folder(tmp_path / "b", {**FILES, "a.trace.json": bytes(changed)})
    assert compare(a, b) == ["differs: a.trace.json"]
    assert main(["compare", str(a), str(b)]) == 1
    assert capsys.readouterr().out == "differs: a.trace.json\n"


def test_a_file_on_one_side_only_is_named_with_its_side(tmp_path):
    a = _folder(tmp_path / "a", FILES)
    b = _folder(tmp_path / "b", {**FILES, "b.goodput.json": b"{}"})
    del_one = dict(FILES)
    del del_one["a.simulate.exit"]
    c = _folder(tmp_path / "c", del_one)
    assert compare(a, b) == [f"only in {b}: b.goodput.json"]
    assert compare(a, c) == [f"only in {a}: a.simulate.exit"]
