"""What the NCCL models find in a tick, per entity, and the scoring that finds it: the hand-over
between where NCCL records are scored and where a GPU's alert lifecycle runs.

The NCCL models judge a communicator, whose ranks span hosts, so they score where every rank's
records are; a model's alert on a GPU lives with the GPU's rows. One ``Findings`` is one model's
verdict on one tick of NCCL records: per entity (a GPU, or a host for host-level models) the
worst score of the tick, whether the decider flagged it, the time of the record, the evidence of
a flagged one, and whether the model was warm after learning from the tick. In one process the
entities are the engine's ids (``ent``); between processes they travel by name (``named``,
``located``), since every engine numbers its GPUs in its own order.

The records are scored in lanes by communicator size (``lane_of``): each lane has its own
detector state (its noise, its communicators' history) and decider, and everything the models
compare across communicators (the kind's peers, a host's median gap per kind) lies within one
lane. A lane can therefore be scored anywhere, and a GPU's findings of one tick from several
lanes are ``merge``-d into one the same way wherever they meet (docs/models.md#nccl-lanes).

>>> f = Findings("m", 10.0, np.array([0]), np.array([4.0]), np.array([True]), np.array([10.2]), {0: {"score": 4.0}}, True)
>>> f.named(["h1"], [("h1", 3)], level_gpu=True).keys
[('h1', 3)]
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.engine.checks import GPU
from pipeline.engine.entities import Entities
from pipeline.engine.frame import NCCL_KEYS, NcclFrame
from pipeline.models.detectors._util import nan_to_num
from pipeline.models.registry import DCGM


@dataclass
class Findings:
    """One NCCL model's verdict on the tick starting at ``tick``; rows are entities."""

    model: str
    tick: float
    ent: np.ndarray  # entity ids in the engine that scored (-1 once located in another)
    score: np.ndarray
    flagged: np.ndarray
    obs_ts: np.ndarray
    evidence: dict[int, dict[str, Any]]  # row -> evidence, for flagged rows
    warm: bool
    keys: list[Any] = field(default_factory=list)  # per row: (host, gpu) or host, once named
    lane: int = -1  # the lane scored (``lane_of``); -1: findings merged over lanes

    def named(self, hosts: Sequence[str], gpus: Sequence[tuple[str, int]], level_gpu: bool) -> "Findings":
        """The same findings with each entity's name (``keys``), for another engine."""
        ids = self.ent.tolist()
        keys = [gpus[i] for i in ids] if level_gpu else [hosts[i] for i in ids]
        return replace(self, keys=keys)

    def located(self, gpu_id: dict[tuple[str, int], int], host_id: dict[str, int], level_gpu: bool) -> "Findings":
        """The rows whose entity this engine knows, with its ids (a GPU it has not seen yet has
        no rows here to carry a finding)."""
        table: dict[Any, int] = gpu_id if level_gpu else host_id
        ids = np.array([table.get(k, -1) for k in self.keys], dtype=np.int64)
        keep = np.flatnonzero(ids >= 0)
        return replace(self.take(keep.tolist()), ent=ids[keep])

    def hosts(self, level_gpu: bool) -> list[str]:
        """Each row's host (named findings)."""
        return [k[0] for k in self.keys] if level_gpu else list(self.keys)

    def take(self, rows: Sequence[int]) -> "Findings":
        """The given rows (named findings), e.g. those of one shard's hosts."""
        r = list(rows)
        ev = {j: self.evidence[i] for j, i in enumerate(r) if i in self.evidence}
        idx = np.array(r, dtype=np.int64)
        keys = [self.keys[i] for i in r] if self.keys else []
        return replace(
            self,
            ent=self.ent[idx],
            score=self.score[idx],
            flagged=self.flagged[idx],
            obs_ts=self.obs_ts[idx],
            evidence=ev,
            keys=keys,
        )


# Lanes of NCCL records: communicator sizes hashed into this many, so that a stream of invented
# sizes keeps at most this many detector states and deciders per model.
LANES = 64


@functools.lru_cache(maxsize=4096)  # a fleet has a handful of sizes; every NCCL record asks
def lane_of(nranks: int) -> int:
    """The lane of a communicator of ``nranks`` ranks: the same in every process (crc32).

    >>> lane_of(8), lane_of(64), lane_of(8) == lane_of(8)
    (19, 63, True)
    """
    return zlib.crc32(b"%d" % nranks) % LANES


