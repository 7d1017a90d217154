"""Reading input files and writing output files safely, for every command.

Reading (`read_bytes`, `load_toml`, `load_json`): regular files only (a device such as
/dev/zero, a pipe or a directory is refused at once, before a byte is read), at most a bounded
number of bytes, UTF-8 only, and nesting bounded, so an endless, binary or 100,000-deep input is
one `ConfigError` line naming the file, never a hang, a MemoryError or a RecursionError.

Writing: `check_output` refuses, before any work is done, an output path that cannot become a
regular file of this run (empty, ending in '/', a directory, a device, an input of the run, in
a missing or read-only directory, a name too long). `Outputs` writes a run's files all or none:
each goes to a short temporary name beside its target, and only when every one is complete are
they renamed into place; on an error or Ctrl-C every file this run wrote is removed, and so is
what an earlier run left at an output path this one was given (the line says so).
`write_text_atomic` is the one-file form.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from traces.errors import ConfigError

PathLike = str | os.PathLike[str]

MAX_CONFIG_BYTES = 2**20
"""1 MiB: a config or profile is a few KiB; tomllib takes seconds on 16 MiB of hostile TOML."""
MAX_TRACE_BYTES = 2 * 2**30
"""2 GiB: a 1024-GPU plan is ~100 MiB of JSON."""
MAX_KEY_DEPTH = 16
"""Dotted TOML keys nested deeper than this are refused before parsing: tomllib's cost grows
with the cube of a dotted key's depth (30,000 levels take 20 s; a 1 MiB file of 64-deep keys
3 s, of 16-deep keys under 2 s). A parasim config nests two deep."""
_TEMP_PREFIX = ".parasim-"  # temporaries are ".parasim-XXXXXXXX.tmp", whatever the target's name


def _label(path: PathLike, what: str | None) -> str:
    return f"{what}: {path}" if what else str(path)


# --- reading ---------------------------------------------------------------------------------

def read_bytes(path: PathLike, *, what: str | None = None,
               limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them; `what` (e.g. '--profile')
    prefixes the messages."""
    label = _label(path, what)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"{label}: cannot read: {reason}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{label}: cannot read: Is a directory")
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{label}: not a regular file (a device, pipe or socket); "
                              "parasim reads only regular files")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise ConfigError(f"{label}: cannot read: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ConfigError(f"{label}: larger than {limit:,} bytes, the most parasim reads "
                          "from such a file")
    return data


def _text(raw: bytes, label: str, kind: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{label}: not {kind}: not UTF-8 text ({err.reason} at byte "
                          f"{err.start})") from None


def parse_json(raw: bytes, label: str) -> Any:
    """JSON from UTF-8 bytes; any problem is one ConfigError line starting with `label`."""
    text = _text(raw, label, "a JSON file")
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{label}: not a JSON file: nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, and int() of more than 4,300 digits
        raise ConfigError(f"{label}: not a JSON file: {_reason(err)}") from None


def load_json(path: PathLike, *, what: str | None = None,
              limit: int = MAX_CONFIG_BYTES) -> Any:
    """Read and parse a JSON file (see `read_bytes` and `parse_json`)."""
    return parse_json(read_bytes(path, what=what, limit=limit), _label(path, what))


def load_toml(path: PathLike, *, what: str | None = None) -> dict[str, Any]:
    """Read and parse a TOML file (see `read_bytes`); keys nested deeper than 16 are refused."""
    label = _label(path, what)
    text = _text(read_bytes(path, what=what), label, "valid TOML")
    _check_key_depth(text, label)
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{label}: not valid TOML: nested too deeply") from None
    except ValueError as err:  # TOMLDecodeError, and int() of more than 4,300 digits
        raise ConfigError(f"{label}: not valid TOML: {_reason(err)}") from None


def _reason(err: ValueError) -> str:
    """A parser's error for a user: Python's limit on digits converted to an integer is named
    as what the file holds, not as the `sys` call that would lift it."""
    if "integer string conversion" in str(err):
        return f"a number of more than {sys.get_int_max_str_digits():,} digits"
    return str(err)


_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'')
_FLOAT = re.compile(r"\d[\d_]*\.\d[\d_]*")


