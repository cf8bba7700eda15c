"""Cohort state, versioned by event time, so that the fleet's models can be split into shards.

A model's per-GPU state lives with the GPU's rows. What compares across GPUs -- a cohort's
thermal prior and residual spread, its median error rate, its Half-Space forest, a quantile
decider's histogram, the share of the fleet under a power cap -- changes only once per *epoch*
of event time (``EPOCH_S``): each shard (a ``ModelSet`` over some of the fleet's hosts) adds
what its GPUs learnt in the epoch to the epoch's *part*, publishes the part once its ticks have
passed the epoch, and every shard applies the epoch's parts of all shards at the start of the
epoch ``LAG_EPOCHS`` later. Sums in a part are fixed-point integers (``fixed``), so any split of
the fleet adds up to the same number, to the last bit; what is not a sum travels as a multiset
(a cohort's error rates) or as counts per epoch (when GPUs were last seen and capped). So one
process (replay) and any number of shards apply the same cohort state at the same second.

A part is a dict of numbers, strings and numeric arrays (the model state's rules,
docs/models.md#model-state):

    {"epoch": k, "until": j,                 # covers epochs k..j-1 (no rows after k: unchanged)
     "n_gpus": {cohort: count},              # the shard's GPUs per cohort
     "models": {model: {cohort or "_decider": the detector's or decider's part}},
     "context": {"seen": [...], "capped": [...]}}   # FleetContext's counts per epoch

>>> ex = LocalExchange()
>>> ex.publish("", {"epoch": 3, "until": 5})
>>> [p["epoch"] for p in ex.parts(4)]
[3]
>>> ex.parts(5) is None
True
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from pipeline.errors import StateError

EPOCH_S = 5.0  # event-time seconds between two changes of the cohort state
LAG_EPOCHS = 2  # an epoch's parts apply from the start of the epoch this many later
FIXED = float(2**20)  # fixed-point scale of the parts' sums (a millionth of a unit)
_CLIP = float(2**20)  # one row's contribution is clipped to this, so a tick's sum fits an int64
# The ``until`` of an open-ended part: a shard that flushed (every upstream task idle) learns
# nothing more until its hosts send again, and says so for every epoch to come.
OPEN_ENDED = 2**62
# What one shard's part may hold, checked where parts cross a trust boundary (``check_part``).
MAX_PART_COHORTS = 256
MAX_PART_VALUES = 1 << 20


def epoch_of(t: float) -> int:
    """The epoch event time ``t`` falls in.

    >>> epoch_of(12.0), epoch_of(9.999)
    (2, 1)
    """
    return math.floor(t / EPOCH_S + 1e-9)


def fixed(x: np.ndarray) -> list[int]:
    """Column sums of ``x`` (rows x columns, or one column) in fixed point: each row rounded
    first, so that the sum of any split of the rows is the sum of all of them.

    >>> fixed(np.array([[0.5, 1.0], [0.25, -1.0]]))
    [786432, 0]
    """
    a = np.asarray(x, dtype=float)
    if a.ndim == 1:
        a = a[:, None]
    if not len(a):
        return [0] * a.shape[1]
    q = np.rint(np.clip(np.nan_to_num(a, nan=0.0), -_CLIP, _CLIP) * FIXED).astype(np.int64)
    return [int(v) for v in q.sum(axis=0)]


def add(parts: Sequence[Sequence[int]], width: int) -> list[int]:
    """Element-wise sum of fixed-point vectors (Python integers: exact, any order)."""
    out = [0] * width
    for p in parts:
        for i, v in enumerate(p[:width]):
            out[i] += int(v)
    return out


def weighted_median(values: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> float:
    """The median of the multiset that ``values`` with ``counts`` make up (every shard's part
    together), by ``np.median``'s arithmetic: the middle value, or the mean of the two middle
    ones. NaN when empty.

    >>> weighted_median([np.array([1.0, 3.0])], [np.array([1, 2])])
    3.0
    >>> weighted_median([np.array([1.0]), np.array([3.0])], [np.array([1]), np.array([1])])
    2.0
    """
    v = np.concatenate([np.asarray(a, dtype=float) for a in values]) if values else np.empty(0)
    c = np.concatenate([np.asarray(a, dtype=np.int64) for a in counts]) if counts else np.empty(0, np.int64)
    n = int(c.sum()) if len(c) else 0
    if n == 0:
        return math.nan
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(c[order])
    h = n // 2

    def at(i: int) -> float:  # the i-th smallest value of the multiset (0-based)
        return float(v[int(np.searchsorted(cum, i, side="right"))])

    return at(h) if n % 2 else float((at(h - 1) + at(h)) / 2.0)


class PartError(ValueError):
    """A cohort part that is not what a shard makes (``check_part``): refused, never applied."""


def check_int_array(v: Any, what: str, length: int | None = None, shape: tuple[int, ...] | None = None) -> None:
    """``PartError`` unless ``v`` is an integer array (of ``length`` or ``shape``), non-negative.

    >>> check_int_array(np.array([1, 2]), "counts", length=2)
    >>> check_int_array([1.5], "counts")
    Traceback (most recent call last):
    ...
    pipeline.models.cohorts.PartError: counts: a list, expected an integer array
    """
    if not isinstance(v, np.ndarray) or v.dtype.kind not in "iu":
        got = f"{v.dtype} array" if isinstance(v, np.ndarray) else f"a {type(v).__name__}"
        raise PartError(f"{what}: {got}, expected an integer array")
    if v.size > MAX_PART_VALUES or (length is not None and v.shape != (length,)) or (shape and v.shape != shape):
        raise PartError(f"{what}: shape {list(v.shape)}, expected {list(shape or (length,))}")
    if v.size and int(v.min()) < 0:
        raise PartError(f"{what}: a negative count")


def check_frame(part: Any) -> None:
    """``PartError`` unless ``part`` is a map whose epochs are integers, ``epoch <= until``."""
    if not isinstance(part, dict):
        raise PartError(f"a part is a map, not a {type(part).__name__}")
    e, u = part.get("epoch"), part.get("until")
    if type(e) is not int or type(u) is not int or not -OPEN_ENDED < e <= u <= OPEN_ENDED:
        raise PartError(f"epoch {e!r} and until {u!r}: integers, epoch <= until")


class CohortPending(Exception):
    """An epoch's parts are not all in yet: the shard must wait before this tick."""

    def __init__(self, epoch: int) -> None:
        super().__init__(f"cohort state of epoch {epoch} not complete")
        self.epoch = epoch


