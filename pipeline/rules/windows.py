"""Per-entity event-time windows and slow baselines, as dense arrays.

A window of length ``w`` is kept as a ring of panes of ``pw = max(tick, w/12)`` seconds (a
multiple of the engine tick) shared by all entities; each pane holds, per entity, the aggregates
rules ask for (sum, count, min, max, first value). The engine hands rules one tick of samples at
a time and panes are tick-aligned, so a chunk always falls in one pane and window values never
depend on how the stream was batched. A window's value at a sample covers the panes from
``ts - w`` to now, resolved to ``pw``. Memory: ``12 x 8`` bytes per aggregate per entity per
window.

``Baseline`` is an exponentially weighted mean and variance with time constant ``tau``; it does
not learn from a value more than 4 standard deviations off once warm, so a burst never becomes
the new normal, and it answers NaN until it has seen ``warmup`` samples. A change that lasts
longer than ``tau`` is a new regime, not a burst: the baseline restarts from it (otherwise a
baseline that warmed up during an idle spell would call every busy sample an outlier forever).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from pipeline.engine.state import COUNTER_COLS, View
from pipeline.numeric import distinct as distinct
from pipeline.numeric import group_stat as group_stat
from pipeline.numeric import grow, id_bound
from pipeline.rules import expr as E

PANES = 12
_NO_PANE = np.iinfo(np.int64).min // 2  # a slot that never held a pane
_REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.sum,
    "count": np.sum,
    "min": np.min,
    "max": np.max,
}  # over a window's panes
_COMBINE: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add,
    "count": np.add,
    "min": np.minimum,
    "max": np.maximum,
}  # two parts of one


class PaneWindow:
    """One window length over every entity: a ring of ``n`` panes, stored pane-major.

    All entities share the ring's clock: slot ``s`` holds pane ``slot_pane[s]`` for every
    entity. When event time enters a new pane, the slot it reuses is cleared for all entities
    at once (one row fill), so expiry costs O(entities) per pane instead of a per-entity mask
    on every query, and a query is a reduction over at most ``n`` contiguous rows.
    """

    _FILL = {"sum": 0.0, "count": 0.0, "min": np.inf, "max": -np.inf, "first": np.nan}

    def __init__(self, window_s: float, tick: float, aggs: tuple[str, ...]) -> None:
        self.window_s = window_s
        self.pw = max(tick, math.ceil(window_s / PANES / tick) * tick)
        self.n = max(1, math.ceil(window_s / self.pw))
        self.aggs = aggs
        self.slot_pane = np.full(self.n, _NO_PANE, dtype=np.int64)
        self.cur: int | None = None  # newest pane the ring has been advanced to
        self.data = {a: np.full((self.n, 0), self._FILL[a]) for a in aggs}
        self._full: dict[tuple[str, int], np.ndarray] = {}
        # Each aggregate over the window's panes before the newest one (``_closed``): they
        # change only when the ring advances or a late chunk lands in one of them.
        self._closed: dict[str, np.ndarray] = {}

    @property
    def capacity(self) -> int:
        return self.data[self.aggs[0]].shape[1] if self.aggs else 0

    def _ensure(self, n_ent: int) -> None:
        cap = self.capacity
        if cap < n_ent:
            size = max(n_ent, 2 * cap, 16)
            for a in self.aggs:
                grown = np.full((self.n, size), self._FILL[a])
                grown[:, :cap] = self.data[a]
                self.data[a] = grown
            self._full.clear()
            self._closed.clear()

    def _advance(self, p: int) -> int:
        """Move the ring's clock to pane ``p``, clearing the slots of panes that left the window;
        the newest pane after it."""
        if self.cur is not None and p <= self.cur:
            return self.cur
        start = p - self.n + 1 if self.cur is None else max(self.cur + 1, p - self.n + 1)
        for q in range(start, p + 1):
            s = q % self.n
            for a in self.aggs:
                self.data[a][s] = self._FILL[a]
            self.slot_pane[s] = q
        self.cur = p
        self._full.clear()
        self._closed.clear()
        return p

    def update(self, ent: np.ndarray | slice, ts0: float, values: np.ndarray, n_ent: int) -> None:
        """Fold one chunk (all in the pane of ``ts0``; rows grouped by entity, in time order).

        ``ent``: the rows' entity ids, or ``slice(0, n)`` when they are 0..n-1 (``View.ids``).
        """
        self._ensure(n_ent)
        p = int(math.floor(ts0 / self.pw))
        cur = self._advance(p)
        if p <= cur - self.n:
            return  # older than the whole window: nothing of it can be asked for any more
        slot = p % self.n
        ok = ~np.isnan(values)
        if ok.all():
            e, v = ent, values
        else:
            e = (np.arange(ent.start, ent.stop) if isinstance(ent, slice) else ent)[ok]
            v = values[ok]
        if not len(v):
            # Nothing folded in (a field no row of the chunk has): every answer kept for this
            # pane still holds, so a window over a field the fleet does not send costs no
            # reduction a tick.
            return
        self._full.clear()
        if p != cur:
            self._closed.clear()  # a late chunk: one of the older panes changes
        d = self.data
        if isinstance(e, slice) or distinct(e)[1]:
            # One row per entity (the usual tick): plain fancy indexing, several times faster
            # than the unbuffered ufunc.at that repeated entities need.
            if "sum" in d:
                d["sum"][slot, e] += v
            if "count" in d:
                d["count"][slot, e] += 1.0
            if "min" in d:
                row = d["min"][slot]
                row[e] = np.minimum(row[e], v)
            if "max" in d:
                row = d["max"][slot]
                row[e] = np.maximum(row[e], v)
        else:
            if "sum" in d:
                np.add.at(d["sum"][slot], e, v)
            if "count" in d:
                np.add.at(d["count"][slot], e, 1.0)
            if "min" in d:
                np.minimum.at(d["min"][slot], e, v)
            if "max" in d:
                np.maximum.at(d["max"][slot], e, v)
        if "first" in d:
            row = d["first"][slot]
            if isinstance(e, slice):
                block = row[e]
                np.copyto(block, v, where=np.isnan(block))
                return
            first_row = np.ones(len(e), dtype=bool)
            first_row[1:] = e[1:] != e[:-1]
            fe, fv = e[first_row], v[first_row]
            unset = np.isnan(row[fe])
            row[fe[unset]] = fv[unset]

    def query(self, agg: str, ent: np.ndarray | slice, ts0: float) -> np.ndarray:
        """The aggregate over the window for each row's entity (NaN where the window is empty).

        With ``ent`` a slice (``View.ids``) the answer is a view of the reduced row: read it,
        never write it (every caller makes new arrays of what it reads).
        """
        self._ensure(id_bound(ent))
        p = int(math.floor(ts0 / self.pw))
        self._advance(p)
        key = (agg, p)
        full = self._full.get(key)
        if full is None:
            full = self._full[key] = self._reduce(agg, p)
        return full[ent]

    def _reduce(self, agg: str, p: int) -> np.ndarray:
        """``agg`` over the window ending in pane ``p``, for every entity.

        For the newest pane (every tick's question) the older panes' part is kept until the
        ring moves (``_closed_part``) and combined with the newest pane's row: a query reads
        one row instead of up to twelve. ``min``, ``max``, ``first`` and counts are exactly
        what a reduction of all panes gives; a ``sum`` adds the newest pane last, which for
        non-integer values can differ from a sum in slot order in the last bit.
        """
        if p == self.cur and self.slot_pane[p % self.n] == p:
            slot = p % self.n
            part = lambda a: self._with_newest(a, slot)  # noqa: E731
            n_live = lambda: int(self._closed_panes().sum()) + 1  # noqa: E731
        else:
            live = (self.slot_pane > p - self.n) & (self.slot_pane <= p)
            part = lambda a: self._over(a, live)  # noqa: E731
            n_live = lambda: int(live.sum())  # noqa: E731
        if agg in ("sum", "avg"):
            s = part("sum")
            c = part("count") if "count" in self.data else np.full(s.shape, float(n_live()))
            if agg == "sum":  # no division: nothing to silence (errstate costs ~2 us a query)
                return np.where(c > 0, s, np.nan)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(c > 0, s / c, np.nan)
        if agg in ("min", "max"):
            m = part(agg)
            return np.where(np.isinf(m), np.nan, m)
        if agg == "first":
            return part("first")
        raise ValueError(agg)

    def _with_newest(self, a: str, slot: int) -> np.ndarray:
        older, row = self._closed_part(a), self.data[a][slot]
        if a == "first":
            return np.where(np.isnan(older), row, older)
        return _COMBINE[a](older, row)

    def _closed_panes(self) -> np.ndarray:
        """Which slots hold the window's panes before the newest."""
        cur = _NO_PANE if self.cur is None else self.cur  # no pane yet: none is closed
        return (self.slot_pane > cur - self.n) & (self.slot_pane < cur)

    def _closed_part(self, a: str) -> np.ndarray:
        got = self._closed.get(a)
        if got is None:
            if a == "first":
                got = self._first(self._closed_panes())
            else:
                # Which slots to reduce, found once per ring move for every aggregate.
                rows = self._closed.get("")
                if rows is None:
                    live = self._closed_panes()
                    rows = self._closed[""] = np.flatnonzero(live) if live.any() and not live.all() else live
                got = self._reduce_rows(a, rows)
            self._closed[a] = got
        return got

    def _reduce_rows(self, a: str, rows: np.ndarray) -> np.ndarray:
        """``_over(a, live)`` with the live slots as ``_closed_part`` keeps them: their indices,
        or the mask itself when it holds none or all of them."""
        if rows.dtype == bool:
            if not rows.any():
                return np.full(self.capacity, self._FILL[a])
            return _REDUCE[a](self.data[a], axis=0)
        return _REDUCE[a](self.data[a][rows], axis=0)

    def _over(self, a: str, live: np.ndarray) -> np.ndarray:
        """Aggregate ``a`` of the ``live`` slots, per entity (its fill value where none is live)."""
        if a == "first":
            return self._first(live)
        if not live.any():
            return np.full(self.capacity, self._FILL[a])
        return _REDUCE[a](self.data[a][slice(None) if live.all() else np.flatnonzero(live)], axis=0)

    def _first(self, live: np.ndarray) -> np.ndarray:
        """The value first seen in the oldest pane among the ``live`` slots that holds one."""
        cap = self.capacity
        order = np.flatnonzero(live)[np.argsort(self.slot_pane[live], kind="stable")]
        if not len(order):
            return np.full(cap, np.nan)
        ordered = self.data["first"][order]
        have = ~np.isnan(ordered)
        return np.where(have.any(axis=0), ordered[have.argmax(axis=0), np.arange(cap)], np.nan)

    def to_state(self) -> dict:
        # Entity-major with a pane id per cell: the format snapshots have always had.
        cap = self.capacity
        return {
            "pane_id": np.ascontiguousarray(np.broadcast_to(self.slot_pane, (cap, self.n))),
            **{f"d_{a}": np.ascontiguousarray(v.T) for a, v in self.data.items()},
        }

    def load_state(self, st: dict) -> None:
        ids = np.asarray(st["pane_id"])
        cap = ids.shape[0]
        self.data = {a: np.ascontiguousarray(np.asarray(st[f"d_{a}"], dtype=np.float64).T) for a in self.aggs}
        self._full.clear()
        self._closed.clear()
        if cap == 0:
            self.slot_pane[:], self.cur = _NO_PANE, None
            return
        # The newest pane anyone wrote is the ring's clock; a cell from any other pane than its
        # slot's current one has left the window (older snapshots tracked this per entity).
        p = int(ids.max())
        if p < 0:
            self.slot_pane[:], self.cur = _NO_PANE, None
            for a in self.aggs:
                self.data[a][:] = self._FILL[a]
            return
        want = np.array([p - ((p - s) % self.n) for s in range(self.n)], dtype=np.int64)
        stale = ids.T != want[:, None]
        for a in self.aggs:
            self.data[a][stale] = self._FILL[a]
        self.slot_pane, self.cur = want, p


def _fold(
    m: np.ndarray,
    v: np.ndarray,
    n: np.ndarray,
    lt: np.ndarray,
    out_since: np.ndarray,
    t: np.ndarray,
    x: np.ndarray,
    tau: float | np.ndarray,
    warmup: float | np.ndarray,
    clip_sd: float | np.ndarray,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """One sample per entity folded into (mean, var, n, last_ts, out_since); ``valid`` False
    leaves an entity as it was (a NaN value)."""
    fresh = np.isnan(m)
    dt = np.where(np.isnan(lt), tau, np.maximum(t - lt, 0.0))
    alpha = 1.0 - np.exp(-dt / tau)
    v0 = np.where(np.isnan(v), 0.0, v)
    sd = np.sqrt(v0)
    with np.errstate(invalid="ignore"):
        outlier = (n >= warmup) & (np.abs(x - m) > clip_sd * np.maximum(sd, 1e-9 + 0.01 * np.abs(m)))
    since = np.where(outlier, np.where(np.isnan(out_since), t, out_since), np.nan)
    regime = outlier & (t - since >= tau)
    fresh |= regime
    learn = ~outlier | regime
    if valid is not None:
        learn &= valid
        regime &= valid
        since = np.where(valid, since, out_since)
    diff = np.where(fresh, 0.0, x - m)
    new_m = np.where(fresh, x, m + alpha * diff)
    new_v = np.where(fresh, 0.0, (1 - alpha) * (v0 + alpha * diff * diff))
    return (
        np.where(learn, new_m, m),
        np.where(learn, new_v, v),
        np.where(regime, 1.0, n + learn),
        np.where(learn, t, lt),
        np.where(regime, np.nan, since),
    )


class Baseline:
    def __init__(self, tau_s: float, warmup: int = 10, clip_sd: float = 4.0) -> None:
        self.tau = tau_s
        self.warmup = warmup
        self.clip_sd = clip_sd
        self.mean = np.full(0, np.nan)
        self.var = np.full(0, np.nan)
        self.n = np.zeros(0)
        self.last_ts = np.full(0, np.nan)
        self.out_since = np.full(0, np.nan)  # first of the current run of outliers

    def _ensure(self, n_ent: int) -> None:
        if len(self.mean) < n_ent:
            self.mean, self.var = grow(self.mean, n_ent, np.nan), grow(self.var, n_ent, np.nan)
            self.n, self.last_ts = grow(self.n, n_ent, 0.0), grow(self.last_ts, n_ent, np.nan)
            self.out_since = grow(self.out_since, n_ent, np.nan)

    def query(self, ent: np.ndarray | slice) -> np.ndarray:
        self._ensure(id_bound(ent))
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
            new = _fold(
                self.mean[e],
                self.var[e],
                self.n[e],
                self.last_ts[e],
                self.out_since[e],
                t,
                x,
                self.tau,
                self.warmup,
                self.clip_sd,
            )
            self.mean[e], self.var[e], self.n[e], self.last_ts[e], self.out_since[e] = new

    @staticmethod
    def update_many(
        baselines: list["Baseline"], ent: np.ndarray | slice, ts: np.ndarray, values: np.ndarray, n_ent: int
    ) -> None:
        """``update`` of several baselines over the same rows (one per entity), ``values`` (rows x
        baselines): one set of numpy calls for all of them. The same arithmetic per element, so
        the same results as updating each alone."""
        for b in baselines:
            b._ensure(n_ent)
        x = values.T
        valid = ~np.isnan(x)

        def col(a: Sequence[float]) -> np.ndarray:
            return np.array(a, dtype=float)[:, None]

        m, v, n, lt, since = (
            np.stack([getattr(b, k)[ent] for b in baselines]) for k in ("mean", "var", "n", "last_ts", "out_since")
        )
        new = _fold(
            m,
            v,
            n,
            lt,
            since,
            ts[None, :],
            x,
            col([b.tau for b in baselines]),
            col([b.warmup for b in baselines]),
            col([b.clip_sd for b in baselines]),
            valid,
        )
        for i, b in enumerate(baselines):
            b.mean[ent], b.var[ent], b.n[ent], b.last_ts[ent], b.out_since[ent] = (a[i] for a in new)

    def to_state(self) -> dict:
        return {"mean": self.mean, "var": self.var, "n": self.n, "last_ts": self.last_ts, "out_since": self.out_since}

    def load_state(self, st: dict) -> None:
        self.mean, self.var, self.n, self.last_ts = st["mean"], st["var"], st["n"], st["last_ts"]
        self.out_since = st["out_since"]


_INC_POS = {int(c): i for i, c in enumerate(COUNTER_COLS)}  # counter column -> its column of View.increase


class WindowStore:
    """The windows and baselines a rule set needs, shared by rules that ask for the same one."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self.panes: dict[tuple, PaneWindow] = {}
        self.baselines: dict[tuple, Baseline] = {}
        self._pane_sources: dict[tuple, tuple[int, str]] = {}
        self._base_sources: dict[tuple, int] = {}
        self._expr_keys: dict[E.Node, str] = {}
        # The raw and increase columns the pane windows read, and each window's place among
        # them, found once (``_held``).
        self._update_cols: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def key_of(self, node: E.Node) -> str:
        """A short memo key per distinct expression structure (nodes compare without positions)."""
        key = self._expr_keys.get(node)
        if key is None:
            key = self._expr_keys[node] = f"expr|{len(self._expr_keys)}"
        return key

    def pane(self, col: int, window_s: float, source: str, aggs: tuple[str, ...]) -> tuple:
        key = ("pane", col, window_s, source)
        if key in self.panes:
            have = self.panes[key]
            if not set(aggs) <= set(have.aggs):
                self.panes[key] = PaneWindow(window_s, self.tick, tuple(sorted(set(have.aggs) | set(aggs))))
        else:
            self.panes[key] = PaneWindow(window_s, self.tick, tuple(sorted(set(aggs))))
        self._pane_sources[key] = (col, source)
        self._update_cols = None
        return key

    def baseline(self, col: int, tau_s: float) -> tuple:
        key = ("ewm", col, tau_s)
        self.baselines.setdefault(key, Baseline(tau_s))
        self._base_sources[key] = col
        return key

    def update(self, view: View, ts0: float, n_ent: int) -> None:
        """Fold a chunk into every pane window (baselines are folded after evaluation).

        A window whose column no row of the chunk has is left alone: folding nothing in
        changes nothing (its ring moves on at the next query or value), and a fleet that does
        not send a field (no PCIe AER or kernel-log producer) pays one test a tick for all
        such windows instead of a call each.
        """
        ent = view.ids
        held = self._held(view)
        for i, (key, w) in enumerate(self.panes.items()):
            if not held[i]:
                continue
            col, source = self._pane_sources[key]
            vals = view.increase[:, _INC_POS[col]] if source == "inc" else view.frame.values[:, col]
            w.update(ent, ts0, vals, n_ent)

    def _held(self, view: View) -> np.ndarray:
        """Per pane window (in ``panes`` order), whether any row of ``view`` has its column."""
        if self._update_cols is None:
            src = [self._pane_sources[key] for key in self.panes]
            raw = sorted({c for c, s in src if s != "inc"})
            inc = sorted({_INC_POS[c] for c, s in src if s == "inc"})
            # Each window's place in [raw columns..., increase columns...].
            place = [inc.index(_INC_POS[c]) + len(raw) if s == "inc" else raw.index(c) for c, s in src]
            self._update_cols = (np.array(raw, np.intp), np.array(inc, np.intp), np.array(place, np.intp))
        raw_cols, inc_cols, at = self._update_cols
        # Which columns have a value on some row: one reduction over each kind's columns.
        have = np.concatenate(
            [
                (~np.isnan(view.frame.values[:, raw_cols])).any(axis=0),
                (~np.isnan(view.increase[:, inc_cols])).any(axis=0),
            ]
        )
        return have[at]

    def adopt(self, old: "WindowStore") -> None:
        """Take over the state of windows an older store already had (hot reload)."""
        for key, w in self.panes.items():
            prev = old.panes.get(key)
            if prev is not None and set(prev.aggs) == set(w.aggs):
                self.panes[key] = prev
        for key in self.baselines:
            if key in old.baselines:
                self.baselines[key] = old.baselines[key]

    def update_baselines(self, view: View, n_ent: int) -> None:
        ent = view.frame.gpu
        if len(self.baselines) > 1 and (isinstance(view.ids, slice) or distinct(ent)[1]):
            # One row per GPU (the usual tick): every baseline in one pass (Baseline.update_many).
            cols = [self._base_sources[k] for k in self.baselines]
            Baseline.update_many(
                list(self.baselines.values()), view.ids, view.frame.ts, view.frame.values[:, cols], n_ent
            )
            return
        for key, b in self.baselines.items():
            b.update(ent, view.frame.ts, view.frame.values[:, self._base_sources[key]], n_ent)

    def to_state(self) -> dict:
        return {
            "panes": [[list(k), w.to_state(), list(w.aggs)] for k, w in self.panes.items()],
            "baselines": [[list(k), b.to_state()] for k, b in self.baselines.items()],
        }

    def load_state(self, st: dict) -> None:
        for k, ws, aggs in st.get("panes", []):
            key = tuple(k)
            if key in self.panes and set(self.panes[key].aggs) == set(aggs):
                self.panes[key].load_state(ws)
        for k, bs in st.get("baselines", []):
            key = tuple(k)
            if key in self.baselines:
                self.baselines[key].load_state(bs)
