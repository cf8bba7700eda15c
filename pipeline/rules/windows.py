"""Per-entity event-time windows and slow baselines, as dense arrays.

A window of length ``w`` is kept as a ring of panes of ``pw = max(tick, w/12)`` seconds (a
multiple of the engine tick) per entity; each pane holds the aggregates rules ask for (sum,
count, min, max, first value). The engine hands rules one tick of samples at a time and panes
are tick-aligned, so a chunk always falls in one pane and window values never depend on how the
stream was batched. A window's value at a sample covers the panes from ``ts - w`` to now,
resolved to ``pw``. Memory: ``12 x (8 + 8 per aggregate)`` bytes per entity per window.

``Baseline`` is an exponentially weighted mean and variance with time constant ``tau``; it does
not learn from a value more than 4 standard deviations off once warm, so a burst never becomes
the new normal, and it answers NaN until it has seen ``warmup`` samples. A change that lasts
longer than ``tau`` is a new regime, not a burst: the baseline restarts from it (otherwise a
baseline that warmed up during an idle spell would call every busy sample an outlier forever).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.engine.entities import grow

PANES = 12


class PaneWindow:
    def __init__(self, window_s: float, tick: float, aggs: tuple[str, ...]) -> None:
        self.window_s = window_s
        self.pw = max(tick, math.ceil(window_s / PANES / tick) * tick)
        self.n = max(1, math.ceil(window_s / self.pw))
        self.aggs = aggs
        self.pane_id = np.full((0, self.n), -1, dtype=np.int64)
        self.data = {a: np.zeros((0, self.n)) for a in aggs}
        self._mask_for: tuple | None = None

    _FILL = {"sum": 0.0, "count": 0.0, "min": np.inf, "max": -np.inf, "first": np.nan}

    def _ensure(self, n_ent: int) -> None:
        if len(self.pane_id) < n_ent:
            self.pane_id = grow(self.pane_id, n_ent, -1)
            for a in self.aggs:
                self.data[a] = grow(self.data[a], n_ent, self._FILL[a])

    def update(self, ent: np.ndarray, ts0: float, values: np.ndarray, n_ent: int) -> None:
        """Fold one chunk (all in the pane of ``ts0``; rows grouped by entity, in time order)."""
        self._ensure(n_ent)
        self._mask_for = None
        p = int(math.floor(ts0 / self.pw))
        slot = p % self.n
        touched, distinct = _distinct(ent)
        stale = touched[self.pane_id[touched, slot] != p]
        if len(stale):
            self.pane_id[stale, slot] = p
            for a in self.aggs:
                self.data[a][stale, slot] = self._FILL[a]
        ok = ~np.isnan(values)
        e, v = ent[ok], values[ok]
        if not len(e):
            return
        d = self.data
        if distinct:
            # One row per entity (the usual tick): plain fancy indexing, several times faster
            # than the unbuffered ufunc.at that repeated entities need.
            if "sum" in d:
                d["sum"][e, slot] += v
            if "count" in d:
                d["count"][e, slot] += 1.0
            if "min" in d:
                d["min"][e, slot] = np.minimum(d["min"][e, slot], v)
            if "max" in d:
                d["max"][e, slot] = np.maximum(d["max"][e, slot], v)
        else:
            if "sum" in d:
                np.add.at(d["sum"], (e, slot), v)
            if "count" in d:
                np.add.at(d["count"], (e, slot), 1.0)
            if "min" in d:
                np.minimum.at(d["min"], (e, slot), v)
            if "max" in d:
                np.maximum.at(d["max"], (e, slot), v)
        if "first" in d:
            first_row = np.ones(len(e), dtype=bool)
            first_row[1:] = e[1:] != e[:-1]
            fe, fv = e[first_row], v[first_row]
            unset = np.isnan(d["first"][fe, slot])
            d["first"][fe[unset], slot] = fv[unset]

    def _mask(self, ent: np.ndarray, ts0: float) -> np.ndarray:
        # Several aggregates of one window are asked for in a tick: compute the mask once.
        if self._mask_for is not None and self._mask_for[0] is ent and self._mask_for[1] == ts0:
            return self._mask_for[2]
        p = int(math.floor(ts0 / self.pw))
        ids = self.pane_id[ent]
        mask = (ids > p - self.n) & (ids <= p)
        self._mask_for = (ent, ts0, mask)
        return mask

    def query(self, agg: str, ent: np.ndarray, ts0: float) -> np.ndarray:
        """The aggregate over the window for each row's entity (NaN where the window is empty)."""
        self._ensure(int(ent.max()) + 1 if len(ent) else 0)
        mask = self._mask(ent, ts0)
        if agg == "sum":
            out = np.where(mask, self.data["sum"][ent], 0.0).sum(axis=1)
            cnt = np.where(mask, self.data["count"][ent], 0.0).sum(axis=1) if "count" in self.data else mask.sum(1)
            return np.where(cnt > 0, out, np.nan)
        if agg == "avg":
            s = np.where(mask, self.data["sum"][ent], 0.0).sum(axis=1)
            c = np.where(mask, self.data["count"][ent], 0.0).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(c > 0, s / c, np.nan)
        if agg == "min":
            m = np.where(mask, self.data["min"][ent], np.inf).min(axis=1)
            return np.where(np.isinf(m), np.nan, m)
        if agg == "max":
            m = np.where(mask, self.data["max"][ent], -np.inf).max(axis=1)
            return np.where(np.isinf(m), np.nan, m)
        if agg == "first":
            # The value first seen in the oldest pane of the window that holds one.
            firsts = np.where(mask, self.data["first"][ent], np.nan)
            order = np.argsort(np.where(mask, self.pane_id[ent], np.iinfo(np.int64).max), axis=1)
            ordered = np.take_along_axis(firsts, order, axis=1)
            have = ~np.isnan(ordered)
            idx = np.where(have.any(axis=1), have.argmax(axis=1), 0)
            first = ordered[np.arange(len(ent)), idx]
            return np.where(have.any(axis=1), first, np.nan)
        raise ValueError(agg)

    def to_state(self) -> dict:
        return {"pane_id": self.pane_id, **{f"d_{a}": v for a, v in self.data.items()}}

    def load_state(self, st: dict) -> None:
        self._mask_for = None
        self.pane_id = st["pane_id"]
        for a in self.aggs:
            self.data[a] = st[f"d_{a}"]