class CohortExchange(Protocol):
    """Where the shards' parts meet. Guarantees: ``parts(k)`` is every shard's part that
    covers epoch ``k`` once all are in, the same list (in shard order) for every shard that
    asks, and ``None`` until then."""

    def publish(self, shard: str, part: dict[str, Any]) -> None: ...

    def parts(self, epoch: int) -> list[dict[str, Any]] | None: ...

    def first(self) -> int | None:
        """The first epoch a part covers, once every shard has published; else ``None``."""
        ...

    def forget(self, shard: str, before: int) -> None:
        """Shard ``shard`` has applied every epoch before ``before``: what no shard needs any
        more may go."""
        ...


class SharedExchange:
    """The exchange of shards in one process (tests, and what a service's exchange must equal):
    ``shards`` names every shard. A shard that has published nothing yet holds every epoch: a
    driver releases a shard's rows only up to ``bound`` (every shard advances, rows or not)."""

    def __init__(self, shards: Sequence[str]) -> None:
        self.shards = list(shards)
        self.published: dict[str, list[dict[str, Any]]] = {s: [] for s in self.shards}
        self.opened: dict[str, int] = {}
        self.done: dict[str, int] = {}

    def publish(self, shard: str, part: dict[str, Any]) -> None:
        self.published[shard].append(part)
        self.opened[shard] = int(part["until"])

    def bound(self) -> int | None:
        """The first epoch a shard may not evaluate yet: ``LAG_EPOCHS`` past the oldest epoch
        some shard has not closed (None before every shard has closed one)."""
        if len(self.opened) < len(self.shards):
            return None
        return min(self.opened.values()) + LAG_EPOCHS

    def first(self) -> int | None:
        firsts = [int(v[0]["epoch"]) for v in self.published.values() if v]
        return min(firsts) if firsts else None

    def parts(self, epoch: int) -> list[dict[str, Any]] | None:
        out = []
        for s in self.shards:
            mine = self.published[s]
            if not mine:
                return None
            if mine[0]["epoch"] > epoch:
                # The shard opened after it: nothing of its own until its first epoch.
                out.append({"epoch": epoch, "until": mine[0]["epoch"]})
                continue
            hit = [p for p in mine if p["epoch"] <= epoch < p["until"]]
            if not hit:
                return None
            out.append(hit[0])
        return out

    def forget(self, shard: str, before: int) -> None:
        """Drop the parts that end before every shard's ``before`` (each shard's latest part
        stays: it may cover later epochs)."""
        self.done[shard] = max(self.done.get(shard, before), before)
        if len(self.done) < len(self.shards):
            return
        low = min(self.done.values())
        for s, mine in self.published.items():
            if len(mine) > 1:
                self.published[s] = [p for p in mine[:-1] if p["until"] > low] + mine[-1:]