def lanes(nranks: np.ndarray) -> np.ndarray:
    """``lane_of`` of every row (each distinct size hashed once: ``lane_of`` remembers)."""
    if not len(nranks):
        return np.zeros(0, dtype=np.int64)
    return np.array(list(map(lane_of, nranks.tolist())), dtype=np.int64)


def merge(found: Sequence[Findings]) -> Findings:
    """One model's findings of one tick from several lanes as one: warm when a lane is (and then
    only the warm lanes speak: a lane still learning says nothing beside one that knows); per
    entity the row of the lane that flagged it, else its worst score (ties: the lower lane).
    The result depends only on the set of findings, not on their order: wherever the lanes were
    scored, the entity's finding is the same.

    >>> a = Findings("m", 0.0, np.array([0, 1]), np.array([2.0, 9.0]), np.array([False, True]), np.array([0.1, 0.1]), {1: {"score": 9.0}}, True, lane=3)
    >>> b = Findings("m", 0.0, np.array([0]), np.array([5.0]), np.array([False]), np.array([0.2]), {}, True, lane=7)
    >>> m = merge([b, a])
    >>> m.ent.tolist(), m.score.tolist(), m.flagged.tolist(), m.evidence, m.lane
    ([0, 1], [5.0, 9.0], [False, True], {1: {'score': 9.0}}, -1)
    """
    if len(found) == 1:
        return found[0]
    warm = any(f.warm for f in found)
    use = sorted((f for f in found if f.warm or not warm), key=lambda f: f.lane)
    ent = np.concatenate([f.ent for f in use])
    score = np.concatenate([f.score for f in use])
    flagged = np.concatenate([f.flagged for f in use])
    sizes = [len(f.ent) for f in use]
    src = np.repeat(np.arange(len(use)), sizes)
    # Last of each entity's run: flagged first, then the worst score, then the lowest lane.
    order = np.lexsort((-src, score, flagged, ent))
    e = ent[order]
    last = np.ones(len(order), dtype=bool)
    np.not_equal(e[1:], e[:-1], out=last[:-1])
    pick = order[last]
    evidence: dict[int, dict[str, Any]] = {}
    keyed = all(len(f.keys) == len(f.ent) for f in use)
    if keyed or any(f.evidence for f in use):  # each picked row's own (lane, row)
        row = np.arange(len(ent)) - np.repeat(np.cumsum([0] + sizes[:-1]), sizes)
        at = list(zip(src[pick].tolist(), row[pick].tolist()))
        for j, (i, r) in enumerate(at):
            ev = use[i].evidence.get(r)
            if ev is not None:
                evidence[j] = ev
    return Findings(
        found[0].model,
        found[0].tick,
        ent[pick],
        score[pick],
        flagged[pick],
        np.concatenate([f.obs_ts for f in use])[pick],
        evidence,
        warm,
        [use[i].keys[r] for i, r in at] if keyed else [],
    )


# What one findings may hold where it crosses processes (``Findings.from_wire``).
MAX_ROWS = 1 << 16
MAX_NAME = 256
MAX_EVIDENCE_ITEMS = 32


class FindingsError(ValueError):
    """Findings from another process that are not what a scorer makes: refused, never applied."""


def to_wire(f: Findings) -> dict[str, Any]:
    """Named findings as a map of numbers, strings and arrays (the model state's rules), for
    the fleet topic; ``from_wire`` reads it back."""
    return {
        "model": f.model,
        "tick": f.tick,
        "keys": [list(k) if isinstance(k, tuple) else k for k in f.keys],
        "score": np.asarray(f.score, dtype=np.float64),
        "flagged": np.asarray(f.flagged, dtype=bool),
        "obs_ts": np.asarray(f.obs_ts, dtype=np.float64),
        "evidence": {str(j): ev for j, ev in f.evidence.items()},
        "warm": bool(f.warm),
        "lane": int(f.lane),
    }


