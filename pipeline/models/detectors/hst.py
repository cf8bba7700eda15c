"""A multivariate detector for faults no rule names: Half-Space Trees, one forest per cohort.

Features are per-GPU and normalised against the GPU's host peers (temperature above the host
mean, power and SM clock as a ratio of the host mean, utilisation difference, ...), so one
model serves every GPU of a cohort whatever the load, the aisle or the afternoon. A forest is
shared by the cohort (~62 KiB: docs/performance.md), so it is never one per GPU and it does not
see every sample: each GPU is scored every ``period`` seconds (GPUs take turns: in the model
set at a phase hashed from the GPU's host and index, alone by its id), every
``learn_every``-th turn is learnt from (every turn on a small fleet, with 16 or fewer GPUs due in
a tick), and in between a GPU keeps
its last score. Per-GPU state: that score and its time (16 bytes). In the model set the forest
learns by epochs (``apply_epoch``, pipeline/models/cohorts.py), so shards by host share one.

The forest is river's HalfSpaceTrees, same seed, same scores (halfspace.py), kept in numpy
arrays so that the engine snapshot holds plain numbers, never a pickled object
(docs/models.md#model-state).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from pipeline.errors import StateError
from pipeline.models.cohorts import PartError, check_int_array
from pipeline.models.detectors._util import nan_to_num, repeats
from pipeline.models.detectors.halfspace import HalfSpaceForest
from pipeline.models.protocol import BatchDetector, Features

# name: (definition, lower, upper) -- the limits map each feature onto HalfSpaceTrees' [0, 1].
NORMALISED = {
    "temp_dev": ("gpu_temp - hostmean:gpu_temp", -15.0, 25.0),
    "mem_temp_dev": ("memory_temp - hostmean:memory_temp", -15.0, 25.0),
    "power_ratio": ("power / hostmean:power", 0.4, 1.6),
    "clock_ratio": ("sm_clock / hostmean:sm_clock", 0.4, 1.3),
    "util_dev": ("gpu_util - hostmean:gpu_util", -80.0, 40.0),
}
_LO = np.array([lo for _, lo, _ in NORMALISED.values()])[:, None]
_SPAN = np.array([hi - lo for _, lo, hi in NORMALISED.values()])[:, None]
# The forest's columns: sorted by name, the order river draws the trees' splits from.
KEYS = tuple(sorted(NORMALISED))


def _normalise(F: Features, n: int) -> dict[str, np.ndarray]:
    def g(k: str) -> np.ndarray:
        v = F.get(k)
        return np.full(n, np.nan) if v is None else v

    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            "temp_dev": g("gpu_temp") - g("hostmean:gpu_temp"),
            "mem_temp_dev": g("memory_temp") - g("hostmean:memory_temp"),
            "power_ratio": g("power") / g("hostmean:power"),
            "clock_ratio": g("sm_clock") / g("hostmean:sm_clock"),
            "util_dev": g("gpu_util") - g("hostmean:gpu_util"),
        }
    # Missing -> the middle of the range: an absent feature says nothing, it is not extreme.
    # All five at once (one row each): the same arithmetic per element as one feature at a time.
    v = np.stack([out[k] for k in NORMALISED])
    z = np.clip(np.where(np.isfinite(v), (v - _LO) / _SPAN, 0.5), 0.0, 1.0)
    return dict(zip(NORMALISED, z))


class CohortHalfSpaceTrees(BatchDetector):
    features = (
        "gpu_temp",
        "memory_temp",
        "power",
        "sm_clock",
        "gpu_util",
        "hostmean:gpu_temp",
        "hostmean:memory_temp",
        "hostmean:power",
        "hostmean:sm_clock",
        "hostmean:gpu_util",
    )
    entity_arrays = ("score", "score_ts")
    cohort_attrs = ("n_learnt", "tick", "cohort_gpus", "acc_n", "acc_mass")
    fills = {"score": 0.0}
    # entity_arrays, which BatchDetector.__init__ creates by name:
    score: np.ndarray
    score_ts: np.ndarray

    def __init__(
        self,
        n_trees: int = 10,
        height: int = 8,
        window_size: int = 250,
        seed: int = 42,
        period: int = 60,
        learn_every: int = 4,
        warmup: int = 2000,
        **params: Any,
    ) -> None:
        super().__init__(
            n_trees=n_trees,
            height=height,
            window_size=window_size,
            seed=seed,
            period=period,
            learn_every=learn_every,
            warmup=warmup,
            **params,
        )
        self.period, self.warmup = max(1, int(period)), warmup
        self.learn_every = max(1, int(learn_every))
        self.forest = HalfSpaceForest(len(KEYS), n_trees=n_trees, height=height, window_size=window_size, seed=seed)
        self.n_learnt = 0
        self.tick = 0
        # While deferred (cohorts.py): the cohort's GPUs as of the last epoch applied, and this
        # epoch's part (rows learnt, their masses).
        self.cohort_gpus = 0
        self.acc_n = 0
        self.acc_mass = np.zeros(self.forest.l_mass.shape, dtype=np.int64)
        self._pending: tuple | None = None

    def _phase(self, ent: np.ndarray, F: Features) -> np.ndarray:
        """Each row's GPU's turn: deferred, a hash of its host and index (``phase``, the same
        in every shard); alone, its id."""
        if self.deferred and "phase" in F:
            return np.asarray(F["phase"], dtype=np.int64)
        return ent.astype(np.int64)

    def _due(
        self, ent: np.ndarray, ts: np.ndarray, F: Features, rep: tuple[np.ndarray, list[np.ndarray]] | None
    ) -> np.ndarray:
        """Whether a GPU's turn came since its row before (its last scored one, or the row before
        it in this call): its first sample at or after its turn, so that every GPU is scored
        whatever the sampling interval (only a sample exactly at the turn would come to 1 GPU in
        10 at 10 s); a GPU never scored is due at once."""
        if self.period == 1:
            return np.ones(len(ent), dtype=bool)
        phase = self._phase(ent, F)
        turn = (phase + nan_to_num(ts, nan=0.0).astype(np.int64)) // self.period
        before = self.score_ts[ent]
        if rep is not None:
            prev = rep[0]
            before = np.where(prev >= 0, ts[prev], before)
        was = (phase + nan_to_num(before, nan=0.0).astype(np.int64)) // self.period
        return np.isnan(before) | (turn > was)

    def score_many(self, ent: np.ndarray, ts: np.ndarray, F: Features) -> np.ndarray:
        n = len(ent)
        if n == 0:
            return np.empty(0)
        self._ensure(int(ent.max()) + 1)
        rep = repeats(ent)
        due = self._due(ent, ts, F, rep)
        idx = np.flatnonzero(due)
        Z = _normalise({k: v[idx] for k, v in F.items()}, len(idx))
        keys = list(Z)
        X = np.column_stack([Z[k] for k in KEYS]) if len(idx) else np.empty((0, len(KEYS)))
        # Deferred, the rows' paths are walked once, for their scores and for the masses that
        # ``learn_many`` counts; alone, the forest learns the rows themselves.
        P = self.forest.paths(X) if self.deferred else None
        fresh = self.forest.score(X) if P is None else self.forest.score_paths(P)
        score = self.score[ent].copy()
        score[idx] = fresh
        stale = ~due & (nan_to_num(ts - self.score_ts[ent], nan=np.inf) > 3 * self.period)
        score[stale] = 0.0
        if rep is not None:  # a GPU's later rows in its turn carry the score it just got
            prev, by_place = rep
            for r in by_place[1:]:
                r = r[~due[r]]
                score[r] = score[prev[r]]
        self._pending = (ts, idx, X, keys, fresh, P)
        self.last = {
            "expected": np.full(n, np.nan),
            "observed": score,
            "drivers": {k: np.full(n, np.nan) for k in keys},
        }
        for k in keys:
            self.last["drivers"][k][idx] = Z[k]
        return nan_to_num(score, nan=0.0)

    def learn_many(self, ent: np.ndarray, ts: np.ndarray, F: Features, mask: np.ndarray) -> None:
        if len(ent) == 0:
            return
        pend = self._take_pending(ent, ts, F)
        _, idx, X, _, fresh, P = pend
        self.score[ent[idx]] = fresh
        self.score_ts[ent[idx]] = ts[idx]
        ok = mask[idx]
        many = self.cohort_gpus > 16 * self.period if self.deferred else len(idx) > 16
        if self.learn_every > 1 and self.period > 1 and many:
            # A shared model has data to spare: learn from every learn_every-th turn of a GPU.
            turn = nan_to_num(ts[idx], nan=0.0).astype(np.int64) // self.period
            ok = ok & ((turn + self._phase(ent, F)[idx]) % self.learn_every == 0)
        if self.deferred:
            self.acc_mass += self.forest.masses(X[ok]) if P is None else self.forest.path_masses(P[ok])
            self.acc_n += int(ok.sum())
            return
        self.forest.learn(X[ok])  # in row order, as river's learn_one one row at a time
        self.n_learnt += int(ok.sum())

    def cohort_part(self) -> dict[str, Any]:
        if not self.acc_n:
            return {"n": 0}  # no masses to carry: an epoch without learning costs a few bytes
        part = {"n": self.acc_n, "mass": self.acc_mass}
        self.acc_n, self.acc_mass = 0, np.zeros_like(self.acc_mass)
        return part

    def check_part(self, part: dict[str, Any]) -> None:
        """``PartError`` unless ``part`` is one ``cohort_part`` makes: rows learnt, and their
        masses in this forest's shape."""
        n = part.get("n")
        if type(n) is not int or not 0 <= n < 2**62:
            raise PartError("half-space part: n is not a count")
        if n == 0 and set(part) == {"n"}:
            return
        if set(part) != {"n", "mass"}:
            raise PartError("half-space part: {'n', 'mass'} expected")
        check_int_array(part["mass"], "half-space part mass", shape=self.acc_mass.shape)

    def apply_epoch(self, parts: Any, n_gpus: int) -> None:
        """The epoch's learnt rows of every shard into the forest's window."""
        ps = [p for p in parts if p]
        n = sum(int(p["n"]) for p in ps)
        self.cohort_gpus = int(n_gpus)
        if n:
            mass = np.sum([np.asarray(p["mass"], dtype=np.int64) for p in ps if int(p["n"])], axis=0)
            self.forest.add_window(mass, n)
            self.n_learnt += n

    def warm(self, ent: np.ndarray) -> np.ndarray:
        return np.full(len(ent), self.n_learnt >= self.warmup)

    def to_state(self) -> dict[str, Any]:
        st = super().to_state()
        st["cohort"]["forest"] = self.forest.to_state()
        return st

    def load_state(self, st: dict[str, Any]) -> None:
        try:
            forest, n_learnt = st["cohort"]["forest"], st["cohort"]["n_learnt"]
        except (KeyError, TypeError) as e:
            raise StateError(f"half-space trees state lacks {e}") from e
        if not isinstance(forest, dict) or type(n_learnt) is not int or n_learnt < 0:
            raise StateError("half-space trees state: forest or n_learnt malformed")
        self.forest.load_state(forest)
        super().load_state(st)

    def learn_one(self, x: Mapping[str, Any]) -> None:
        # The single-sample protocol scores every call (no turn-taking).
        p, self.period = self.period, 1
        try:
            super().learn_one(x)
        finally:
            self.period = p

    def score_one(self, x: Mapping[str, Any]) -> float:
        p, self.period = self.period, 1
        try:
            s = super().score_one(x)
        finally:
            self.period = p
        return s if math.isfinite(s) else 0.0
