"""Durations as rules write them: ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``, or ``1m30s``.

The one parser is ``pipeline.durations`` (rules, models and configs share its dialect, its
bounds and its ASCII digits); this module keeps the rule language's name for it.
"""

from __future__ import annotations

from pipeline.durations import MAX_SECONDS as MAX_SECONDS
from pipeline.durations import parse_duration as parse_duration