def from_wire(d: Any, level_gpu: Mapping[str, bool]) -> Findings:
    """The named findings ``to_wire`` made, checked field by field (``FindingsError``):
    ``level_gpu`` names the NCCL models these findings may be of, and whether each judges GPUs
    (keys ``[host, gpu]``) or hosts (keys ``host``).

    >>> f = Findings("m", 10.0, np.array([0]), np.array([4.0]), np.array([True]), np.array([10.2]), {0: {"score": 4.0}}, True)
    >>> back = from_wire(to_wire(f.named(["h1"], [("h1", 3)], level_gpu=True)), {"m": True})
    >>> back.keys, back.evidence, back.ent.tolist()
    ([('h1', 3)], {0: {'score': 4.0}}, [-1])
    """
    # Without a lane: a sender from before lanes, whose findings were merged over every size.
    if not isinstance(d, dict) or set(d) - {"lane"} != {
        "model",
        "tick",
        "keys",
        "score",
        "flagged",
        "obs_ts",
        "evidence",
        "warm",
    }:
        raise FindingsError(
            "findings: a map of model, tick, keys, score, flagged, obs_ts, evidence, warm, lane expected"
        )
    lane = d.get("lane", -1)
    if type(lane) is not int or not -1 <= lane < LANES:
        raise FindingsError(f"findings: lane is not an integer in [-1, {LANES})")
    model = d["model"]
    if not isinstance(model, str) or model not in level_gpu:
        raise FindingsError(f"findings of model {str(model)[:64]!r}, not an NCCL model of this service")
    gpu = level_gpu[model]
    tick = d["tick"]
    if type(tick) is not float or not math.isfinite(tick):
        raise FindingsError("findings: tick is not a finite number")
    keys = d["keys"]
    if not isinstance(keys, list) or len(keys) > MAX_ROWS:
        raise FindingsError(f"findings: keys is not a list of at most {MAX_ROWS}")
    n = len(keys)
    named: list[Any] = []
    for k in keys:
        if gpu:
            if not (isinstance(k, list) and len(k) == 2 and _name(k[0]) and type(k[1]) is int and 0 <= k[1] < 4096):
                raise FindingsError("findings: a GPU's key is [host, index]")
            named.append((k[0], k[1]))
        else:
            if not _name(k):
                raise FindingsError("findings: a host's key is its name")
            named.append(k)
    cols = []
    for name, kind in (("score", "f"), ("flagged", "b"), ("obs_ts", "f")):
        a = d[name]
        if not isinstance(a, np.ndarray) or a.dtype.kind != kind or a.shape != (n,):
            raise FindingsError(f"findings: {name} is not {n} values of kind {kind!r}")
        cols.append(a)
    ev = d["evidence"]
    if not isinstance(ev, dict) or len(ev) > n:
        raise FindingsError("findings: evidence is not a map by row")
    evidence: dict[int, dict[str, Any]] = {}
    for j, e in ev.items():
        if not (isinstance(j, str) and j.isdigit() and int(j) < n) or not _evidence(e):
            raise FindingsError("findings: evidence is row -> a map of names to numbers and names")
        evidence[int(j)] = e
    if type(d["warm"]) is not bool:
        raise FindingsError("findings: warm is not a boolean")
    ent = np.full(n, -1, dtype=np.int64)
    return Findings(model, tick, ent, cols[0], cols[1], cols[2], evidence, d["warm"], named, lane)


def _name(x: Any) -> bool:
    return isinstance(x, str) and 0 < len(x) <= MAX_NAME


def _evidence(e: Any, depth: int = 0) -> bool:
    """Whether ``e`` is an alert's evidence as ``_score`` makes it: names to numbers, names,
    None, or (once) such a map."""
    if not isinstance(e, dict) or len(e) > MAX_EVIDENCE_ITEMS:
        return False
    for k, v in e.items():
        if not isinstance(k, str) or len(k) > MAX_NAME:
            return False
        if isinstance(v, dict):
            if depth or not _evidence(v, 1):
                return False
        elif not (v is None or isinstance(v, (int, float)) or (isinstance(v, str) and len(v) <= MAX_NAME)):
            return False
    return True


def rounded(x: Any) -> Any:
    """A number for an alert's evidence: 4 decimals, None when not a finite number.

    >>> rounded(1.234567), rounded(float("nan")), rounded("x")
    (1.2346, None, None)
    """
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return round(f, 4) if math.isfinite(f) else None


