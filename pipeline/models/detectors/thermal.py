"""Thermal: a GPU running hotter than its load explains.

Expected temperature is learnt per cohort (GPU model) and per GPU by ridge regression of the
GPU's temperature above its host's mean, ``temp - host_mean(temp)``, on ``[1, power_lag -
host_mean(power)_lag]`` (power lagged with the ~45 s thermal time constant). The host's mean is
the ambient: a warm afternoon, a hot aisle or facility power capping move every GPU of the host
together and cancel out. Each GPU's coefficients are pulled toward the cohort's (ridge prior),
so a GPU seen only under one load still gets sensible slopes; its own intercept absorbs its slot
in the chassis. The score is the positive residual in units of the cohort's residual standard
deviation. While power is changing fast (checkpoint start/end), lags differ between GPUs and
the GPU is not judged (score 0) nor learnt from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.models.cohorts import FIXED, PartError, add, fixed
from pipeline.models.detectors._util import decay, last_per_entity, nan_to_num, repeats
from pipeline.models.protocol import BatchDetector, Features

K = 2
# An epoch's part (cohorts.py), fixed point: the learnt samples' X'X (K*K) and X'y (K) sums, the
# count of samples, the warm GPUs' squared residuals' sum and their count.
_PART = K * K + K + 3


def _lagged(
    dt: np.ndarray, lag_s: float, p: np.ndarray, hp: np.ndarray, pl0: np.ndarray, hl0: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The GPU's and its host's power lagged ``dt`` after lags ``pl0``/``hl0`` (NaN: none yet)."""
    w = decay(dt, lag_s)
    p_lag = np.where(np.isnan(pl0), p, w * pl0 + (1 - w) * p)
    hp_lag = np.where(np.isnan(hl0), hp, w * hl0 + (1 - w) * hp)
    return np.where(np.isnan(p), pl0, p_lag), np.where(np.isnan(hp), hl0, hp_lag)


