"""Error counters: is this GPU's error rate surprising against its own and its cohort's normal?

Used for HBM single-bit errors and NVLink CRC/replay errors. Per GPU, three exponentially
decayed counts of the counter's increases (a short window for bursts, a medium one for slow
acceleration over hours, a long one for the GPU's own baseline rate); the cohort's baseline is
the median of its GPUs' long-run rates (in the model set as of the last epoch applied,
pipeline/models/cohorts.py). The expected count in a window is
``max(own rate, cohort rate, floor) x window``; the score is the Poisson surprise of the
observed count, ``-log10 P(N >= observed)``, the larger of the two windows'. Resets (driver
reloads) arrive as zero increases, so they are not errors; an increase counted over a gap
longer than the longer window (telemetry or the field cut for hours) adds only each window's share of it.
A GPU's rows in one call (its per-link records beside it) fold in one after another. Flagged points do not feed the
baseline (the model set masks them), so a burst never becomes this GPU's normal.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import gammainc

from pipeline.models.cohorts import PartError, check_int_array, weighted_median
from pipeline.models.detectors._util import decay, last_per_entity, nan_to_num, repeats
from pipeline.models.protocol import BatchDetector, Features


def poisson_surprise(observed: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """-log10 P(N >= observed) for N ~ Poisson(expected); 0 where observed <= expected."""
    obs = nan_to_num(observed, nan=0.0)
    lam = np.maximum(nan_to_num(expected, nan=0.0), 1e-12)
    out = np.zeros(len(obs))
    hot = np.flatnonzero(obs > lam)  # usually none: only those need the incomplete gamma
    if len(hot):
        with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
            s = -np.log10(np.maximum(gammainc(obs[hot], lam[hot]), 1e-300))
        out[hot] = np.where(np.isfinite(s), s, 300.0)
    return out


def _median(x: np.ndarray) -> float:
    """``float(np.median(x))`` of a small 1-D array by a sort and np.median's arithmetic (the
    mean of the two middle values), without its partition and wrappers (~12 -> 6 us at 48)."""
    n = len(x)
    if n == 0 or np.isnan(x).any():
        return float(np.median(x))
    s = np.sort(x)
    h = n // 2
    return float(s[h]) if n % 2 else float((s[h - 1] + s[h]) / 2.0)


class CounterRateSurprise(BatchDetector):
    entity_arrays = ("c_short", "c_mid", "c_long", "t_long", "last_ts", "inc_ts")
    cohort_attrs = ("cohort_rate",)
    epoch_state = True  # its part is the shard's state (rates), not the epoch's sums
    fills = {"c_short": 0.0, "c_mid": 0.0, "c_long": 0.0, "t_long": 0.0}
    # entity_arrays, which BatchDetector.__init__ creates by name:
    c_short: np.ndarray
    c_mid: np.ndarray
    c_long: np.ndarray
    t_long: np.ndarray
    last_ts: np.ndarray
    inc_ts: np.ndarray  # when the counters' increase was last known (a field can stop alone)

    def __init__(
        self,
        counters: tuple[str, ...] | list[str] = ("ecc_sbe_volatile",),
        short_s: float = 60.0,
        mid_s: float = 1800.0,
        long_s: float = 6 * 3600.0,
        floor_per_h: float = 1.0,
        warmup: int = 300,
        **params: Any,
    ) -> None:
        counters = tuple(counters)
        if not warmup < long_s:
            # The warm-up counts seconds of exposure in the decayed long window, which levels off
            # near long_s: a warm-up at or past it is never reached, and the model never scores.
            raise ValueError(f"warmup ({warmup} s of exposure) must be below long_s ({long_s:g} s)")
        super().__init__(
            counters=counters,
            short_s=short_s,
            mid_s=mid_s,
            long_s=long_s,
            floor_per_h=floor_per_h,
            warmup=warmup,
            **params,
        )
        self.counters = counters
        self.features = tuple(f"inc:{c}" for c in counters)
        self.short_s, self.mid_s, self.long_s = short_s, mid_s, long_s
        self.floor = floor_per_h / 3600.0
        self.warmup = warmup
        self.cohort_rate = 0.0  # the median GPU's rate as of the last epoch applied, while deferred
        self._pending: tuple | None = None

    def _inc(self, F: Features, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows' increase over the counters, and whether any of them was known."""
        tot = np.zeros(n)
        known = np.zeros(n, dtype=bool)
        for f in self.features:
            v = F.get(f)
            if v is not None:
                tot += nan_to_num(v, nan=0.0)
                known |= ~np.isnan(v)
        return tot, known

    def _step(
        self, ts: np.ndarray, inc: np.ndarray, t0: np.ndarray, s0: np.ndarray, m0: np.ndarray, since: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """Windows after rows at ``ts`` from windows ``s0``/``m0`` as of ``t0``; ``since``: when
        the counters' increase was last known. Returns them and the gap (NaN: no row before)."""
        gap = ts - t0
        dt = np.where(np.isnan(gap), 0.0, np.maximum(gap, 0.0))
        # An increase over a gap longer than the longer window (telemetry or the field cut for
        # hours) counts only each window's share of it, spread evenly, so hours of errors are no
        # burst. Not over a shorter one: at sparse sampling (every 2 or 5 min) that is every
        # sample, and a burst must still count whole.
        span = nan_to_num(ts - since, nan=0.0)
        long_gap = span > self.mid_s
        with np.errstate(divide="ignore", invalid="ignore"):
            cs = s0 * decay(dt, self.short_s) + inc * np.where(long_gap, self.short_s / span, 1.0)
            cm = m0 * decay(dt, self.mid_s) + inc * np.where(long_gap, self.mid_s / span, 1.0)
        return cs, cm, gap

    def _fold(self, ent: np.ndarray, ts: np.ndarray, inc: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, ...]:
        self._ensure(int(ent.max()) + 1)
        t0, s0, m0, since = self.last_ts[ent], self.c_short[ent], self.c_mid[ent], self.inc_ts[ent]
        rep = repeats(ent)
        if rep is None:
            return self._step(ts, inc, t0, s0, m0, since)
        # Several rows of a GPU: each from the one before it, as one call a row would.
        prev, by_place = rep
        cs, cm, gap = np.empty(len(ent)), np.empty(len(ent)), np.empty(len(ent))
        for r in by_place:
            p = prev[r]
            if p[0] >= 0:  # a later layer: every row has one before it
                t0[r], s0[r], m0[r] = ts[p], cs[p], cm[p]
                since[r] = np.where(known[p], ts[p], since[p])
            cs[r], cm[r], gap[r] = self._step(ts[r], inc[r], t0[r], s0[r], m0[r], since[r])
        return cs, cm, gap

    def _rates(self, ent: np.ndarray) -> np.ndarray:
        # Cohort rate: the median GPU's, so one failing GPU does not raise everybody's normal.
        if self.deferred:
            cohort = max(self.cohort_rate, self.floor)
        else:
            seen = self.t_long > 0
            cohort = max(_median(self.c_long[seen] / self.t_long[seen]) if seen.any() else 0.0, self.floor)
        # Own rate: decayed count over decayed exposure, shrunk toward the cohort's with one
        # hour of prior exposure, so a few minutes of history cannot set a GPU's normal.
        prior = 3600.0
        own = (self.c_long[ent] + cohort * prior) / (self.t_long[ent] + prior)
        return np.maximum(own, cohort)

    def score_many(self, ent: np.ndarray, ts: np.ndarray, F: Features) -> np.ndarray:
        n = len(ent)
        if n == 0:
            return np.empty(0)
        inc, known = self._inc(F, n)
        cs, cm, gap = self._fold(ent, ts, inc, known)
        rate = self._rates(ent)
        # Expected decayed count at steady rate r is r * tau.
        exp_s, exp_m = rate * self.short_s, rate * self.mid_s
        s = np.maximum(poisson_surprise(cs, exp_s), poisson_surprise(cm, exp_m))
        self._pending = (ts, inc, known, cs, cm, gap)
        self.last = {
            "expected": exp_s,
            "observed": cs,
            "drivers": {"errors_short": cs, "errors_mid": cm, "baseline_per_h": rate * 3600.0, "expected_mid": exp_m},
        }
        return s

    def learn_many(self, ent: np.ndarray, ts: np.ndarray, F: Features, mask: np.ndarray) -> None:
        if len(ent) == 0:
            return
        pend = self._take_pending(ent, ts, F)
        _, inc, known, cs, cm, gap = pend
        last = last_per_entity(ent)
        e = ent[last]
        # Windows always advance: they describe what happened, flagged or not.
        self.c_short[e], self.c_mid[e] = cs[last], cm[last]
        ok_ts = ~np.isnan(ts[last])
        self.last_ts[e[ok_ts]] = ts[last][ok_ts]
        kn = np.flatnonzero(known & ~np.isnan(ts))
        kl = kn[last_per_entity(ent[kn])]
        self.inc_ts[ent[kl]] = ts[kl]
        # The baseline learns only from unflagged time: each row in turn (``repeats``).
        rep = repeats(ent)
        for rows in [np.arange(len(ent))] if rep is None else rep[1]:
            sel = rows[mask[rows]]
            es = ent[sel]
            dt = np.where(np.isnan(gap[sel]), 0.0, np.maximum(gap[sel], 0.0))
            w = decay(dt, self.long_s)
            step = np.where(np.isnan(gap[sel]), 1.0, dt)  # a GPU's first row: one second
            self.c_long[es] = self.c_long[es] * w + inc[sel]
            self.t_long[es] = self.t_long[es] * w + step

    def cohort_part(self) -> dict[str, Any]:
        """The shard's GPUs' long-run rates as a multiset (distinct rates and how many GPUs have
        each: most GPUs of a healthy fleet share a rate of 0)."""
        seen = self.t_long > 0
        values, counts = np.unique(self.c_long[seen] / self.t_long[seen], return_counts=True)
        return {"rates": values, "counts": counts.astype(np.int64)}

    def check_part(self, part: dict[str, Any]) -> None:
        """``PartError`` unless ``part`` is one ``cohort_part`` makes: finite rates and their counts."""
        rates, counts = part.get("rates"), part.get("counts")
        if set(part) != {"rates", "counts"} or not isinstance(rates, np.ndarray) or rates.dtype.kind != "f":
            raise PartError("counter part: {'rates': float array, 'counts': integer array} expected")
        if rates.ndim != 1 or not np.isfinite(rates).all():
            raise PartError("counter part: rates not a 1-d array of finite numbers")
        check_int_array(counts, "counter part counts", length=len(rates))

    def apply_epoch(self, parts: Any, n_gpus: int) -> None:
        """The cohort rate: the median over every shard's GPUs."""
        ps = [p for p in parts if p]
        med = weighted_median([p["rates"] for p in ps], [p["counts"] for p in ps])
        self.cohort_rate = 0.0 if math.isnan(med) else med

    def warm(self, ent: np.ndarray) -> np.ndarray:
        self._ensure(int(ent.max()) + 1 if len(ent) else 0)
        return self.t_long[ent] >= self.warmup
