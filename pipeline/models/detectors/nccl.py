"""NCCL: a slow rank (straggler) and a slow communicator (busbw degradation).

Both read per-rank NCCL records (one per rank per communicator per reporting interval).

``RankStraggler``: in a synchronous collective a slow rank arrives last, so the *other* ranks'
kernels start early and spin: their execution time grows by the wait while the slow rank's does
not. Per communicator and interval, each rank's gap below the communicator's median,
``(median - own) / median``, in units of the typical gap of communicators of its size (one
detector per size: the lanes of pipeline/models/findings.py), is its score; a GPU's score is its
worst over its communicators. A job-wide slowdown moves every rank together: the gaps
stay small and no rank is named; likewise a whole host behind in all its communicators of one
kind (facility power capping) is a host-wide condition and names none of its GPUs.

``CommBusbw``: a communicator's bus bandwidth (median over its ranks) against the other
communicators of the same kind (same collective, rank count and message size) in the same
interval -- which removes fleet-wide congestion -- and against its own history (an EW mean of
that ratio: hosts differ statically by a few per cent). The score is the drop below its own
normal in units of the kind's typical deviation. Communicators whose ranks all sit on one host
(tensor parallel over NVLink) are judged per host.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from pipeline.engine.frame import NcclFrame
from pipeline.models.detectors._util import nan_to_num, repeats
from pipeline.numeric import combine, group_stats, groups, grow


def _frame_from_one(x: Mapping[str, Any]) -> NcclFrame:
    def f(k: str, d: float = math.nan) -> float:
        try:
            v = float(x.get(k, d))
        except (TypeError, ValueError):
            return math.nan
        return v if math.isfinite(v) else math.nan

    def i(k: str, d: int) -> int:
        v = f(k)
        return d if v != v else int(v)

    return NcclFrame(
        ts=np.array([f("ts", 0.0)]),
        host=np.array([i("host", 0)], dtype=np.int32),
        gpu=np.array([i("entity", 0)], dtype=np.int32),
        comm=[str(x.get("comm", "c"))],
        rank=np.array([i("rank", 0)], dtype=np.int32),
        nranks=np.array([i("nranks", 1)], dtype=np.int32),
        bytes=np.array([f("bytes", 0.0)]),
        exec_time_us=np.array([f("exec_time_us")]),
        busbw_gbs=np.array([f("busbw_gbs")]),
    )


def _group_keys(frame: NcclFrame, codes: dict[str, int]) -> np.ndarray:
    """One integer per (communicator, interval) group; ``codes`` maps comm ids to small ints
    (a communicator not in it gets the next, in the order of their first rows)."""
    got = list(map(codes.get, frame.comm))
    if None in got:
        for comm in dict.fromkeys(frame.comm):
            if comm not in codes:
                codes[comm] = len(codes)
        got = list(map(codes.__getitem__, frame.comm))
    c = np.array(got, dtype=np.int64)
    t = np.rint((frame.ts - (frame.ts.min() if len(frame) else 0.0)) * 1000.0).astype(np.int64)
    return c * (1 << 32) + t


class NcclDetector:
    """Base: scoring is vectorised over a frame (groups = communicator x interval); river's
    single-record protocol adds the last values remembered for the communicator's other ranks."""

    level = "gpu"
    features: tuple[str, ...] = ("exec_time_us", "busbw_gbs")

    def __init__(self, **params: Any) -> None:
        self.params = dict(params)
        self.latest: dict[str, dict[int, tuple[float, float, int]]] = {}
        self.codes: dict[str, int] = {}
        self.noise = 0.01
        self.n_learnt = 0
        self.last: dict[str, Any] = {}

    def clone(self) -> "NcclDetector":
        return type(self)(**self.params)

    def _augment(self, x: Mapping[str, Any]) -> NcclFrame:
        fr = _frame_from_one(x)
        comm, rank = fr.comm[0], int(fr.rank[0])
        others = [(r, v) for r, v in self.latest.get(comm, {}).items() if r != rank]
        if not others:
            return fr
        k = len(others) + 1
        return NcclFrame(
            ts=np.full(k, fr.ts[0]),
            host=np.concatenate([fr.host, [v[2] for _, v in others]]).astype(np.int32),
            gpu=np.concatenate([fr.gpu, np.full(k - 1, -1)]).astype(np.int32),
            comm=[comm] * k,
            rank=np.concatenate([fr.rank, [r for r, _ in others]]).astype(np.int32),
            nranks=np.full(k, fr.nranks[0], dtype=np.int32),
            bytes=np.full(k, fr.bytes[0]),
            exec_time_us=np.concatenate([fr.exec_time_us, [v[0] for _, v in others]]),
            busbw_gbs=np.concatenate([fr.busbw_gbs, [v[1] for _, v in others]]),
        )

    def score_one(self, x: Mapping[str, Any]) -> float:
        s = float(self.score_frame(self._augment(x))[0])
        return s if math.isfinite(s) else 0.0

    def learn_one(self, x: Mapping[str, Any]) -> None:
        fr = self._augment(x)
        s = self.score_frame(fr)
        mask = np.zeros(len(fr), dtype=bool)
        mask[0] = True
        self.learn_frame(fr, s, mask)
        self.latest.setdefault(fr.comm[0], {})[int(fr.rank[0])] = (
            float(fr.exec_time_us[0]),
            float(fr.busbw_gbs[0]),
            int(fr.host[0]),
        )

    def score_frame(self, frame: NcclFrame) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def learn_frame(self, frame: NcclFrame, scores: np.ndarray, mask: np.ndarray) -> None:
        gap = self.last.get("gap")
        if gap is None:
            gap = np.zeros(len(mask))
        ok = mask & np.isfinite(gap)
        judged = self.last.get("judged")
        if judged is not None:
            ok &= judged
        g = gap[ok]
        if len(g):
            # Typical absolute deviation of healthy members (slow EW over unflagged rows);
            # np.mean's sum and division, without its wrappers.
            a = max(len(g) / 20_000.0, len(g) / (self.n_learnt + len(g)))
            self.noise = (1 - a) * self.noise + a * float(np.add.reduce(np.abs(g)) / len(g))
            self.n_learnt += len(g)

    def warm_count(self) -> int:
        return self.n_learnt

    def to_state(self) -> dict[str, Any]:
        return {
            "latest": {c: {str(r): list(v) for r, v in m.items()} for c, m in self.latest.items()},
            "codes": self.codes,
            "noise": self.noise,
            "n_learnt": self.n_learnt,
            **self._extra_state(),
        }

    def load_state(self, st: dict[str, Any]) -> None:
        self.latest = {
            c: {int(r): (float(v[0]), float(v[1]), int(v[2])) for r, v in m.items()} for c, m in st["latest"].items()
        }
        self.codes = {str(k): int(v) for k, v in st["codes"].items()}
        self.noise, self.n_learnt = float(st["noise"]), int(st["n_learnt"])
        self._load_extra(st)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, st: dict[str, Any]) -> None:
        pass

    def nbytes_per_entity(self) -> float:
        return 0.0