class NcclScoring:
    """The NCCL models' side of a model set: the NCCL records released, scored a tick at a time
    (so what a tick finds does not depend on which ticks had DCGM rows) into ``Findings`` that
    land on each model's per-entity arrays (``cur``, ``flag``, ``obs_ts``, ``ent_ev``,
    ``nccl_warm``), which the DCGM rows read. Here (the default); here and handed on by name to
    shards elsewhere (``out``: a scorer); or not here at all, the findings taken from ``inbox``
    (``remote``: a shard by host)."""

    def __init__(self, tick: float = 1.0) -> None:
        self.tick = tick
        self.frames: list[NcclFrame] = []  # released, not yet scored
        self.out: list[Findings] | None = None
        self.inbox: list[Findings] = []
        self.remote = False

    def queue(self, frame: NcclFrame) -> None:
        """NCCL records released with a batch; each is scored with the tick it belongs to."""
        if len(frame):
            self.frames.append(frame)

    def run(self, upto: float, entities: Entities, models: Mapping[str, Any]) -> None:
        """Every tick before ``upto``: score it (or take the findings handed in) and apply."""
        if self.remote:
            self._take_findings(upto, entities, models)
            return
        fr = self._take(upto)
        if fr is None:
            return
        tick = np.floor(fr.ts / self.tick + 1e-9)
        if tick[0] == tick[-1] and (tick == tick[0]).all():
            parts: list[tuple[float, NcclFrame]] = [(float(tick[0]) * self.tick, fr)]
        else:
            u, inv = np.unique(tick, return_inverse=True)
            parts = [(float(t) * self.tick, fr.take(np.flatnonzero(inv == i))) for i, t in enumerate(u.tolist())]
        n = max(entities.n_gpus, entities.n_hosts)
        for t0, sub in parts:
            by_lane = _by_lane(sub)
            for m in models.values():
                if m.info.source == DCGM:
                    continue
                found = [_score(m, lane, part, t0, n) for lane, part in by_lane]
                apply_findings(m, merge(found))
                if self.out is not None:
                    level_gpu = m.info.level == GPU
                    self.out.extend(f.named(entities.hosts, entities.gpus, level_gpu) for f in found)

    def _take(self, upto: float) -> NcclFrame | None:
        """The queued NCCL records before ``upto`` (the rest stay queued)."""
        if not self.frames:
            return None
        frame = NcclFrame.concat(self.frames)
        ts = frame.ts
        if len(ts) > 1 and (ts[1:] >= ts[:-1]).all():
            # In time order (as a recording or a fleet sampling in step sends them): this tick's
            # records are a prefix, cut without the two gathers (and the communicator list
            # rebuilt from what is left) that each of a batch's ~15 ticks paid otherwise.
            k = int(np.searchsorted(ts, upto, side="left"))
            if k == 0:
                return None
            self.frames = [_nccl_rows(frame, slice(k, None))] if k < len(ts) else []
            return _nccl_rows(frame, slice(0, k))
        now = ts < upto
        if not now.any():
            return None
        rest = np.flatnonzero(~now)
        self.frames = [frame.take(rest)] if len(rest) else []
        return frame.take(np.flatnonzero(now))

    def _take_findings(self, upto: float, entities: Entities, models: Mapping[str, Any]) -> None:
        """The findings handed in for the ticks before ``upto``, in tick order, onto this
        shard's GPUs and hosts."""
        due = [f for f in self.inbox if f.tick < upto]
        if not due:
            return
        self.inbox = [f for f in self.inbox if f.tick >= upto]
        # A model's findings of one tick, from every lane, in tick order (stable: a tick's
        # models in the order they came).
        ticks: dict[tuple[float, str], list[Findings]] = {}
        for f in sorted(due, key=lambda f: f.tick):
            ticks.setdefault((f.tick, f.model), []).append(f)
        for (_, name), found in ticks.items():
            m = models.get(name)
            if m is None or m.info.source == DCGM:
                continue
            level_gpu = m.info.level == GPU
            apply_findings(m, merge([f.located(entities.gpu_id, entities.host_id, level_gpu) for f in found]))


