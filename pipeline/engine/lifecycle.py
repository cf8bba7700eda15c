"""Alert lifecycle per (check, entity): pending -> firing -> resolved, in event time.

State is four arrays indexed by entity id, so a healthy fleet costs one vectorised mask per
batch; the Python loop below only visits entities whose condition is true or whose alert is
active -- a handful when something is wrong, none when nothing is.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from pipeline.numeric import grow


@dataclass(frozen=True)
class Transition:
    state: str  # "firing" | "resolved"
    entity: int
    ts: float  # event time of the sample (or tick) that made the change
    started_at: float  # when the condition became true
    row: int  # row of the batch that made the change; -1 for a tick


def alert_id(rule: str, entity_key: str, started_at: float) -> str:
    """Deterministic id: the same alert found again after a crash or in a replay has the same id."""
    return hashlib.sha1(f"{rule}|{entity_key}|{started_at:.3f}".encode()).hexdigest()[:20]


class Lifecycle:
    """``for:`` and ``keep_firing_for:`` for one check over all entities of its level."""

    def __init__(self, for_s: float, keep_firing_for_s: float) -> None:
        self.for_s = for_s
        self.keep_s = keep_firing_for_s
        self.since = np.full(0, np.nan)  # condition continuously true since (NaN: not true)
        self.last_true = np.full(0, np.nan)
        self.started = np.full(0, np.nan)  # started_at of the firing alert
        self.firing = np.zeros(0, dtype=bool)
        # Entities pending or firing (what the four arrays say, kept as a set): a batch visits
        # these and the rows whose condition holds, never a pass over every entity's state.
        self._active: set[int] = set()

    def _ensure(self, n: int) -> None:
        if len(self.since) < n:
            self.since = grow(self.since, n, np.nan)
            self.last_true = grow(self.last_true, n, np.nan)
            self.started = grow(self.started, n, np.nan)
            self.firing = grow(self.firing, n, False)

    def reserve(self, n_entities: int) -> None:
        """Room for ``n_entities``, as ``step`` makes it: for a caller that skips a quiet step."""
        if len(self.since) < n_entities:
            self._ensure(n_entities)

    def step(self, ts: np.ndarray, ent: np.ndarray, cond: np.ndarray, n_entities: int) -> list[Transition]:
        """Feed samples (in event-time order per entity) and their condition (bool); return state changes."""
        self._ensure(n_entities)
        if cond.dtype != bool:
            cond = cond.astype(bool)
        if not self._active and not cond.any():
            return []
        # Every row of an entity that is active or whose condition holds somewhere in the batch:
        # a false row after a true one of the same entity (two samples in one tick) resets it.
        mark = np.zeros(len(self.since), dtype=bool)
        if self._active:
            mark[list(self._active)] = True
        mark[ent[cond]] = True
        idx = np.flatnonzero(mark[ent])
        rows, ents, times, conds = idx.tolist(), ent[idx].tolist(), ts[idx].tolist(), cond[idx].tolist()
        out: list[Transition] = []
        e = -1
        since = last_true = started = math.nan
        firing = False
        # Entity by entity (stable: each entity's rows stay in event-time order).
        for k in sorted(range(len(rows)), key=ents.__getitem__):
            if ents[k] != e:
                if e >= 0:
                    self._store(e, since, last_true, firing, started)
                e = ents[k]
                since, last_true = float(self.since[e]), float(self.last_true[e])
                firing, started = bool(self.firing[e]), float(self.started[e])
            t = times[k]
            if conds[k]:
                if math.isnan(since):
                    since = t
                last_true = t
                if not firing and t - since >= self.for_s:
                    firing, started = True, since
                    out.append(Transition("firing", e, t, since, rows[k]))
            else:
                since = math.nan
                if firing and t - last_true >= self.keep_s:
                    firing = False
                    out.append(Transition("resolved", e, t, started, rows[k]))
        if e >= 0:  # no row visited (active entities without a sample in this step): nothing to store
            self._store(e, since, last_true, firing, started)
        return out

    def quiet(self, cond: np.ndarray, n_entities: int) -> bool:
        """Whether ``step`` with this condition would change nothing and return no transition
        (no entity active, the condition false everywhere): then the caller may skip it."""
        self.reserve(n_entities)  # as step would: the arrays (and snapshots) keep their length
        return not self._active and not cond.any()

    def next_change(self, cond: np.ndarray) -> float:
        """Under a condition that holds still (one bool per entity): the earliest event time at
        which a step could do more than move ``last_true`` -- fire a pending alert, resolve one
        after ``keep_firing_for:``. -inf: the very next step changes state (the condition differs
        from what the arrays hold); inf: no step ever does. Steps before that time can be
        replaced by one step at the last of them (docs/architecture.md §4)."""
        n = len(cond)
        self._ensure(n)
        since, firing = self.since[:n], self.firing[:n]
        fresh = np.isnan(since)
        if (cond & fresh).any() or (~cond & ~fresh).any():
            return -math.inf
        due = np.concatenate([since[cond & ~firing] + self.for_s, self.last_true[:n][~cond & firing] + self.keep_s])
        return float(due.min()) if len(due) else math.inf

    @property
    def idle(self) -> bool:
        """No entity pending or firing."""
        return not self._active

    def _store(self, e: int, since: float, last_true: float, firing: bool, started: float) -> None:
        self.since[e], self.last_true[e], self.firing[e], self.started[e] = since, last_true, firing, started
        if firing or not math.isnan(since):
            self._active.add(e)
        else:
            self._active.discard(e)

    def to_state(self) -> dict:
        return {"since": self.since, "last_true": self.last_true, "started": self.started, "firing": self.firing}

    def load_state(self, data: dict) -> None:
        self.since, self.last_true = data["since"], data["last_true"]
        self.started, self.firing = data["started"], data["firing"]
        self._active = set(np.flatnonzero(~np.isnan(self.since) | self.firing).tolist())
