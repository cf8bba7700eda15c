"""The incident stage's input order: alerts from many sources (host-stage partitions, the fleet
stage's models), arriving interleaved at random, released in one canonical order by event time
(docs/architecture.md, "Incidents").

The incident stage's output depends on the order of the alerts it is fed, so every driver feeds
it through an ``AlertFeed``: the replay with its detector's released watermark, the service's
fleet stage with the second every host-stage partition has marked past. An alert is buffered
until a watermark ``upto`` passes its ``ts``; the alerts a release takes go out sorted by
``(ts, host, gpu, rule, id, state)``, each ``(id, state)`` once (with a ``rank``, the alerts of
one GPU at one time by it before the rule: the incident stage's ``rootness``). ``upto`` is an engine's
``released`` (every record before it processed, and the tick at it): an alert at ``upto`` itself
may still come from the rows at that time, so a release takes ``ts < upto`` only. An alert
before what the feed already released (an upstream replay after a restore, or one arriving
after its second went) is dropped and counted. The buffer is plain data (``to_state``/``load_state``) for the
service's checkpoint.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Iterable

import msgspec

from pipeline.errors import StateError
from pipeline.schema import AlertEvent

STATE_VERSION = 1
MAX_BUFFER = 200_000  # alerts held for a watermark; past it the oldest are released early (counted)

_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(list[AlertEvent])


def order_key(a: AlertEvent) -> tuple[float, str, int, str, str, str]:
    """The canonical order of alerts: a total order, since ``(id, state)`` is unique in a release.

    >>> a = AlertEvent(id="x", state="firing", fault="f", severity="info", rule="r", host="n1", gpu=None,
    ...                ts=5.0, started_at=5.0)
    >>> order_key(a)
    (5.0, 'n1', -1, 'r', 'x', 'firing')
    """
    return (a.ts, a.host or "", -1 if a.gpu is None else a.gpu, a.rule, a.id, a.state)


class AlertFeed:
    """Buffers alerts and releases them in canonical order up to a watermark.

    >>> def alert(i, ts):
    ...     return AlertEvent(id=f"a{i}", state="firing", fault="f", severity="info", rule="r", host="n1",
    ...                       ts=ts, started_at=ts)
    >>> feed = AlertFeed()
    >>> feed.add([alert(2, 20.0), alert(1, 10.0), alert(3, 30.0), alert(1, 10.0)])
    >>> [a.id for a in feed.release(20.0)]  # before 20: an alert at 20 may still come
    ['a1']
    >>> feed.add([alert(0, 15.0)])  # its second was released: dropped
    >>> [a.id for a in feed.flush()], feed.stats["late"]
    (['a2', 'a3'], 1)
    """

    def __init__(
        self, max_buffer: int = MAX_BUFFER, rank: Callable[[AlertEvent], tuple[int, ...]] | None = None
    ) -> None:
        self.max_buffer = max_buffer
        # The order of a release: ``order_key``, with the alerts of one GPU at one time by ``rank``
        # first (the incident stage's ``rootness``: the one that opens an incident names its root).
        self._key: Callable[[AlertEvent], tuple[Any, ...]] = order_key
        if rank is not None:
            self._key = lambda a: (a.ts, a.host or "", -1 if a.gpu is None else a.gpu, *rank(a), a.rule, a.id, a.state)
        self.released = -math.inf  # every alert with ts < released went out (or was dropped)
        self.stats: Counter[str] = Counter()
        self._buf: dict[tuple[str, str], AlertEvent] = {}
        self._early: list[AlertEvent] = []  # forced out of a full buffer, for the next release

    def __len__(self) -> int:
        return len(self._buf)

    def add(self, alerts: Iterable[AlertEvent]) -> None:
        """Buffer ``alerts`` (any order); one before ``released`` is late, one whose
        ``(id, state)`` is buffered already is a duplicate, one without a finite ``ts`` is bad."""
        for a in alerts:
            if not math.isfinite(a.ts):
                self.stats["bad_ts"] += 1
            elif a.ts < self.released:
                self.stats["late"] += 1
            elif (a.id, a.state) in self._buf:
                self.stats["duplicate"] += 1
            else:
                self._buf[(a.id, a.state)] = a
        if len(self._buf) > self.max_buffer:
            # A watermark that never comes (an upstream task gone for good) must not grow the
            # buffer without end: the oldest go now, as a forced release of the fleet stage does.
            self.stats["forced"] += 1
            ts = sorted(a.ts for a in self._buf.values())
            self._early += self._go(math.nextafter(ts[len(ts) - self.max_buffer - 1], math.inf))
        self.stats["buffered"] = len(self._buf)

    def release(self, upto: float) -> list[AlertEvent]:
        """The buffered alerts with ``ts < upto``, in canonical order; ``released`` moves to
        ``upto`` (``inf``: just past the newest alert released, so later ones are still taken)."""
        out, self._early = self._early, []
        if not math.isnan(upto):
            out += self._go(upto)
        self.stats["buffered"] = len(self._buf)
        return out

    def flush(self) -> list[AlertEvent]:
        """Everything buffered (end of stream)."""
        return self.release(math.inf)

    def _go(self, upto: float) -> list[AlertEvent]:
        go = [a for a in self._buf.values() if a.ts < upto]
        for a in go:
            del self._buf[(a.id, a.state)]
        go.sort(key=self._key)
        self.stats["released"] += len(go)
        if math.isinf(upto) and upto > 0:
            if go:
                self.released = max(self.released, math.nextafter(go[-1].ts, math.inf))
        elif upto > self.released:
            self.released = upto
        return go

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain data: the version, ``released`` (None for -inf) and the buffered alerts as msgpack."""
        return {
            "v": STATE_VERSION,
            "released": None if math.isinf(self.released) else self.released,
            "alerts": _ENC.encode([*self._early, *sorted(self._buf.values(), key=order_key)]),
        }

    def load_state(self, state: Any) -> None:
        """Replace the feed with one ``to_state`` made; anything else raises ``StateError`` and
        leaves the feed as it was."""
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise StateError(f"alert feed state: not a version {STATE_VERSION} state")
        rel = state.get("released")
        if rel is not None and (isinstance(rel, bool) or not isinstance(rel, (int, float)) or not math.isfinite(rel)):
            raise StateError("alert feed state: released is not a finite number or null")
        blob = state.get("alerts")
        if not isinstance(blob, bytes):
            raise StateError("alert feed state: alerts is not msgpack bytes")
        try:
            alerts = _DEC.decode(blob)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise StateError(f"alert feed state: alerts do not decode ({e})") from e
        if len(alerts) > self.max_buffer:
            raise StateError(f"alert feed state: {len(alerts)} alerts, more than the limit of {self.max_buffer}")
        released = -math.inf if rel is None else float(rel)
        buf: dict[tuple[str, str], AlertEvent] = {}
        early: list[AlertEvent] = []
        for a in alerts:
            if not math.isfinite(a.ts):
                raise StateError(f"alert feed state: alert {a.id[:64]!r} has no finite ts")
            if a.ts < released:
                early.append(a)  # forced out of a full buffer, not yet given to the stage
            else:
                buf[(a.id, a.state)] = a
        self.released, self._buf, self._early = released, buf, early
        self.stats["buffered"] = len(buf)
