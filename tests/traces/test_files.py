"""Reading inputs and writing outputs safely (traces/files.py): regular files only, bounded
reads, bounded nesting, outputs checked first and written all or none."""

import json
import os
import re
import stat

import pytest

from traces import files
from traces.errors import ConfigError
from traces.files import Outputs, check_output, check_outputs, load_json, load_toml, read_bytes


def raises(message: str):
    return pytest.raises(ConfigError, match=re.escape(message))


# --- reading ----------------------------------------------------------------------------------

def test_reads_a_regular_file_up_to_its_limit(tmp_path):
    path = tmp_path / "a.toml"
    path.write_bytes(b"x" * 10)
    assert read_bytes(path, limit=10) == b"x" * 10
    with raises(f"--cluster: {path}: larger than 9 bytes"):
        read_bytes(path, what="--cluster", limit=9)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_devices_are_refused_before_reading(device):
    with raises(f"{device}: not a regular file"):
        read_bytes(device)


def test_fifo_directory_missing_and_nul_byte(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    with raises(f"{fifo}: not a regular file"):  # and no wait for a writer
        read_bytes(fifo)
    with raises(f"{tmp_path}: cannot read: Is a directory"):
        read_bytes(tmp_path)
    with raises(f"{tmp_path / 'nope'}: cannot read: No such file or directory"):
        read_bytes(tmp_path / "nope")
    with raises("cannot read: embedded null byte"):
        read_bytes("a\0b")


def test_toml_errors_are_one_line_naming_the_file(tmp_path):
    path = tmp_path / "c.toml"
    cases = {
        b"[a\n": "not valid TOML: Expected ']'",
        "x = 'caf\xe9'".encode("latin-1"): "not valid TOML: not UTF-8 text (invalid "
                                           "continuation byte at byte 8)",
        b"x = " + b"[" * 10_000 + b"]" * 10_000: "not valid TOML: nested too deeply",
        (".".join(["a"] * 17) + " = 1").encode(): "line 1: keys nested more than 16 deep",
    }
    for text, message in cases.items():
        path.write_bytes(text)
        with pytest.raises(ConfigError) as caught:
            load_toml(path)
        assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)


def test_the_depth_check_ignores_dots_in_strings_and_decimals(tmp_path):
    path = tmp_path / "c.toml"
    floats = ", ".join(f"{i}.5" for i in range(200))
    path.write_text(f'x = [{floats}]\ny = "{"." * 500}"\nz = \'{"a." * 100}\'\n'
                    + ".".join(["a"] * 16) + " = 1\n")
    data = load_toml(path)
    assert len(data["x"]) == 200 and data["y"] == "." * 500


def test_json_errors(tmp_path):
    path = tmp_path / "p.json"
    for text, message in {b"[" * 100_000: "not a JSON file: nested too deeply",
                          b"\xff\xfe{}": "not a JSON file: not UTF-8 text",
                          b"{": "not a JSON file: Expecting property name"}.items():
        path.write_bytes(text)
        with raises(f"--profile: {path}: {message}"):
            load_json(path, what="--profile")
    path.write_text(json.dumps({"a": [1, 2]}))
    assert load_json(path) == {"a": [1, 2]}


# --- output checks ----------------------------------------------------------------------------

def test_output_paths_that_cannot_become_a_regular_file(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("")
    cases = {
        "": "--trace: an empty path names no file",
        "newdir/": "--trace: 'newdir/' ends with '/', so it names a directory",
        str(tmp_path): f"--trace: {tmp_path} is a directory",
        "/dev/null": "--trace: /dev/null is not a regular file",
        str(tmp_path / "no" / "t.json"): f"--trace: directory {tmp_path / 'no'} does not exist",
        str(tmp_path / ("x" * 300)): "is longer than the 255 bytes",
        str(config): f"--trace: {config} is an input of this run",
    }
    for path, message in cases.items():
        with raises(message):
            check_output(path, "--trace", inputs=[config])
    assert check_output(str(tmp_path / "t.json"), "--trace") == tmp_path / "t.json"


def test_a_link_is_followed_to_the_file_it_names(tmp_path):
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "null.json").symlink_to("/dev/null")
    assert check_output(str(tmp_path / "link.json"), "--trace") == tmp_path / "real.json"
    with raises("is not a regular file"):
        check_output(str(tmp_path / "null.json"), "--trace")


def test_two_flags_may_not_name_one_file(tmp_path):
    target = str(tmp_path / "t.json")
    with raises(f"--chrome: {target} is also the --trace output"):
        check_outputs({"--trace": target, "--chrome": target, "--report": None})


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only directories")
def test_a_read_only_directory_is_refused(tmp_path):
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with raises("is not writable"):
            check_output(str(tmp_path / "t.json"), "--trace")
    finally:
        tmp_path.chmod(stat.S_IRWXU)


# --- all-or-none writes -----------------------------------------------------------------------

def test_outputs_appear_only_on_commit_under_short_temporary_names(tmp_path):
    a, b = tmp_path / ("a" * 250), tmp_path / "b.json"
    with Outputs() as outputs:
        outputs.write(a, "A")
        outputs.write(b, "B")
        temporaries = os.listdir(tmp_path)
        assert len(temporaries) == 2 and all(len(n) < 30 for n in temporaries)
        outputs.commit()
    assert a.read_text() == "A" and b.read_text() == "B"
    assert sorted(os.listdir(tmp_path)) == sorted([a.name, b.name])


def test_a_failure_removes_everything_this_run_wrote(tmp_path):
    old = tmp_path / "old.json"
    old.write_text("keep")
    with pytest.raises(KeyboardInterrupt), Outputs() as outputs:
        outputs.write(tmp_path / "a.json", "A")
        outputs.commit()
        outputs.write(tmp_path / "b.json", "B")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["old.json"] and old.read_text() == "keep"


def test_commit_refuses_a_target_that_became_a_device(tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    with pytest.raises(ConfigError, match="not a regular file"), Outputs() as outputs:
        outputs.write(target, "T")
        target.mkdir()  # something else appeared where the output goes
        outputs.commit()
    assert os.listdir(tmp_path) == ["t.json"] and target.is_dir()


def test_write_text_atomic_refuses_device_files():
    with raises("/dev/null: cannot write: not a regular file"):
        files.write_text_atomic("/dev/null", "x")