def _by_lane(fr: NcclFrame) -> list[tuple[int, NcclFrame]]:
    """A tick's records by lane (``lane_of``), in lane order."""
    lane = lanes(fr.nranks)
    first = int(lane[0]) if len(lane) else 0
    if (lane == first).all():
        return [(first, fr)]
    order = lane.argsort(kind="stable")  # by lane, each lane's rows in their order
    sl = lane[order]
    cut = [0, *(np.flatnonzero(sl[1:] != sl[:-1]) + 1).tolist(), len(sl)]
    return [(int(sl[a]), fr.take(order[a:b])) for a, b in zip(cut[:-1], cut[1:])]


def worst_rows(ent: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Each entity's row of highest ``score`` (of equal ones the last), by entity. With one row
    per entity, in order (a lane's GPUs, as their ranks report), each row is its own.

    >>> worst_rows(np.array([4, 2, 4]), np.array([1.0, 0.5, 3.0])).tolist()
    [1, 2]
    """
    if (ent[1:] > ent[:-1]).all():
        return np.arange(len(ent))
    order = np.lexsort((score, ent))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ent[order][1:] != ent[order][:-1]
    return order[last]


def _score(m: Any, lane: int, fr: NcclFrame, t0: float, n_ent: int) -> Findings:
    """One tick of one lane's NCCL records through one model (the lane's detector and decider):
    the worst record per entity, decided, learnt from (but not the flagged entities' records,
    once warm)."""
    det, decider = m.lane(lane)
    scores = nan_to_num(det.score_frame(fr), nan=0.0)
    ent = fr.gpu if m.info.level == GPU else fr.host
    m.ensure(max(n_ent, int(ent.max()) + 1 if len(ent) else 0))
    ok = ent >= 0
    if ok.all():  # every record names its entity (the usual tick)
        e, s, rows = ent, scores, None
    else:
        e, s, rows = ent[ok], scores[ok], np.flatnonzero(ok)
    pick = worst_rows(e, s)  # worst record per entity in this tick
    src = pick if rows is None else rows[pick]  # the frame's row of each entity's worst
    ue, us = e[pick], s[pick]
    flagged = decider.decide(ue, us, len(m.cur))
    warm = det.warm_count() >= m.spec.warmup
    evidence: dict[int, dict[str, Any]] = {}
    for j in np.flatnonzero(flagged).tolist():
        r = int(src[j])
        evidence[j] = {
            "score": rounded(us[j]),
            "threshold": rounded(decider.threshold()),
            "expected": rounded(det.last["expected"][r]),
            "observed": rounded(det.last["observed"][r]),
            "comm": fr.comm[r],
            "rank": int(fr.rank[r]),
            "drivers": {k: rounded(v[r]) for k, v in det.last["drivers"].items()},
        }
    obs_ts = fr.ts[src]
    bad = np.zeros(len(fr), dtype=bool)
    if warm:
        if flagged.any():  # else no record is a flagged entity's
            hit = np.zeros(len(m.cur), dtype=bool)  # np.isin(e, ue[flagged]) by a lookup
            hit[ue[flagged]] = True
            bad[slice(None) if rows is None else rows] = hit[e]
        decider.observe(us[~flagged])
    det.learn_frame(fr, scores, ~bad)
    warm_after = det.warm_count() >= m.spec.warmup
    return Findings(m.spec.name, t0, ue, us, flagged, obs_ts, evidence, warm_after, lane=lane)


def apply_findings(m: Any, f: Findings) -> None:
    """A tick's findings onto the model's per-entity arrays, which the DCGM rows read. The model
    is warm once a lane was; after that a lane still in its warm-up says nothing (its findings
    alone in a tick, as a new communicator size's are, leave the arrays as they were)."""
    if not f.warm and m.nccl_warm:
        return
    if len(f.ent):
        m.ensure(int(f.ent.max()) + 1)
        m.cur[f.ent] = f.score
        m.flag[f.ent] = f.flagged
        m.obs_ts[f.ent] = f.obs_ts
        for j, ev in f.evidence.items():
            m.ent_ev[int(f.ent[j])] = ev
    m.nccl_warm = f.warm


def _nccl_rows(frame: NcclFrame, rows: slice) -> NcclFrame:
    """``frame.take`` of a run of rows, as copies (as ``take`` makes them): the rows of a queued
    frame may still be in a snapshot's queue when the detectors keep this tick's columns."""
    cols = {k: getattr(frame, k)[rows].copy() for k in NCCL_KEYS if k != "comm"}
    return NcclFrame(comm=frame.comm[rows], **cols)
