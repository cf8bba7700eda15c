"""Durations, one dialect for rules, models and configs: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``,
``1m30s`` (each unit once, largest first, as Prometheus: not ``5m1m`` or ``5s5s``), or a number of
seconds (``90``, ``"90"``, ``1.5``).

Every duration is finite, not negative and at most ``MAX_SECONDS``: ``for: .nan`` would make a
rule that can never fire (no time is ever >= NaN), a cooldown of NaN never holds (every
comparison with NaN is false, so a drain would repeat on every alert), and ``[99...9s]``
overflows window arithmetic.

``parse_duration`` raises ValueError (the rule loader turns it into an R007 diagnostic);
``duration`` raises a ``ConfigError`` naming the config key.
"""

from __future__ import annotations

import math
import re

from pipeline.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Blanks between a number and its unit and between parts ("10 m", "1h 30m") are allowed: the
# remediation config always took them.
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_SECONDS = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")  # a number without a unit, quoted
MAX_SECONDS = 366 * 86400.0  # a year (and a leap day): longer than any window or hold-off means


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

    >>> parse_duration("1m30s"), parse_duration("500ms"), parse_duration(15), parse_duration(" 10 m ")
    (90.0, 0.5, 15.0, 600.0)
    >>> parse_duration("5m1m")
    Traceback (most recent call last):
    ...
    ValueError: '5m1m' is not a duration: each unit once, largest first (e.g. 1h30m, 1m30s)
    >>> parse_duration("1:30")
    Traceback (most recent call last):
    ...
    ValueError: '1:30' is not a duration: write minutes and seconds as 1m30s, hours as 1h30m
    >>> parse_duration("\u09ea" + "m")
    Traceback (most recent call last):
    ...
    ValueError: '৪m' is not a duration (use ASCII digits, e.g. 30s, 5m, 1h30m)
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, (int, float)):
        try:
            return _bounded(float(text), text)
        except OverflowError:  # an int too big for a float
            raise ValueError("the number is longer than the limit of 366d") from None
    s = str(text)
    if not s.isascii():
        # Python reads every script's digits as numbers, and some look like others (Bengali
        # '৪' is a 4 that reads as an 8): a hold-off would be other than the one reviewed.
        raise ValueError(f"{s[:40]!r} is not a duration (use ASCII digits, e.g. 30s, 5m, 1h30m)")
    shown = text if len(s.strip()) <= 40 else s.strip()[:40] + "..."
    if m := _SECONDS.fullmatch(s):
        return _bounded(float(m.group(1)), shown)
    pos, total, last = 0, 0.0, math.inf
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        unit = _UNITS[m.group(2)]
        if unit >= last:
            # As Prometheus: each unit once, largest first. ``5m1m`` (6m) or ``30s1m`` is a typo
            # more often than a sum, and ``5s5s`` reads as 5s at a glance.
            raise ValueError(f"{shown!r} is not a duration: each unit once, largest first (e.g. 1h30m, 1m30s)")
        last = unit
        total += float(m.group(1)) * unit
        pos = m.end()
    if ":" in s:  # 1:30 in quotes: minutes and seconds, or hours and minutes?
        raise ValueError(f"{shown!r} is not a duration: write minutes and seconds as 1m30s, hours as 1h30m")
    if s[pos:].strip() or not s.strip():
        raise ValueError(f"{text!r} is not a duration (use e.g. 30s, 5m, 1h30m)")
    return _bounded(total, shown)


def duration(value: object, key: str) -> float:
    """``parse_duration`` of a config value; a ConfigError naming ``key`` when it is none.

    >>> duration("1m30s", "guardrails.cooldown")
    90.0
    >>> duration("soon", "guardrails.cooldown")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: config key 'guardrails.cooldown': 'soon' is not a duration (use e.g. 30s, 5m, 1h30m) [GW100]
    """
    if not isinstance(value, (str, int, float)):
        raise ConfigError(key, f"expected a duration such as 30s, 10m, 1m30s, got {str(value)[:60]!r}")
    try:
        return parse_duration(value)
    except ValueError as e:
        raise ConfigError(key, str(e)) from None