class LocalExchange:
    """One shard alone (replay, a single fleet stage): its own parts, kept until applied."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, shard: str, part: dict[str, Any]) -> None:
        self.published.append(part)

    def first(self) -> int | None:
        return int(self.published[0]["epoch"]) if self.published else None

    def parts(self, epoch: int) -> list[dict[str, Any]] | None:
        for p in self.published:
            if p["epoch"] <= epoch < p["until"]:
                return [p]
        if self.published and self.published[0]["epoch"] > epoch:
            return []
        return None

    def forget(self, shard: str, before: int) -> None:
        """Drop the parts that end before epoch ``before`` (applied already)."""
        self.published = [p for p in self.published if p["until"] > before]


class NullExchange:
    """Where a model set that applies no cohort state publishes (an NCCL scorer: no DCGM rows,
    and its NCCL deciders read no epochs): nothing is kept, so nothing grows with time."""

    def publish(self, shard: str, part: dict[str, Any]) -> None:
        pass

    def first(self) -> int | None:
        return None

    def parts(self, epoch: int) -> list[dict[str, Any]] | None:
        return []

    def forget(self, shard: str, before: int) -> None:
        pass


class Epochs:
    """One shard's clock of cohort state: which epoch it is learning (``open``), which it
    applied last (``applied``), and where its parts go (``exchange``, under the name ``shard``).
    ``part(epoch, until)`` makes the shard's part of an epoch it closes; ``apply(k, parts)``
    folds epoch ``k`` of every shard's parts in.

    >>> seen = []
    >>> ep = Epochs(lambda k, until: {"epoch": k, "until": until}, lambda k, parts: seen.append(k))
    >>> for cur in (10, 11, 12, 15):
    ...     ep.advance(cur)
    ...     ep.apply_through(cur - LAG_EPOCHS)
    >>> seen, ep.applied
    ([10, 11, 12, 13], 13)
    """

    def __init__(
        self, part: Callable[[int, int], dict[str, Any]], apply: Callable[[int, list[dict[str, Any]]], None]
    ) -> None:
        self.part, self.apply = part, apply
        self.shard = ""
        self.exchange: CohortExchange = LocalExchange()
        self.open: int | None = None
        self.applied: int | None = None
        # The epoch of the open-ended part published at a flush (``close``), until rows come again.
        self.closed: int | None = None

    def advance(self, cur: int) -> None:
        """Close the epoch being learnt when ``cur`` is past it: publish this shard's part."""
        if self.open is None or self.closed is not None:
            # An empty part that opens the shard at ``cur``: the others know from when it counts.
            # After an open-ended part, the epoch after it: what is learnt from here on counts
            # from there (the open-ended part carried the sums of its own epoch).
            if self.closed is not None:
                cur = max(cur, self.closed + 1)
            self.exchange.publish(self.shard, {"epoch": cur, "until": cur})
            self.open, self.closed = cur, None
        elif cur > self.open:
            self.exchange.publish(self.shard, self.part(self.open, cur))
            self.open = cur

    def close(self, first: int) -> None:
        """Publish the part of the epoch being learnt as open-ended (``OPEN_ENDED``): this shard
        learns nothing more until its hosts send again (then ``advance`` reopens it). A shard
        never opened opens at ``first``, an epoch no later than any other shard's first."""
        if self.closed is not None:
            return
        if self.open is None:
            self.exchange.publish(self.shard, {"epoch": first, "until": OPEN_ENDED})
            self.open = first
        else:
            self.exchange.publish(self.shard, self.part(self.open, OPEN_ENDED))
        self.closed = self.open

    def apply_through(self, target: int) -> None:
        """Apply every epoch up to ``target`` not applied yet, in order, from every shard's parts
        (``CohortPending`` while one is missing). Epochs no shard learnt in are skipped at once:
        they change nothing."""
        k = self.applied + 1 if self.applied is not None else None
        while True:
            if k is None:
                first = self.exchange.first()
                if first is None or first > target:
                    return
                k = first
            if k > target:
                return
            parts = self.exchange.parts(k)
            if parts is None:
                raise CohortPending(k)
            self.apply(k, parts)
            self.applied = k
            nxt = min((int(p["until"]) for p in parts), default=k + 1)
            if nxt > k + 1:
                # Epochs k+1 .. nxt-1: no shard learnt (every part covering k goes on), so only
                # the state parts count, which are the same: apply the last of them alone.
                self.applied = min(nxt - 1, target)
                if self.applied > k:
                    self.apply(self.applied, parts)
            k = self.applied + 1
            self.exchange.forget(self.shard, k)

    def to_state(self) -> dict[str, Any]:
        """The clock, and a shard alone its parts not yet applied (a shared exchange keeps its own)."""
        local = self.exchange.published if isinstance(self.exchange, LocalExchange) else []
        return {"open": self.open, "applied": self.applied, "published": list(local), "closed": self.closed}

    def load_state(self, st: Any) -> None:
        """Take back ``to_state``; None (a snapshot from before the epochs): start afresh."""
        if st is None:
            self.open = self.applied = None
            return
        opened, applied, published, closed = st["open"], st["applied"], st["published"], st.get("closed")
        for v in (opened, applied, closed):
            if v is not None and type(v) is not int:
                raise StateError("model state: an epoch that is not an integer")
        if not isinstance(published, list) or not all(
            isinstance(p, dict) and type(p.get("epoch")) is int and type(p.get("until")) is int for p in published
        ):
            raise StateError("model state: malformed cohort parts")
        self.open, self.applied, self.closed = opened, applied, closed
        if isinstance(self.exchange, LocalExchange):
            self.exchange.published = published
