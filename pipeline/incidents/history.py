"""The repeat-offender history: per policy and GPU (or host), the last few times it counted, and
when it last escalated. Bounded (each key keeps at most its policy's threshold of times; at most
``max_keys`` keys, the least recently touched forgotten first) and kept as plain data
(``to_state``/``load_state``: lists of strings and numbers, msgpack- and JSON-able, no pickle),
so a service can checkpoint it beside its other state (docs/architecture.md, "Incidents").
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import StateError

STATE_VERSION = 1
MAX_KEEP = 1000  # times one key keeps: above any sensible threshold
MAX_TEXT = 256  # characters of a key part or an alert id kept in the state


@dataclass
class _Entry:
    times: list[tuple[float, str]] = field(default_factory=list)  # (ts, alert id), sorted
    escalated_at: float | None = None


Key = tuple[str, str, int | None]  # (policy or counter name, host, gpu or None)


class RepeatHistory:
    """Counts what repeats on one GPU or host within a window.

    >>> h = RepeatHistory()
    >>> [h.note(("xid79", "n1", 0), t, f"a{t}", keep=5, window=86400) for t in (0, 10, 20)]
    [1, 2, 3]
    >>> h.note(("xid79", "n1", 0), 20, "a20", keep=5, window=86400)  # the same alert again: not counted
    3
    """

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._keys: OrderedDict[Key, _Entry] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._keys)

    def _entry(self, key: Key) -> _Entry:
        e = self._keys.get(key)
        if e is None:
            e = self._keys[key] = _Entry()
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
                self.evicted += 1
        else:
            self._keys.move_to_end(key)
        return e

    def note(self, key: Key, ts: float, alert_id: str, *, keep: int, window: float) -> int:
        """Count one occurrence (alert ``alert_id`` at ``ts``) under ``key``; how many fell within
        ``window`` seconds up to ``ts``. An alert id already counted is not counted again, so
        reprocessing the same alerts after a restore changes nothing."""
        e = self._entry(key)
        aid = alert_id[:MAX_TEXT]
        if all(a != aid for _, a in e.times):
            e.times.append((ts, aid))
            e.times.sort()
            del e.times[: max(0, len(e.times) - min(max(keep, 1), MAX_KEEP))]
        return sum(1 for t, _ in e.times if ts - window <= t <= ts)

    def latest(self, key: Key) -> float | None:
        """The newest time counted under ``key`` (``None``: none), not touching the key's recency.

        >>> h = RepeatHistory()
        >>> h.latest(("lemon_host", "n1", None)), h.note(("lemon_host", "n1", None), 50.0, "i1", keep=5, window=60)
        (None, 1)
        >>> h.latest(("lemon_host", "n1", None))
        50.0
        """
        e = self._keys.get(key)
        return e.times[-1][0] if e is not None and e.times else None

    def escalate(self, key: Key, ts: float, window: float) -> bool:
        """Whether ``key`` escalates now: True once per ``window`` (the first call, or the first
        more than ``window`` after the last escalation), remembering it."""
        e = self._entry(key)
        if e.escalated_at is not None and ts - e.escalated_at <= window:
            return False
        e.escalated_at = ts
        return True

    def to_state(self) -> dict[str, Any]:
        """Plain data (see the module docstring), least recently touched key first."""
        return {
            "v": STATE_VERSION,
            "keys": [
                [name, host, -1 if gpu is None else gpu, [[t, a] for t, a in e.times], e.escalated_at]
                for (name, host, gpu), e in self._keys.items()
            ],
        }

    def load_state(self, state: Any) -> None:
        """Replace the history with one ``to_state`` made. Anything else (a forged or damaged
        state) raises ``StateError`` naming what is wrong, and leaves the history as it was."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION or not isinstance(state.get("keys"), list):
            raise StateError(f"incident history state: not a version {STATE_VERSION} state")
        rows = state["keys"]
        if len(rows) > self.max_keys:
            raise StateError(f"incident history state: {len(rows)} keys, more than the limit of {self.max_keys}")
        keys: OrderedDict[Key, _Entry] = OrderedDict()
        for i, row in enumerate(rows):
            key = _key(row, i)  # checks the row's shape before its parts are read
            keys[key] = _entry(row, i)
        self._keys = keys


def _text(v: Any, what: str, i: int) -> str:
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise StateError(f"incident history state: key {i}: {what} is not text of at most {MAX_TEXT} characters")
    return v


def _time(v: Any, what: str, i: int) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise StateError(f"incident history state: key {i}: {what} is not a finite number")
    return float(v)


def _key(row: Any, i: int) -> Key:
    if not isinstance(row, (list, tuple)) or len(row) != 5:
        raise StateError(f"incident history state: key {i} is not [name, host, gpu, times, escalated_at]")
    gpu = row[2]
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not -1 <= gpu < 1 << 16:
        raise StateError(f"incident history state: key {i}: gpu {gpu!r} is not an index")
    return (_text(row[0], "name", i), _text(row[1], "host", i), None if gpu == -1 else gpu)


def _entry(row: Any, i: int) -> _Entry:
    times = row[3]
    if not isinstance(times, (list, tuple)) or len(times) > MAX_KEEP:
        raise StateError(f"incident history state: key {i}: times is not a list of at most {MAX_KEEP}")
    out = []
    for t in times:
        if not isinstance(t, (list, tuple)) or len(t) != 2:
            raise StateError(f"incident history state: key {i}: a time is not [ts, alert id]")
        out.append((_time(t[0], "a time", i), _text(t[1], "an alert id", i)))
    esc = None if row[4] is None else _time(row[4], "escalated_at", i)
    return _Entry(sorted(out), esc)
