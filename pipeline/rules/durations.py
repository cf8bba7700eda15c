"""Durations as rules write them: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``, or ``1m30s``."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration; a bare number means seconds. Raises ValueError with the reason.

    >>> parse_duration("1m30s"), parse_duration("500ms"), parse_duration(15)
    (90.0, 0.5, 15.0)
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"{text} is negative")
        return float(text)
    s = str(text).strip()
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"{text!r} is not a duration (use e.g. 30s, 5m, 1h30m)")
    return total