def _distinct(ent: np.ndarray) -> tuple[np.ndarray, bool]:
    """The entities of a chunk, sorted and unique, and whether each appears in one row only.

    Chunks arrive sorted by entity, so this is a linear scan instead of ``np.unique``'s sort.
    """
    if len(ent) < 2:
        return ent, True
    step = ent[1:] != ent[:-1]
    if not (ent[1:] >= ent[:-1]).all():
        u = np.unique(ent)
        return u, len(u) == len(ent)
    if step.all():
        return ent, True
    first = np.ones(len(ent), dtype=bool)
    first[1:] = step
    return ent[first], False


class Baseline:
    def __init__(self, tau_s: float, warmup: int = 10, clip_sd: float = 4.0) -> None:
        self.tau = tau_s
        self.warmup = warmup
        self.clip_sd = clip_sd
        self.mean = np.full(0, np.nan)
        self.var = np.full(0, np.nan)
        self.n = np.zeros(0)
        self.last_ts = np.full(0, np.nan)
        self.out_since = np.full(0, np.nan)   # first of the current run of outliers

    def _ensure(self, n_ent: int) -> None:
        if len(self.mean) < n_ent:
            self.mean, self.var = grow(self.mean, n_ent, np.nan), grow(self.var, n_ent, np.nan)
            self.n, self.last_ts = grow(self.n, n_ent, 0.0), grow(self.last_ts, n_ent, np.nan)
            self.out_since = grow(self.out_since, n_ent, np.nan)

    def query(self, ent: np.ndarray) -> np.ndarray:
        self._ensure(int(ent.max()) + 1 if len(ent) else 0)
        return np.where(self.n[ent] >= self.warmup, self.mean[ent], np.nan)

    def update(self, ent: np.ndarray, ts: np.ndarray, values: np.ndarray, n_ent: int) -> None:
        """Fold samples in (rows grouped by entity, time order within an entity)."""
        self._ensure(n_ent)
        ok = ~np.isnan(values)
        ent, ts, values = ent[ok], ts[ok], values[ok]
        if not len(ent):
            return
        # Rank of each row within its entity: apply rank 0 for all entities, then rank 1, ...
        start = np.ones(len(ent), dtype=bool)
        start[1:] = ent[1:] != ent[:-1]
        first_idx = np.maximum.accumulate(np.where(start, np.arange(len(ent)), 0))
        rank = np.arange(len(ent)) - first_idx
        for r in range(int(rank.max()) + 1):
            sel = rank == r
            e, t, x = ent[sel], ts[sel], values[sel]
            m, v, n, lt = self.mean[e], self.var[e], self.n[e], self.last_ts[e]
            fresh = np.isnan(m)
            dt = np.where(np.isnan(lt), self.tau, np.maximum(t - lt, 0.0))
            alpha = 1.0 - np.exp(-dt / self.tau)
            sd = np.sqrt(np.where(np.isnan(v), 0.0, v))
            with np.errstate(invalid="ignore"):
                outlier = (n >= self.warmup) & (np.abs(x - m) > self.clip_sd * np.maximum(sd, 1e-9 + 0.01 * np.abs(m)))
            since = np.where(outlier, np.where(np.isnan(self.out_since[e]), t, self.out_since[e]), np.nan)
            regime = outlier & (t - since >= self.tau)
            fresh |= regime
            learn = ~outlier | regime
            diff = np.where(fresh, 0.0, x - m)
            new_m = np.where(fresh, x, m + alpha * diff)
            new_v = np.where(fresh, 0.0, (1 - alpha) * (np.where(np.isnan(v), 0.0, v) + alpha * diff * diff))
            self.mean[e] = np.where(learn, new_m, m)
            self.var[e] = np.where(learn, new_v, v)
            self.n[e] = np.where(regime, 1.0, n + learn)
            self.last_ts[e] = np.where(learn, t, lt)
            self.out_since[e] = np.where(regime, np.nan, since)

    def to_state(self) -> dict:
        return {"mean": self.mean, "var": self.var, "n": self.n, "last_ts": self.last_ts, "out_since": self.out_since}

    def load_state(self, st: dict) -> None:
        self.mean, self.var, self.n, self.last_ts = st["mean"], st["var"], st["n"], st["last_ts"]
        self.out_since = st["out_since"]


