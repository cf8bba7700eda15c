"""JSON from tools' output read with bounded nesting and bounded numbers.

``json.loads`` recurses once per nesting level (a few thousand ``[`` raise ``RecursionError``,
which is not a ``ValueError``) and turns an integer of 4,300+ digits into a ``ValueError`` for the
whole document. Here nesting past ``max_depth`` is refused (or, for a whole document, only the
too-deep values are replaced by ``null``), integers longer than ``MAX_INT_DIGITS`` and the
non-standard ``NaN``/``Infinity`` read as ``null``: the caller counts what it could not use, and
the rest of the document stays readable.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # objects and arrays nested in each other; the tools write 4 or 5
MAX_INT_DIGITS = 19  # an int64; longer is no count or size a tool writes

# A whole string (escapes included) or one bracket: strings are skipped in one match, so the
# scan costs a regex step per string and bracket, not a Python step per character.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _int(text: str) -> int | None:
    digits = text[1:] if text.startswith("-") else text
    return int(text) if len(digits) <= MAX_INT_DIGITS else None


def _deep_spans(text: str, max_depth: int) -> list[tuple[int, int]]:
    """The (start, end) of each value that opens deeper than ``max_depth``, outermost only."""
    if text.count("[") + text.count("{") <= max_depth:
        return []  # cannot nest deeper than there are brackets: the usual line, no scan
    spans: list[tuple[int, int]] = []
    depth, start = 0, -1
    for m in _TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth == max_depth + 1:
                start = m.start()
        elif c in "]}":
            if depth == max_depth + 1:
                spans.append((start, m.end()))
            depth = max(depth - 1, 0)
    if depth > max_depth:  # never closed: cut to the end (the parser then says what is wrong)
        spans.append((start, len(text)))
    return spans


def _decode(text: str) -> Any:
    try:
        return json.loads(text, parse_int=_int, parse_constant=lambda _: None)
    except RecursionError as e:  # bounded by the depth check; kept as a ValueError regardless
        raise ValueError("JSON nested too deep") from e


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON value (a line); ``ValueError`` when it is not JSON or nests past ``max_depth``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if _deep_spans(text, max_depth):
        raise ValueError(f"JSON nested more than {max_depth} levels deep")
    return _decode(text)


def loads_pruned(text: str, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
    """A whole JSON document, each value nested past ``max_depth`` replaced by ``null``; and how
    many were replaced. ``ValueError`` when it is not JSON."""
    spans = _deep_spans(text, max_depth)
    if spans:
        parts, at = [], 0
        for a, b in spans:
            parts += [text[at:a], "null"]
            at = b
        text = "".join(parts) + text[at:]
    return _decode(text), len(spans)


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "loads", "loads_pruned"]