class ThermalResidual(BatchDetector):
    features = ("gpu_temp", "power", "hostmean:gpu_temp", "hostmean:power")
    entity_arrays = ("p_lag", "hp_lag", "last_ts", "xx", "xy", "nobs")
    cohort_attrs = ("xx_c", "xy_c", "res_var", "res_n", "acc")
    fills = {"xx": 0.0, "xy": 0.0, "nobs": 0.0}
    # entity_arrays, which BatchDetector.__init__ creates by name:
    p_lag: np.ndarray
    hp_lag: np.ndarray
    last_ts: np.ndarray
    xx: np.ndarray
    xy: np.ndarray
    nobs: np.ndarray

    def __init__(
        self,
        lag_s: float = 45.0,
        forget_s: float = 6 * 3600.0,
        ridge: float = 50.0,
        steady_w: float = 15.0,
        sd_floor: float = 0.5,
        lag_c_per_w: float = 0.015,
        warmup: int = 600,
        **params: Any,
    ) -> None:
        super().__init__(
            lag_s=lag_s,
            forget_s=forget_s,
            ridge=ridge,
            steady_w=steady_w,
            sd_floor=sd_floor,
            lag_c_per_w=lag_c_per_w,
            warmup=warmup,
            **params,
        )
        self.lag_c_per_w = lag_c_per_w
        self._swing = np.zeros(0)
        self.lag_s, self.forget_s, self.ridge = lag_s, forget_s, ridge
        self.steady_w, self.sd_floor, self.warmup = steady_w, sd_floor, warmup
        self.xx = np.zeros((0, K * K))
        self.xy = np.zeros((0, K))
        self.xx_c = np.zeros(K * K)
        self.xy_c = np.zeros(K)
        self.res_var = 1.0
        self.res_n = 0.0
        self.acc = [0] * _PART  # this epoch's part, while deferred
        self._pending: tuple | None = None

    def _x(self, ent: np.ndarray, ts: np.ndarray, F: Features) -> tuple[np.ndarray, ...]:
        """Lagged inputs as of these rows (without storing them) and whether power is steady."""
        self._ensure(int(ent.max()) + 1)
        p, hp = F["power"], F["hostmean:power"]
        t0, pl0, hl0 = self.last_ts[ent], self.p_lag[ent], self.hp_lag[ent]
        rep = repeats(ent)
        if rep is None:  # one row per GPU (the usual tick)
            p_lag, hp_lag = _lagged(ts - t0, self.lag_s, p, hp, pl0, hl0)
        else:
            # Several rows of a GPU: each lags from the row before it, as one call a row would
            # (``learn_many`` keeps the last row's lags, which then hold every row's).
            p_lag, hp_lag = np.empty(len(ent)), np.empty(len(ent))
            prev, by_place = rep
            for r in by_place:
                q = prev[r]
                if q[0] >= 0:  # a later layer: every row has one before it
                    t0[r] = np.where(np.isnan(ts[q]), t0[q], ts[q])
                    pl0[r], hl0[r] = p_lag[q], hp_lag[q]
                p_lag[r], hp_lag[r] = _lagged(ts[r] - t0[r], self.lag_s, p[r], hp[r], pl0[r], hl0[r])
        with np.errstate(invalid="ignore"):
            swing = nan_to_num(np.abs(p - p_lag) + np.abs(hp - hp_lag), nan=0.0)
        steady = swing <= self.steady_w
        self._swing = swing
        # Only the GPU's power above its host's mean: the host's level (busy or idle in a
        # checkpoint) hardly varies while learning, so a slope on it would extrapolate wildly.
        X = np.stack([np.ones(len(ent)), (p_lag - hp_lag) / 100.0], axis=1)
        y = F["gpu_temp"] - F["hostmean:gpu_temp"]
        ok = steady & ~np.isnan(y) & ~np.isnan(X).any(axis=1)
        return X, y, ok, p_lag, hp_lag

    def _beta(self, ent: np.ndarray) -> np.ndarray:
        eye = np.eye(K)
        bc = np.linalg.solve(self.xx_c.reshape(K, K) + 1e-3 * eye, self.xy_c)
        A = self.xx[ent].reshape(-1, K, K) + self.ridge * eye
        b = self.xy[ent] + self.ridge * bc
        return np.linalg.solve(A, b[..., None])[..., 0]

    def score_many(self, ent: np.ndarray, ts: np.ndarray, F: Features) -> np.ndarray:
        n = len(ent)
        if n == 0:
            return np.empty(0)
        X, y, ok, p_lag, hp_lag = self._x(ent, ts, F)
        beta = self._beta(ent)
        pred = np.einsum("ij,ij->i", nan_to_num(X), beta)
        res = y - pred
        # While power moves, GPUs' different thermal lags make the residual swing by up to about
        # k x the power change (k ~ 0.06 C/W on Hopper): widen the allowance rather than go blind.
        sd = np.sqrt(max(self.res_var, 0.0) + self.sd_floor**2) + self.lag_c_per_w * self._swing
        usable = ~np.isnan(y) & ~np.isnan(X).any(axis=1)
        score = np.where(usable, np.maximum(res, 0.0) / sd, 0.0)
        score = nan_to_num(score, nan=0.0, posinf=0.0)
        self._pending = (ts, X, y, ok, p_lag, hp_lag, res)
        self.last = {
            "expected": pred + F["hostmean:gpu_temp"],
            "observed": F["gpu_temp"],
            "drivers": {"power": F["power"], "host_mean_temp": F["hostmean:gpu_temp"], "residual_c": res},
        }
        return score

    def learn_many(self, ent: np.ndarray, ts: np.ndarray, F: Features, mask: np.ndarray) -> None:
        if len(ent) == 0:
            return
        pend = self._take_pending(ent, ts, F)
        _, X, y, ok, p_lag, hp_lag, res = pend
        last = last_per_entity(ent)
        e = ent[last]
        # Lags always advance (they follow physics, not the decision).
        self.p_lag[e], self.hp_lag[e] = p_lag[last], hp_lag[last]
        have_ts = ~np.isnan(ts[last])
        self.last_ts[e[have_ts]] = ts[last][have_ts]
        sel = last[ok[last] & mask[last]]
        if not len(sel):
            return
        es = ent[sel]
        # Forgetting per learnt sample (steady samples come about once a tick).
        w = np.full(len(sel), np.exp(-1.0 / self.forget_s))
        Xs, ys = X[sel], y[sel]
        outer = (Xs[:, :, None] * Xs[:, None, :]).reshape(len(sel), K * K)
        self.xx[es] = w[:, None] * self.xx[es] + outer
        self.xy[es] = w[:, None] * self.xy[es] + Xs * ys[:, None]
        self.nobs[es] += 1.0
        r = res[sel]
        warm_r = np.isfinite(r) & (self.nobs[es] >= self.warmup)
        part = fixed(outer) + fixed(Xs * ys[:, None]) + [len(sel) * int(FIXED)] + fixed(r[warm_r] ** 2)
        part.append(int(warm_r.sum()) * int(FIXED))
        self.acc = add([self.acc, part], _PART)
        if not self.deferred:
            self.apply_epoch([self.cohort_part()], len(self.nobs))

    def cohort_part(self) -> dict[str, Any]:
        part, self.acc = self.acc, [0] * _PART
        return {"sums": part}

    def check_part(self, part: dict[str, Any]) -> None:
        """``PartError`` unless ``part`` is one ``cohort_part`` makes: ``_PART`` integer sums."""
        sums = part.get("sums")
        if set(part) != {"sums"} or not isinstance(sums, list) or len(sums) != _PART:
            raise PartError(f"thermal part: {{'sums': {_PART} integers}} expected")
        if not all(type(v) is int and abs(v) < 2**63 for v in sums):
            raise PartError("thermal part: a sum that is not a 64-bit integer")

    def apply_epoch(self, parts: Any, n_gpus: int) -> None:
        """The cohort's prior decays by the samples learnt (per GPU, as each GPU's own
        statistics do) and takes their mean; the residual variance is a slow EW over the warm
        GPUs' unflagged residuals."""
        tot = [v / FIXED for v in add([p["sums"] for p in parts if p], _PART)]
        n_sel, n = tot[K * K + K], max(1.0, float(n_gpus))
        if n_sel:
            lam = np.exp(-n_sel / self.forget_s / n)
            self.xx_c = lam * self.xx_c + np.array(tot[: K * K]) / n
            self.xy_c = lam * self.xy_c + np.array(tot[K * K : K * K + K]) / n
        n_r = round(tot[-1])
        if n_r:
            a = min(1.0, n_r / max(self.res_n + n_r, 1.0)) if self.res_n < 10_000 else n_r / 10_000
            self.res_var = (1 - a) * self.res_var + a * tot[-2] / n_r
            self.res_n += n_r

    def warm(self, ent: np.ndarray) -> np.ndarray:
        self._ensure(int(ent.max()) + 1 if len(ent) else 0)
        return self.nobs[ent] >= self.warmup