def group_stat(keys: np.ndarray, values: np.ndarray, stat: str,
               groups: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Per row, ``stat`` (median/mean/min/max/count) of ``values`` over rows with the same key; NaN ignored.

    ``groups``: ``np.unique(keys, return_inverse=True)`` when the caller already has it (every
    peer function of a tick groups the same rows by host).
    """
    n = len(keys)
    if n == 0:
        return np.empty(0)
    uniq, inv = groups if groups is not None else np.unique(keys, return_inverse=True)
    ok = ~np.isnan(values)
    cnt = np.bincount(inv, weights=ok.astype(float), minlength=len(uniq))
    if stat == "count":
        return cnt[inv]
    if stat == "mean":
        s = np.bincount(inv, weights=np.where(ok, values, 0.0), minlength=len(uniq))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, s / cnt, np.nan)[inv]
    if stat in ("min", "max"):
        fill = np.inf if stat == "min" else -np.inf
        out = np.full(len(uniq), fill)
        (np.minimum if stat == "min" else np.maximum).at(out, inv[ok], values[ok])
        return np.where(np.isinf(out), np.nan, out)[inv]
    if stat == "median":
        order = np.lexsort((np.where(ok, values, np.inf), inv))
        sorted_inv = inv[order]
        starts = np.searchsorted(sorted_inv, np.arange(len(uniq)))
        c = cnt.astype(np.int64)
        lo = starts + np.maximum(c - 1, 0) // 2
        hi = starts + c // 2
        sv = np.where(ok, values, np.inf)[order]
        med = np.where(c > 0, (sv[np.minimum(lo, n - 1)] + sv[np.minimum(hi, n - 1)]) / 2.0, np.nan)
        return med[inv]
    raise ValueError(stat)
