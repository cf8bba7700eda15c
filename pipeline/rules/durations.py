"""Durations as rules write them: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``, or ``1m30s``.

The one parser is ``pipeline.durations`` (rules, models and configs share its dialect and
bounds); this module keeps the rule language's name for it, with ASCII digits only.
"""

from __future__ import annotations

from pipeline.durations import MAX_SECONDS as MAX_SECONDS
from pipeline.durations import parse_duration as _parse


def parse_duration(text: str | int | float) -> float:
    """``pipeline.durations.parse_duration``, refusing digits other than 0-9.

    Python reads any script's digits as numbers, and some look like others: Bengali ``৪`` is a 4
    that reads as an 8, so ``for: ৪m`` would hold half as long as a reviewer thinks.

    >>> parse_duration("1m30s")
    90.0
    >>> parse_duration("\\u09ea" + "m")
    Traceback (most recent call last):
    ...
    ValueError: '৪m' is not a duration (use ASCII digits, e.g. 30s, 5m, 1h30m)
    """
    if isinstance(text, str) and not text.isascii():
        raise ValueError(f"{text[:40]!r} is not a duration (use ASCII digits, e.g. 30s, 5m, 1h30m)")
    return _parse(text)