class RankStraggler(NcclDetector):
    level = "gpu"

    def __init__(self, noise_floor: float = 0.01, min_ranks: int = 3, **params: Any) -> None:
        super().__init__(noise_floor=noise_floor, min_ranks=min_ranks, **params)
        self.noise_floor, self.min_ranks = noise_floor, min_ranks

    def score_frame(self, frame: NcclFrame) -> np.ndarray:
        n = len(frame)
        if n == 0:
            self.last = {"gap": np.empty(0)}
            return np.empty(0)
        # Codes of this frame alone: its groups are all it compares, and codes kept across frames
        # would grow with every communicator ever seen (jobs come and go).
        key = _group_keys(frame, {})
        ex = frame.exec_time_us
        med, cnt = group_stats(key, ex, ("median", "count"), groups(key))
        judged = (cnt >= self.min_ranks) & (med > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            gap = np.where(judged, (med - ex) / med, 0.0)
        gap = nan_to_num(gap, nan=0.0)
        # A whole host behind in every communicator of a kind (power capping, a warm rack) is a
        # host-wide condition, not a slow GPU: take out the host's median gap per kind, as the
        # communicator median takes out a job-wide slowdown.
        hk = combine(frame.host, frame.nranks, _as_int(frame.bytes))
        jg = np.where(judged, gap, np.nan)
        host_med, host_cnt = group_stats(hk, jg, ("median", "count"), groups(hk))
        gap = np.where(judged & (host_cnt >= 3), gap - nan_to_num(host_med, nan=0.0), gap)
        med = np.where(judged, med, np.nan)
        score = np.maximum(gap, 0.0) / max(self.noise, self.noise_floor)
        self.last = {
            "gap": gap,
            "judged": judged,
            "expected": med,
            "observed": ex.copy(),
            "drivers": {"exec_time_us": ex, "comm_median_us": med, "gap": gap},
        }
        return score


class CommBusbw(NcclDetector):
    level = "host"

    _PER_COMM = ("own_m", "own_w", "own_t", "multi", "seen_t")

    def __init__(
        self,
        noise_floor: float = 0.01,
        own_tau_s: float = 3600.0,
        min_peers: int = 3,
        forget_s: float = 86400.0,
        **params: Any,
    ) -> None:
        if not forget_s > 0:
            raise ValueError(f"forget_s must be above 0, got {forget_s!r}")
        super().__init__(noise_floor=noise_floor, own_tau_s=own_tau_s, min_peers=min_peers, forget_s=forget_s, **params)
        self.noise_floor, self.own_tau, self.min_peers, self.forget_s = noise_floor, own_tau_s, min_peers, forget_s
        # Per communicator code: EW mean of its ratio to peers, its weight, when last updated,
        # whether it was ever seen spanning hosts (then it has no single host to blame), and
        # when it was last seen: one unseen for ``forget_s`` is forgotten (jobs come and go).
        self.own_m = np.full(0, 1.0)
        self.own_w = np.zeros(0)
        self.own_t = np.full(0, np.nan)
        self.multi = np.zeros(0, dtype=bool)
        self.seen_t = np.full(0, np.nan)
        self._compact_at = 1024  # communicators known before the forgotten ones are dropped
        self._keyed: tuple[NcclFrame, np.ndarray] | None = None  # the last scored frame and its group keys

    def _extra_state(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._PER_COMM}

    def _load_extra(self, st: dict[str, Any]) -> None:
        self.own_m, self.own_w = np.array(st["own_m"], float), np.array(st["own_w"], float)
        self.own_t, self.multi = np.array(st["own_t"], float), np.array(st["multi"], bool)
        # A state of a build before seen_t: last seen when last learnt from (never: forgettable).
        seen = st.get("seen_t")
        self.seen_t = np.array(seen, float) if seen is not None else np.where(np.isnan(self.own_t), -np.inf, self.own_t)

    def _refresh(self, code: np.ndarray, ts: np.ndarray) -> bool:
        """Communicators of ``code`` seen at ``ts``: one unseen for ``forget_s`` starts afresh
        (what it learnt is of a job long gone), whenever the memory is compacted, so the answer
        does not depend on which other communicators this scorer sees. True when it compacted."""
        stale = self.seen_t[code] < ts - self.forget_s
        if stale.any():
            c = code[stale]
            self.own_m[c], self.own_w[c], self.own_t[c], self.multi[c] = 1.0, 0.0, np.nan, False
        np.fmax.at(self.seen_t, code, ts)
        if len(self.codes) <= self._compact_at:
            return False
        self._compact(float(ts.max()))
        return True

    def _compact(self, now: float) -> None:
        """Drop the communicators unseen for ``forget_s`` (their codes, their rows)."""
        used = np.array(sorted(self.codes.values()), dtype=np.int64)
        keep = used[~(self.seen_t[used] < now - self.forget_s)]
        at = {int(c): i for i, c in enumerate(keep)}
        self.codes = {comm: at[c] for comm, c in self.codes.items() if c in at}
        for name in self._PER_COMM:
            setattr(self, name, getattr(self, name)[keep])
        self._compact_at = max(1024, 2 * len(self.codes))

    def score_frame(self, frame: NcclFrame) -> np.ndarray:
        n = len(frame)
        if n == 0:
            self.last = {"gap": np.empty(0)}
            return np.empty(0)
        key = _group_keys(frame, self.codes)
        code = key >> 32
        m = len(self.codes)
        if len(self.own_m) < m:
            self.own_m, self.own_w = grow(self.own_m, m, 1.0), grow(self.own_w, m, 0.0)
            self.own_t, self.multi = grow(self.own_t, m, np.nan), grow(self.multi, m, False)
        if len(self.seen_t) < m:
            self.seen_t = grow(self.seen_t, m, np.nan)
        if self._refresh(code, frame.ts):  # compacted: the codes are renumbered
            key = _group_keys(frame, self.codes)
            code = key >> 32
        uniq, first, inv = groups(key, first=True)
        by_comm = (uniq, inv)  # grouped once for every statistic of the communicators below
        bw, n_bw = group_stats(key, frame.busbw_gbs, ("median", "count"), by_comm)
        hmin, hmax = group_stats(key, frame.host.astype(float), ("min", "max"), by_comm)
        self.multi[code[hmin != hmax]] = True
        # Peers: the other communicators of the same kind (rank count, message size) in the
        # same interval, one value per communicator (its first row stands for it).
        kind = combine(frame.nranks, _as_int(frame.bytes), np.rint(frame.ts - frame.ts.min()).astype(np.int64))
        rep = np.zeros(n, dtype=bool)
        rep[first] = True
        # Judged per host only when every rank of the communicator is in the group: a
        # communicator whose hosts stamp their records at different times (each host samples
        # at its own phase; clocks are skewed) arrives a rank or a few at a time, and such a
        # fragment is neither known to sit on one host nor comparable with whole peers.
        whole = n_bw >= frame.nranks
        single = ~self.multi[code] & whole
        peer_bw = np.where(rep & single, bw, np.nan)
        ref, npeers = group_stats(kind, peer_bw, ("median", "count"), groups(kind))
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where((npeers >= self.min_peers) & single & (ref > 0), bw / ref, np.nan)
        normal = np.where(self.own_w[code] >= 5, self.own_m[code], 1.0)
        judged = np.isfinite(ratio)
        gap = np.where(judged, normal - ratio, 0.0)
        self._rep = rep
        self._keyed = (frame, key)  # learn_frame gets the same frame: its keys are these
        self.last = {
            "gap": gap,
            "judged": judged & rep,
            "ratio": ratio,
            "expected": normal * ref,
            "observed": np.where(judged, bw, np.nan),
            "drivers": {"busbw_gbs": bw, "ratio_to_peers": ratio},
        }
        return np.maximum(gap, 0.0) / max(self.noise, self.noise_floor)

    def learn_frame(self, frame: NcclFrame, scores: np.ndarray, mask: np.ndarray) -> None:
        super().learn_frame(frame, scores, mask)
        ratio = self.last.get("ratio")
        if ratio is None or not len(ratio):
            return
        keyed = self._keyed
        key = keyed[1] if keyed is not None and keyed[0] is frame else _group_keys(frame, self.codes)
        rows = np.flatnonzero(mask & np.isfinite(ratio) & self._rep)
        if not len(rows):
            return
        codes = key[rows] >> 32
        rep = repeats(codes)
        # A communicator judged at several intervals of the frame: each in turn, in row order (a
        # repeated code in one scatter would count one of them, its weight raised by one).
        for sel in [slice(None)] if rep is None else rep[1]:
            code, r = codes[sel], rows[sel]
            t = frame.ts[r]
            lt = self.own_t[code]
            a = 1.0 - np.exp(-np.where(np.isnan(lt), 1.0, np.maximum(t - lt, 1.0)) / self.own_tau)
            a = np.maximum(a, 1.0 / (self.own_w[code] + 1.0))
            self.own_m[code] = (1 - a) * self.own_m[code] + a * ratio[r]
            self.own_w[code] += 1.0
            self.own_t[code] = t


def _as_int(x: np.ndarray) -> np.ndarray:
    """Group keys from a float column: an unknown (NaN/inf) size is its own group, -1."""
    return np.where(np.isfinite(x), x, -1).astype(np.int64)
