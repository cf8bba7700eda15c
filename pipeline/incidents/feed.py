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

With a ``hold`` (the incident stage's ``CauseHold``, pipeline/incidents/hold.py), a possible symptom
goes out only once the watermark is ``hold.seconds`` past it, with every cause of it from those
seconds just before it, and nothing after it in canonical order goes before it: the order is a
function of the alerts alone, however the watermark moved, so replay and serve still agree.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections import Counter
from typing import Any, Callable, Iterable, Protocol

import msgspec

from pipeline.errors import StateError
from pipeline.schema import AlertEvent

STATE_VERSION = 2
_TS = operator.attrgetter("ts")
# Causes on one host not yet gone out looked at after a held symptom (of any rule, in canonical
# order): alerts are few per host and second (each rule fires once per entity until it resolves),
# a forged flood costs bounded work, rules of its own for each alert included.
MAX_SCAN = 256
MAX_BUFFER = 200_000  # alerts held for a watermark; past it the oldest are released early (counted)

_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(list[AlertEvent])


class Hold(Protocol):
    """What holds a possible symptom for its cause (``CauseHold``): the seconds of event time it
    waits, and which alerts are symptoms, causes, and which cause goes before which symptom."""

    seconds: float

    def symptom(self, a: AlertEvent) -> bool: ...

    def cause(self, a: AlertEvent) -> bool: ...

    def pulls(self, cause: AlertEvent, symptom: AlertEvent) -> bool: ...

    def may_pull(self, rule: str, symptom: AlertEvent) -> bool: ...


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
        self,
        max_buffer: int = MAX_BUFFER,
        rank: Callable[[AlertEvent], tuple[int, ...]] | None = None,
        hold: Hold | None = None,
    ) -> None:
        self.max_buffer = max_buffer
        self.hold = hold if hold is not None and hold.seconds > 0 else None
        # The order of a release: ``order_key``, with the alerts of one GPU at one time by ``rank``
        # first (the incident stage's ``rootness``: the one that opens an incident names its root).
        self._key: Callable[[AlertEvent], tuple[Any, ...]] = order_key
        if rank is not None:
            self._key = lambda a: (a.ts, a.host or "", -1 if a.gpu is None else a.gpu, *rank(a), a.rule, a.id, a.state)
        # The watermark: every alert with ts < released has come (one later is late). Each went
        # out, but possible symptoms held for their causes (``hold``) and what follows them.
        self.released = -math.inf
        self.stats: Counter[str] = Counter()
        self._buf: dict[tuple[str, str], AlertEvent] = {}
        self._early: list[AlertEvent] = []  # forced out of a full buffer, for the next release
        # With a hold: where the watermark must pass before anything more goes (the limit of the
        # first symptom held, which nothing buffered or yet to come goes before), so a release
        # short of it costs nothing however many alerts wait behind the symptom.
        self._wait = -math.inf

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
            self._wait = -math.inf
            ts = sorted(a.ts for a in self._buf.values())
            self._early += self._go(math.nextafter(ts[len(ts) - self.max_buffer - 1], math.inf), forced=True)
        self.stats["buffered"] = len(self._buf)

    def release(self, upto: float) -> list[AlertEvent]:
        """The buffered alerts with ``ts < upto``, in canonical order (with a ``hold``, up to a
        possible symptom not yet ``hold.seconds`` behind ``upto``, causes before their symptoms);
        ``released`` moves to ``upto`` (``inf``: just past the newest alert released, so later
        ones are still taken)."""
        out, self._early = self._early, []
        if not math.isnan(upto):
            out += self._go(upto)
        self.stats["buffered"] = len(self._buf)
        return out

    def flush(self) -> list[AlertEvent]:
        """Everything buffered (end of stream)."""
        return self.release(math.inf)

    def _go(self, upto: float, forced: bool = False) -> list[AlertEvent]:
        if self.hold is not None and not forced and not self._wait < upto:
            go: list[AlertEvent] = []
        else:
            go = [a for a in self._buf.values() if a.ts < upto]
            go.sort(key=self._key)
            if self.hold is not None and not forced:
                go = self._held(go, upto)
        for a in go:
            del self._buf[(a.id, a.state)]
        self.stats["released"] += len(go)
        if math.isinf(upto) and upto > 0:
            if go:
                self.released = max(self.released, math.nextafter(max(map(_TS, go)), math.inf))
        elif upto > self.released:
            self.released = upto
        return go

    def _held(self, go: list[AlertEvent], upto: float) -> list[AlertEvent]:
        """``go`` (sorted) as it may go out now: up to the first possible symptom the watermark
        ``upto`` is not ``hold.seconds`` past, each symptom after the causes it pulls from those
        seconds, each of them after its own causes from the same seconds (in canonical order);
        the rest stays buffered."""
        hold = self.hold
        assert hold is not None
        # Each host's causes in canonical order (so by ts), and past each one the next not yet
        # taken (``skip``, path-halved): what went out, in this release or an earlier one, is
        # neither looked at nor counted, so what a symptom pulls is the same however the alerts
        # were released before it, and a flood costs each symptom at most MAX_SCAN looks.
        causes: dict[str, list[AlertEvent]] = {}
        for a in go:
            if a.host is not None and hold.cause(a):
                causes.setdefault(a.host, []).append(a)
        skip = {h: list(range(len(near) + 1)) for h, near in causes.items()}
        where = {(c.id, c.state): (h, i) for h, near in causes.items() for i, c in enumerate(near)}
        out: list[AlertEvent] = []
        taken: set[tuple[str, str]] = set()
        self._wait = -math.inf

        def first(nxt: list[int], i: int) -> int:
            while nxt[i] != i:
                nxt[i] = nxt[nxt[i]]
                i = nxt[i]
            return i

        def take(a: AlertEvent) -> None:
            taken.add((a.id, a.state))
            at = where.get((a.id, a.state))
            if at is not None:
                skip[at[0]][at[1]] = at[1] + 1

        def pulled(s: AlertEvent, limit: float) -> list[AlertEvent]:
            """The causes not yet taken that go before ``s``: at or after its ts, by ``limit``."""
            near = causes.get(s.host or "")
            if not near:
                return []
            nxt = skip[s.host or ""]
            got: list[AlertEvent] = []
            # From its own second: a cause there that sorts after it (a GPU's, after its host's
            # alert) has not gone yet; those before it have.
            i = first(nxt, bisect_left(near, s.ts, key=_TS))
            for _ in range(MAX_SCAN):  # a flood on one host costs bounded work
                if i == len(near) or near[i].ts > limit:
                    break
                if hold.pulls(near[i], s):
                    got.append(near[i])
                i = first(nxt, i + 1)
            return got

        for x in go:
            if (x.id, x.state) in taken:
                continue
            if hold.symptom(x):
                limit = x.ts + hold.seconds
                if not limit < upto:
                    self._wait = limit
                    break  # a cause may still come: it and everything after it wait
                # Depth first, without recursion: a cause goes after the causes it pulls in turn.
                take(x)
                stack = [(x, pulled(x, limit), 0)]
                while stack:
                    s, cands, k = stack[-1]
                    while k < len(cands) and (cands[k].id, cands[k].state) in taken:
                        k += 1
                    if k < len(cands):
                        c = cands[k]
                        stack[-1] = (s, cands, k + 1)
                        take(c)
                        stack.append((c, pulled(c, limit), 0))
                        continue
                    stack.pop()
                    if stack:
                        out.append(s)
                        self.stats["pulled"] += 1
            take(x)
            out.append(x)
        return out

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain data: the version, ``released`` (None for -inf), the buffered alerts (held ones
        included) and those forced out of a full buffer not yet released, each as msgpack."""
        return {
            "v": STATE_VERSION,
            "released": None if math.isinf(self.released) else self.released,
            "alerts": _ENC.encode(sorted(self._buf.values(), key=order_key)),
            "early": _ENC.encode(self._early),
        }

    def load_state(self, state: Any) -> None:
        """Replace the feed with one ``to_state`` made (or a version 1 one: its alerts before
        ``released`` were the forced-out ones); anything else raises ``StateError`` and leaves the
        feed as it was."""
        v = state.get("v") if isinstance(state, dict) else None
        if v not in (1, STATE_VERSION):
            raise StateError(f"alert feed state: not a version {STATE_VERSION} state")
        rel = state.get("released")
        if rel is not None and (isinstance(rel, bool) or not isinstance(rel, (int, float)) or not math.isfinite(rel)):
            raise StateError("alert feed state: released is not a finite number or null")
        released = -math.inf if rel is None else float(rel)
        alerts = _alerts(state, "alerts")
        early = _alerts(state, "early") if v == STATE_VERSION else [a for a in alerts if a.ts < released]
        if v == 1:
            alerts = [a for a in alerts if a.ts >= released]
        # The buffer holds at most max_buffer (``add`` forces the rest out); those forced out
        # wait beside it for the next release, so a full buffer's state has more in all.
        for what, n in (("alerts", len(alerts)), ("early", len(early))):
            if n > self.max_buffer:
                raise StateError(f"alert feed state: {n} {what}, more than the limit of {self.max_buffer}")
        buf: dict[tuple[str, str], AlertEvent] = {}
        for a in alerts:
            buf[(a.id, a.state)] = a
        self.released, self._buf, self._early = released, buf, early
        self._wait = -math.inf
        self.stats["buffered"] = len(buf)


def _alerts(state: dict[str, Any], key: str) -> list[AlertEvent]:
    """The alerts of a feed state's ``key`` (msgpack bytes), each with a finite ``ts``."""
    blob = state.get(key)
    if not isinstance(blob, bytes):
        raise StateError(f"alert feed state: {key} is not msgpack bytes")
    try:
        alerts = _DEC.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise StateError(f"alert feed state: {key} do not decode ({e})") from e
    for a in alerts:
        if not math.isfinite(a.ts):
            raise StateError(f"alert feed state: alert {a.id[:64]!r} has no finite ts")
    return alerts
