"""`pipeline_layout`: Megatron-Core's --pipeline-model-parallel-layout, parsed and checked.

The string lists the virtual stages in order, separated by `|`: `E` the embedding, `t` a
transformer layer, `m` a multi-token-prediction layer, `L` the loss (final norm, output layer,
cross-entropy). `x*N` repeats one symbol, `(...)*N` a group (separators included, and `x*N`
inside it: `(t*4|)*14`); commas (and here spaces too) are cosmetic. Virtual stage k runs on
pipeline rank k % pp as its chunk k // pp
(megatron/core/transformer/pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout:
`layout[vpp_rank * pp + pp_rank]`), so DeepSeek-V3's `Et|(tt|)*30mL` is 32 stages and 61
layers. Megatron-Core's own rules (validate_layer_layout) are kept: the embedding first and the
loss last, each once; parentheses do not nest (its regular expression unrolls one level). The
counts are checked before anything is expanded.
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.errors import ConfigError, show

FIELD = "parallel.pipeline_layout"
MAX_CHARS = 10_000
"""Characters of the string as written (DeepSeek-V3's is 13)."""
MAX_EXPANDED = 2**20
"""Symbols once every repetition is unrolled: ~16x the most layers a model may have
(traces.model.MAX_DIMS), more than any real model."""
MAX_DIGITS = 7
SYMBOLS = "EtmL|"


@dataclass(frozen=True, slots=True)
class StageSpec:
    """What one virtual stage holds: transformer layers, and the embedding, MTP layers, loss."""

    layers: int = 0
    embedding: bool = False
    mtp: int = 0
    loss: bool = False


def parse_pipeline_layout(text: str) -> tuple[StageSpec, ...]:
    """The virtual stages of a layout string, in order (module docstring); ConfigError names
    the first broken rule."""
    if not isinstance(text, str):
        raise ConfigError(f"{FIELD}: {show(text)} must be a string such as \"Et|(tt|)*30mL\"")
    if len(text) > MAX_CHARS:
        raise ConfigError(f"{FIELD}: {len(text):,} characters, more than {MAX_CHARS:,}")
    compact = "".join(c for c in text if c != "," and not c.isspace())
    stages = _expand(compact).split("|")
    _check_ends(stages, compact)
    return tuple(_stage(stage) for stage in stages)


def _expand(text: str) -> str:
    """The string with every `x*N` and `(...)*N` unrolled, its length checked first."""
    items = _items(text)
    total = sum(len(body) * n for body, n in items)
    if total > MAX_EXPANDED:
        raise ConfigError(f"{FIELD}: {text[:40]!r} unrolls to {total:,} symbols, more than "
                          f"{MAX_EXPANDED:,}")
    return "".join(body * n for body, n in items)


def _items(text: str) -> list[tuple[str, int]]:
    """(body, repetitions) pieces: one symbol, or a parenthesized group, each with its `*N`."""
    items: list[tuple[str, int]] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "(":
            close = text.find(")", i + 1)
            if close < 0:
                raise ConfigError(f"{FIELD}: the '(' at position {i} is never closed")
            body = text[i + 1:close]
            if "(" in body:
                at = i + 1 + body.index("(")
                raise ConfigError(f"{FIELD}: nested parentheses at position {at} "
                                  "(Megatron-Core unrolls one level of (...)*N)")
            if not body:
                raise ConfigError(f"{FIELD}: empty parentheses at position {i}")
            body = _group(body, i + 1)
            n, i = _count(text, close + 1, required=True)
        elif c == ")":
            raise ConfigError(f"{FIELD}: the ')' at position {i} closes no '('")
        else:
            _check_symbols(c, i)
            body = c
            n, i = _count(text, i + 1, required=False)
        items.append((body, n))
    return items


def _group(body: str, at: int) -> str:
    """A group's body (at position `at`) with its own `x*N` unrolled, as Megatron-Core unrolls
    `(...)*N` first and `x*N` after, so `(t*4|)*14` is 14 stages of 4 layers; the body's
    unrolled length is checked before it is built."""
    try:
        inner = _items(body)
    except ConfigError as err:
        raise ConfigError(_shifted(str(err), at)) from None
    size = sum(len(piece) * n for piece, n in inner)
    if size > MAX_EXPANDED:
        raise ConfigError(f"{FIELD}: the group at position {at - 1} unrolls to {size:,} "
                          f"symbols, more than {MAX_EXPANDED:,}")
    return "".join(piece * n for piece, n in inner)


def _shifted(message: str, at: int) -> str:
    """A message about a group's body with its positions counted in the whole string."""
    words = message.split(" ")
    for k in range(len(words) - 1):
        if words[k] == "position" and words[k + 1].isdigit():
            words[k + 1] = str(int(words[k + 1]) + at)
    return " ".join(words)


def _count(text: str, at: int, *, required: bool) -> tuple[int, int]:
    """The `*N` starting at `at` (1 where there is none and none is required), and where the
    text goes on after it."""
    if at >= len(text) or text[at] != "*":
        if required:
            raise ConfigError(f"{FIELD}: a (...) group at position {at - 1} needs *N after it")
        return 1, at
    end = at + 1
    while end < len(text) and text[end].isdigit():
        end += 1
    digits = text[at + 1:end]
    if not digits:
        raise ConfigError(f"{FIELD}: '*' at position {at} needs a repetition count after it")
    if len(digits) > MAX_DIGITS or not 1 <= int(digits) <= MAX_EXPANDED:
        raise ConfigError(f"{FIELD}: repetition count {digits[:20]} at position {at + 1} must "
                          f"be from 1 to {MAX_EXPANDED:,}")
    return int(digits), end


def _check_symbols(body: str, at: int) -> None:
    for j, c in enumerate(body):
        if c not in SYMBOLS:
            raise ConfigError(f"{FIELD}: {c!r} at position {at + j} is not a layer symbol (E "
                              "embedding, t transformer layer, m MTP layer, L loss, | between "
                              "stages, x*N, (...)*N)")


def _stage(stage: str) -> StageSpec:
    """One virtual stage's symbols as counts (`m` against model.mtp_layers:
    `traces.split_rules`)."""
    return StageSpec(layers=stage.count("t"), embedding="E" in stage, mtp=stage.count("m"),
                     loss="L" in stage)


def _check_ends(stages: list[str], text: str) -> None:
    """Megatron-Core's validate_layer_layout: the embedding once, first; the loss once, last
    (here: the first symbol of the first virtual stage and the last of the last one, where
    parasim runs them, as Megatron-Core builds them on the first and the last stage)."""
    n_e = sum(s.count("E") for s in stages)
    n_l = sum(s.count("L") for s in stages)
    if n_e != 1 or not stages[0].startswith("E"):
        raise ConfigError(f"{FIELD}: {text[:40]!r} must hold the embedding E exactly once, as "
                          f"the first symbol of the first virtual stage (found {n_e})")
    if n_l != 1 or not stages[-1].endswith("L"):
        raise ConfigError(f"{FIELD}: {text[:40]!r} must hold the loss L exactly once, as the "
                          f"last symbol of the last virtual stage (found {n_l})")
