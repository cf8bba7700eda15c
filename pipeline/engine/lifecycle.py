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

from pipeline.engine.entities import grow


@dataclass(frozen=True)
class Transition:
    state: str        # "firing" | "resolved"
    entity: int
    ts: float         # event time of the sample (or tick) that made the change
    started_at: float # when the condition became true
    row: int          # row of the batch that made the change; -1 for a tick


def alert_id(rule: str, entity_key: str, started_at: float) -> str:
    """Deterministic id: the same alert found again after a crash or in a replay has the same id."""
    return hashlib.sha1(f"{rule}|{entity_key}|{started_at:.3f}".encode()).hexdigest()[:20]


class Lifecycle:
    """``for:`` and ``keep_firing_for:`` for one check over all entities of its level."""

    def __init__(self, for_s: float, keep_firing_for_s: float) -> None:
        self.for_s = for_s
        self.keep_s = keep_firing_for_s
        self.since = np.full(0, np.nan)       # condition continuously true since (NaN: not true)
        self.last_true = np.full(0, np.nan)
        self.started = np.full(0, np.nan)     # started_at of the firing alert
        self.firing = np.zeros(0, dtype=bool)
        self._idle = True   # no entity pending or firing: a tick where the condition holds nowhere is a no-op

    def _ensure(self, n: int) -> None:
        if len(self.since) < n:
            self.since = grow(self.since, n, np.nan)
            self.last_true = grow(self.last_true, n, np.nan)
            self.started = grow(self.started, n, np.nan)
            self.firing = grow(self.firing, n, False)

    def active(self, n: int) -> np.ndarray:
        self._ensure(n)
        return ~np.isnan(self.since[:n]) | self.firing[:n]

    def step(self, ts: np.ndarray, ent: np.ndarray, cond: np.ndarray, n_entities: int) -> list[Transition]:
        """Feed samples (in event-time order per entity) and their condition; return state changes."""
        self._ensure(n_entities)
        if self._idle:
            if not cond.any():
                return []
            interesting = cond
        else:
            act = ~np.isnan(self.since) | self.firing
            interesting = cond | act[ent]
            if not interesting.any():
                return []
        idx = np.flatnonzero(interesting)
        idx = idx[np.argsort(ent[idx], kind="stable")]
        out: list[Transition] = []
        ents = ent[idx]
        cuts = np.flatnonzero(np.diff(ents)) + 1
        for group in np.split(idx, cuts):
            e = int(ent[group[0]])
            since, last_true = float(self.since[e]), float(self.last_true[e])
            firing, started = bool(self.firing[e]), float(self.started[e])
            for i in group.tolist():
                t = float(ts[i])
                if cond[i]:
                    if math.isnan(since):
                        since = t
                    last_true = t
                    if not firing and t - since >= self.for_s:
                        firing, started = True, since
                        out.append(Transition("firing", e, t, since, i))
                else:
                    since = math.nan
                    if firing and t - last_true >= self.keep_s:
                        firing = False
                        out.append(Transition("resolved", e, t, started, i))
            self.since[e], self.last_true[e], self.firing[e], self.started[e] = since, last_true, firing, started
        self._idle = not (~np.isnan(self.since) | self.firing).any()
        return out

    def to_state(self) -> dict:
        return {"since": self.since, "last_true": self.last_true, "started": self.started, "firing": self.firing}

    def load_state(self, data: dict) -> None:
        self.since, self.last_true = data["since"], data["last_true"]
        self.started, self.firing = data["started"], data["firing"]
        self._idle = not (~np.isnan(self.since) | self.firing).any()
