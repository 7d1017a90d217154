"""Large JSON documents written in chunks, so that writing one can be counted as it goes (the
`--trace` and `--chrome` files of a large step take tens of seconds): the same bytes as one
`json.dumps(..., separators=(",", ":"), allow_nan=False)` and one `gzip.compress(...,
compresslevel=6, mtime=0)`, a progress call after each chunk.

Compact JSON is compositional (a list's text is its items' texts joined by commas), and deflate
fed the same bytes in pieces without a flush gives the same stream.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

Counted = Callable[[str, int, int], None]
"""progress(unit, done, total): 'rank', 'item' or 'byte' counted so far, of how many."""
CHUNK_ITEMS = 20_000
CHUNK_BYTES = 8 << 20
GZIP_LEVEL = 6
_SEP = (",", ":")


def _encode(value: Any) -> str:
    return json.dumps(value, separators=_SEP, allow_nan=False)


def dumps_counted(document: dict[str, Any], key: str, progress: Counted | None) -> str:
    """`document` as compact JSON and a newline; the value at `key` (a list, or a dict of
    lists) encoded CHUNK_ITEMS items at a time, `progress('item', done, total)` after each."""
    big = document[key]
    lists = big.values() if isinstance(big, dict) else [big]
    total = sum(len(items) for items in lists)
    done = 0

    def encode_list(items: list[Any]) -> str:
        nonlocal done
        parts = []
        for start in range(0, len(items), CHUNK_ITEMS):
            chunk = items[start:start + CHUNK_ITEMS]
            parts.append(_encode(chunk)[1:-1])
            done += len(chunk)
            if progress is not None:
                progress("item", done, total)
        return "[" + ",".join(parts) + "]"

    if isinstance(big, dict):
        text = "{" + ",".join(f"{_encode(k)}:{encode_list(v)}" for k, v in big.items()) + "}"
    else:
        text = encode_list(big)
    fields = [f"{_encode(k)}:{text if k == key else _encode(v)}" for k, v in document.items()]
    return "{" + ",".join(fields) + "}\n"


def gzip_counted(text: str, progress: Counted | None) -> bytes:
    """`text` gzipped as `traces.gzipped.text_or_gzip` does, CHUNK_BYTES at a time,
    `progress('byte', done, total)` after each."""
    data = text.encode("utf-8")
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    out = []
    for start in range(0, len(data), CHUNK_BYTES):
        out.append(packer.compress(data[start:start + CHUNK_BYTES]))
        if progress is not None:
            progress("byte", min(start + CHUNK_BYTES, len(data)), len(data))
    out.append(packer.flush())
    return b"".join(out)
