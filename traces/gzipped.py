"""Gzipped trace files, written and read in one place: a path ending in ".gz" is gzip.

    write_text_atomic(path, text_or_gzip(text, path))     # parasim traces, Chrome traces
    raw = gunzip(read_bytes(path, limit=L), str(path), L)  # whatever was read, bounded

Writing uses mtime 0, so the same trace gives the same bytes. Reading stops at the bound, so a
gzip bomb cannot pass it; every problem is one `ConfigError` line naming the file.
"""

from __future__ import annotations

import gzip
import io
import zlib

from traces.errors import ConfigError

GZIP_MAGIC = b"\x1f\x8b"


def text_or_gzip(text: str, path: object) -> str | bytes:
    """What to write at `path`: the text, gzipped when the path ends in ".gz"."""
    if str(path).endswith(".gz"):
        return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)
    return text


def gunzip(data: bytes, label: str, limit: int, bound: str = "the most parasim reads") -> bytes:
    """`data` decompressed when it is gzip (at most `limit` bytes), else as it is; a file
    named .gz must be gzip."""
    if not data.startswith(GZIP_MAGIC):
        if label.endswith(".gz"):
            raise ConfigError(f"{label}: not a gzip file (named .gz, but it does not start with "
                              "the gzip magic bytes 1f 8b)")
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unzipped:
            out = unzipped.read(limit + 1)
    except (gzip.BadGzipFile, zlib.error, EOFError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ConfigError(f"{label}: corrupt or truncated gzip: {reason}") from exc
    if len(out) > limit:
        raise ConfigError(f"{label}: decompresses to more than {limit} bytes of JSON; stopped "
                          f"reading there ({bound})")
    return out


def head(path: object, size: int) -> bytes:
    """The first `size` bytes of the file's content, decompressed when it is gzip; b"" for
    a gzip file too broken to start (its reader says why)."""
    with open(str(path), "rb") as file:
        start = file.read(size)
        if not start.startswith(GZIP_MAGIC):
            return start
        file.seek(0)
        try:
            with gzip.GzipFile(fileobj=file) as unzipped:
                return unzipped.read(size)
        except (gzip.BadGzipFile, zlib.error, EOFError):
            return b""