def _check_key_depth(text: str, label: str) -> None:
    """Refuse a line whose dots outside strings and decimals nest keys deeper than 16."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.count(".") >= MAX_KEY_DEPTH:  # the common case skips the closer look
            bare = _FLOAT.sub("", _STRING.sub("", line))
            if bare.count(".") >= MAX_KEY_DEPTH:  # n dots join n + 1 keys
                raise ConfigError(f"{label}: line {number}: keys nested more than "
                                  f"{MAX_KEY_DEPTH} deep")


# --- writing ---------------------------------------------------------------------------------

def check_output(path: str, flag: str, *, inputs: Iterable[PathLike] = ()) -> Path:
    """The file `path` (a `flag` such as '--trace') will be, checked before any work: refuse
    what could not become a regular file of this run. Links are followed (the file a link
    points to is the one written)."""
    if not path:
        raise ConfigError(f"{flag}: an empty path names no file")
    if path.endswith(("/", os.sep)):
        raise ConfigError(f"{flag}: {path!r} ends with '/', so it names a directory; "
                          "give a file name")
    try:  # only the OS's own errors here: a ConfigError raised inside would be wrapped again
        target = Path(os.path.realpath(path))
        parent = target.parent
        parent_is_dir = parent.is_dir()
        limit = _name_max(parent) if parent_is_dir else 0
        too_long = len(os.fsencode(target.name)) > limit
        mode = target.stat().st_mode if parent_is_dir and not too_long and target.exists() \
            else None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise ConfigError(f"{flag}: {path}: {getattr(err, 'strerror', None) or err}") from None
    if not parent_is_dir:
        raise ConfigError(f"{flag}: directory {parent} does not exist")
    if too_long:
        raise ConfigError(f"{flag}: file name {target.name[:40]!r}... is longer than the "
                          f"{limit} bytes this file system allows")
    if mode is not None and stat.S_ISDIR(mode):
        raise ConfigError(f"{flag}: {path} is a directory; give a file name")
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(f"{flag}: {path} is not a regular file (a device, pipe or socket); "
                          "parasim writes outputs only to regular files")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: directory {parent} is not writable")
    for source in inputs:
        with contextlib.suppress(OSError):
            if target.exists() and os.path.samefile(target, source):
                raise ConfigError(f"{flag}: {path} is an input of this run; parasim will not "
                                  "overwrite it")
    return target


def check_outputs(outputs: dict[str, str | None], *,
                  inputs: Iterable[PathLike] = ()) -> dict[str, Path]:
    """`check_output` for each given flag -> path (None: not asked for); two flags may not
    name one file."""
    sources = list(inputs)
    checked: dict[str, Path] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        target = check_output(path, flag, inputs=sources)
        for other, seen in checked.items():
            if seen == target:
                raise ConfigError(f"{flag}: {path} is also the {other} output")
        checked[flag] = target
    return checked


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _target_mode(target: Path) -> int:
    """Keep the mode of the file we replace, else the usual 0644 (mkstemp creates 0600)."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        return 0o644


def _remove_quietly(path: PathLike) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _cannot_write(target: PathLike, err: OSError) -> ConfigError:
    return ConfigError(f"{target}: cannot write: {err.strerror or err}")


class Outputs:
    """The output files of one run, all or none.

        with Outputs() as outputs:
            outputs.write(path, text)       # to a temporary beside path, synced
            ...
            outputs.commit()                # every temporary renamed over its target
            print(summary)                  # a failure here still removes the outputs

    Leaving the block by an exception (Ctrl-C included) removes every temporary and every
    target this run has already renamed into place, and also the file an earlier run left at
    each of `named` (the outputs the command was asked for, checked by `check_outputs`): a
    failed run leaves no file that looks like its output. The exception then carries a note
    naming what was removed (`removed_note`), which the command line adds to its one line.
    """

    def __init__(self, named: Iterable[PathLike] = ()) -> None:
        self._staged: dict[Path, Path] = {}  # target -> its temporary
        self._written: list[Path] = []
        self._named = [Path(path) for path in named]

    def write(self, target: PathLike, text: str | bytes) -> None:
        """Write `text` (UTF-8), or bytes as they are, to a new temporary file beside
        `target`, flushed to disk."""
        target = Path(target)
        try:
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX, suffix=".tmp")
        except OSError as err:
            raise _cannot_write(target, err) from None
        previous = self._staged.pop(target, None)
        if previous is not None:
            _remove_quietly(previous)
        self._staged[target] = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(text.encode("utf-8") if isinstance(text, str) else text)
                out.flush()
                os.fsync(out.fileno())
        except OSError as err:
            raise _cannot_write(target, err) from None

    def commit(self) -> None:
        """Rename every temporary over its target (refusing, again, a target that has become
        anything but a regular file since it was checked)."""
        for target, temporary in list(self._staged.items()):
            try:
                if target.exists() and not target.is_file():
                    raise ConfigError(f"{target}: not a regular file; parasim writes outputs "
                                      "only to regular files")
                os.chmod(temporary, _target_mode(target))
                os.replace(temporary, target)
            except OSError as err:
                raise _cannot_write(target, err) from None
            del self._staged[target]
            self._written.append(target)

    def discard(self) -> None:
        """Remove every temporary and every output this run has written."""
        for temporary in self._staged.values():
            _remove_quietly(temporary)
        for target in self._written:
            _remove_quietly(target)
        self._staged.clear()
        self._written.clear()

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is not None:
            self.discard()
            removed = [path for path in self._named if _remove_earlier(path)]
            if removed and error is not None:
                error.add_note(f"removed the earlier {', '.join(map(str, removed))} so it is "
                               "not taken for this run's output")


def _remove_earlier(path: Path) -> bool:
    """Remove the regular file at `path`, if there is one; whether one was removed."""
    try:
        if not path.is_file():
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def removed_note(error: BaseException) -> str:
    """The notes `Outputs` added to `error`, as the tail of its one line ('' if none)."""
    return "".join(f"; {note}" for note in getattr(error, "__notes__", ()))


def write_text_atomic(path: PathLike, text: str | bytes) -> None:
    """Write one file atomically: readers see the old file or the whole new one, never a
    prefix; on any error (or Ctrl-C) the temporary is removed and the old file is untouched.
    A target that exists and is not a regular file (/dev/null) is refused."""
    target = Path(path)
    if target.exists() and not target.is_file():
        raise ConfigError(f"{target}: cannot write: not a regular file; parasim writes outputs "
                          "only to regular files")
    outputs = Outputs()
    try:
        outputs.write(target, text)
        outputs.commit()
    except BaseException:
        outputs.discard()
        raise
