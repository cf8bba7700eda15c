"""Durations as rules write them: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``, or ``1m30s``.

Every duration is finite, not negative and at most ``MAX_SECONDS``: ``for: .nan`` would make a
rule that can never fire (no time is ever >= NaN), and ``[99...9s]`` overflows window arithmetic.
"""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
MAX_SECONDS = 366 * 86400.0   # a year (and a leap day): longer than any window or hold-off means


def _bounded(seconds: float, text: object) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a finite duration")
    if seconds < 0:
        raise ValueError(f"{text!r} is negative")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text!r} is longer than the limit of 366d")
    return seconds


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration; a bare number means seconds. Raises ValueError with the reason.

    >>> parse_duration("1m30s"), parse_duration("500ms"), parse_duration(15)
    (90.0, 0.5, 15.0)
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, (int, float)):
        try:
            return _bounded(float(text), text)
        except OverflowError:   # an int too big for a float
            raise ValueError("the number is longer than the limit of 366d") from None
    s = str(text).strip()
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"{text!r} is not a duration (use e.g. 30s, 5m, 1h30m)")
    return _bounded(total, text if len(s) <= 40 else s[:40] + "...")
