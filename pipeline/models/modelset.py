"""What the engine evaluates each tick for the models, like ``RuleSet`` for the rules.

Per tick the engine hands the model set the tick's view (one row per GPU sample) after the
rows were folded into the GPU state. For every model: build its features (catalog fields,
counter increases, host means), score the rows with the cohort's detector, let the decider
flag, learn from the rows it did not flag, and return one condition per row for the model's
alert lifecycle. NCCL records of the tick (queued by the engine) are scored first; their
per-GPU/per-host findings are carried onto the tick's rows.

Heavy state is per cohort (one detector instance per GPU model, or one for the fleet); per
entity there are only arrays. Scores are exposed to rules as ``score(model_name)`` (NaN before
warm-up). No model alerts before its warm-up.
"""

from __future__ import annotations

import math
import operator
import zlib
from pathlib import Path
from typing import Any, Sequence

import msgspec
import numpy as np

from pipeline.engine.arrays import numeric
from pipeline.engine.checks import GPU, CheckMeta
from pipeline.engine.entities import Entities
from pipeline.engine.frame import NCCL_KEYS, NcclFrame
from pipeline.engine.stage import MODEL_SCORES, StageBase
from pipeline.engine.state import View
from pipeline.errors import StateError
from pipeline.models.cohorts import (
    LAG_EPOCHS,
    MAX_PART_COHORTS,
    CohortExchange,
    Epochs,
    NullExchange,
    PartError,
    check_frame,
    epoch_of,
)
from pipeline.models.config import ModelSpec, load_model_specs
from pipeline.models.context import COLUMNS as CONTEXT_COLUMNS
from pipeline.models.context import FleetContext, board_power
from pipeline.models.deciders import make_decider
from pipeline.models.features import Features, feature_columns
from pipeline.models.findings import LANES, NcclScoring, rounded
from pipeline.models.detectors._util import nan_to_num
from pipeline.models.registry import DCGM, REGISTRY, build
from pipeline.models.statecodec import decode_state, encode_state
from pipeline.numeric import grow

# 2: arrays and river objects as msgpack extension types; 3: the fleet context; 4: no pickled
# objects, only numbers (versions 2 and 3 are refused, never unpickled: docs/models.md#model-state);
# 5: cohort state by epochs (cohorts.py; a version 4 snapshot is read, its epochs start afresh);
# 6: NCCL lanes (findings.py; in a version 4 or 5 snapshot the NCCL detectors start afresh).
STATE_VERSION = 6
READS_VERSIONS = (4, 5, 6)
_MODEL = operator.attrgetter("model")
# GPU models one engine keeps a cohort (a forest, priors) for. A fleet has a handful; a stream of
# invented model strings (1,000 of them once made a 106 MB snapshot taking 5.6 s) shares the last.
MAX_COHORTS = 32
OVERFLOW_COHORT = "other"
NCCL_FRESH_S = 15.0  # NCCL findings hold this long on the DCGM rows (3 reporting intervals)


def lane_name(lane: int) -> str:
    """The key of an NCCL lane's detector among a model's ``dets``."""
    return f"lane-{lane}"


class ModelCheck:
    """The engine-facing side of one model: meta for the lifecycle, evidence and summary."""

    def __init__(self, spec: ModelSpec, owner: "ModelSet") -> None:
        level = REGISTRY[spec.detector].level
        self.spec = spec
        self.meta = CheckMeta(
            spec.name,
            spec.fault,
            spec.severity,
            level,
            spec.for_s,
            spec.keep_firing_for_s,
            {"source": "model", "detector": spec.detector, **spec.labels},
        )
        self.fields: tuple[str, ...] = ()
        self._owner = owner

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        return self._owner.evidence(self.spec.name, view, row)

    def summary(self, host: str, gpu: int | None, ev: dict[str, Any]) -> str:
        tmpl = self.spec.summary
        if tmpl:
            try:
                return tmpl.format(host=host, gpu=gpu, **{k: v for k, v in ev.items() if k != "drivers"})
            except (KeyError, ValueError, IndexError, TypeError):
                pass
        where = f"GPU {gpu} on {host}" if gpu is not None else host
        return (
            f"{where}: model {self.spec.name} score {ev.get('score')} (threshold {ev.get('threshold')}); "
            f"expected {ev.get('expected')}, observed {ev.get('observed')}"
        )


class _Model:
    """One configured model: its per-cohort detectors, its decider and this tick's results."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.info = REGISTRY[spec.detector]
        self.proto = build(spec.detector, spec.params)
        self.dets: dict[str, Any] = {}
        self.decider = make_decider(spec.decider)
        self.decider.deferred = True
        self.rows_ev: list[tuple[np.ndarray | None, dict, np.ndarray]] = []
        # NCCL models: per-entity findings carried onto DCGM rows.
        self.cur = np.zeros(0)
        self.flag = np.zeros(0, dtype=bool)
        self.obs_ts = np.full(0, np.nan)
        self.ent_ev: dict[int, dict[str, Any]] = {}
        self.nccl_warm = False  # NCCL models: warm after the last findings applied
        # NCCL models: each lane's decider (findings.lane_of); its detector is ``det(lane_name)``.
        self.lane_deciders: dict[int, Any] = {}

    def det(self, cohort: str) -> Any:
        d = self.dets.get(cohort)
        if d is None:
            d = self.dets[cohort] = self.proto.clone()
            if self.info.source == DCGM:
                d.deferred = True  # its cohort state changes by epochs (cohorts.py)
        return d

    def lane(self, lane: int) -> tuple[Any, Any]:
        """An NCCL model's detector and decider for one lane (``findings.lane_of``), made when
        first scored. Its decider learns at once: a lane is scored in one place only."""
        d = self.lane_deciders.get(lane)
        if d is None:
            d = self.lane_deciders[lane] = make_decider(self.spec.decider)
        return self.det(lane_name(lane)), d

    def ensure(self, n: int) -> None:
        if len(self.cur) < n:
            self.cur, self.flag = grow(self.cur, n, 0.0), grow(self.flag, n, False)
            self.obs_ts = grow(self.obs_ts, n, np.nan)


class ModelSet(StageBase):
    """The models the engine runs (built from specs); evaluated once per tick. The engine's
    "models" stage, before the rules: it publishes each tick's scores for their ``score()``."""

    kind = "models"
    state_key = "models"
    reads_nccl = True  # the NCCL detectors score the records' columns

    def __init__(self, specs: Sequence[ModelSpec], tick: float = 1.0, source: str = "") -> None:
        self.specs = list(specs)
        self.tick = tick
        self.source = source
        self.models = {s.name: _Model(s) for s in self.specs}
        # A GPU's DCGM-model scores read only its own rows and state (``Stage.host_local``):
        # cohort state changes only by epochs, from data seconds old (cohorts.py), so a host's
        # rows of a tick score alike run before the other hosts' or with them. An NCCL model's
        # finding for a GPU comes from its communicator's ranks on other hosts, scored with the
        # whole tick's records: on rows that ran early it is judged once the tick is whole
        # (``deferred``, ``run_deferred``).
        self.host_local = True
        self.deferred = frozenset(n for n, m in self.models.items() if m.info.source != DCGM)
        self.checks = [ModelCheck(s, self) for s in self.specs if s.alert]
        self._by_name = {c.spec.name: c for c in self.checks}
        self._board: tuple[tuple[str, ...], np.ndarray] | None = None  # _board_power's
        self.columns: set[int] = set()
        for m in self.models.values():
            if m.info.source == DCGM:
                self.columns |= feature_columns(m.proto.features)
        self.cohort_names: list[str] = []
        self.cohort_of = np.full(0, -1, dtype=np.int32)  # per GPU: index into cohort_names
        self.scores: dict[str, np.ndarray] = {}
        # Fleet-wide causes (docs/models.md#explain-away) and how many findings each model had
        # explained away by them (rows of ticks where a finding was suppressed).
        self.context = FleetContext()
        self.explained: dict[str, int] = {}
        # Cohort state by epochs (cohorts.py), and per GPU its turn (``Features``' phase).
        self.epochs = Epochs(self._part, self._apply)
        self.phase = np.full(0, -1, dtype=np.int64)
        # The NCCL models' records, scored a tick at a time into findings (findings.py).
        self.nccl = NcclScoring(tick)
        self._context_on = any(s.explained_by for s in self.specs)
        if self._context_on:
            self.columns |= CONTEXT_COLUMNS

    @property
    def names(self) -> set[str]:
        return set(self.models)

    def __len__(self) -> int:
        return len(self.models)

    # -- engine hooks (the stage protocol, pipeline/engine/stage.py) ----------------------------

    def ingest(self, gpu: np.ndarray, records: Sequence[Any]) -> None:
        """Arriving DCGM records: their GPUs' cohorts."""
        self.note_cohorts(gpu, records)

    def released(self, nccl: NcclFrame) -> None:
        """Released NCCL records: queued for the ticks they belong to."""
        self.queue_nccl(nccl)

    def run(self, view: View, entities: Entities, outputs: dict[str, Any]) -> list[tuple[ModelCheck, np.ndarray]]:
        """The stage's tick: ``evaluate``, and the scores published for later stages (the rules)."""
        out = self.evaluate(view, entities)
        outputs[MODEL_SCORES] = self.scores
        return out

    def to_state(self) -> bytes:
        """The engine snapshot's ``models``: ``snapshot()``."""
        return self.snapshot()

    def load_state(self, state: Any) -> None:
        """``restore`` what ``to_state`` wrote; nothing when the snapshot holds none."""
        if state:
            self.restore(state)

    def adopt(self, old: Any) -> set[str]:
        """Take over ``old``'s state for the models whose definition is unchanged (as ``restore``
        does); the names of their checks, which keep their alert state."""
        if not isinstance(old, ModelSet):
            return set()
        self.restore(old.snapshot())
        before = {c.meta.name: (c.meta, c.spec.definition()) for c in old.checks}
        return {c.meta.name for c in self.checks if before.get(c.meta.name) == (c.meta, c.spec.definition())}

    def note_cohorts(self, gpu: np.ndarray, records: Sequence[Any]) -> None:
        """Learn the cohort (GPU model) of GPUs not seen before, from their records."""
        n = int(gpu.max()) + 1 if len(gpu) else 0
        if len(self.cohort_of) < n:
            self.cohort_of = grow(self.cohort_of, n, -1)
        unknown = np.flatnonzero(self.cohort_of[gpu] < 0)
        if len(unknown):
            _, first = np.unique(gpu[unknown], return_index=True)  # one record per new GPU
            unknown = unknown[first]
        for i in unknown.tolist():
            name = _MODEL(records[i]) or "unknown"
            if name not in self.cohort_names and len(self.cohort_names) >= MAX_COHORTS - 1:
                name = OVERFLOW_COHORT
            try:
                c = self.cohort_names.index(name)
            except ValueError:
                c = len(self.cohort_names)
                self.cohort_names.append(name)
            self.cohort_of[gpu[i]] = c

    def queue_nccl(self, frame: NcclFrame) -> None:
        """NCCL records released with this batch; each is scored with the tick it belongs to."""
        self.nccl.queue(frame)

    def evaluate(self, view: View, entities: Entities) -> list[tuple[ModelCheck, np.ndarray]]:
        """Score, decide and learn for one tick; returns (check, condition per row)."""
        n = len(view.frame)
        self.scores = {}
        if n == 0:
            return []
        n_gpus = entities.n_gpus
        ent = view.frame.gpu
        ts = view.frame.ts
        cur = epoch_of(view.ts0)
        self.epochs.advance(cur)
        self.epochs.apply_through(cur - LAG_EPOCHS)
        if not view.early:  # the tick's NCCL records come with its last rows
            self.nccl.run(view.ts0 + self.tick, entities, self.models)
        feats = Features(view, self._phases(ent, entities))
        if len(self.cohort_of) < n_gpus:
            self.cohort_of = grow(self.cohort_of, n_gpus, -1)
        coh = self.cohort_of[ent]
        groups = self._cohort_groups(coh)
        if self._context_on:
            self.context.update(view, n_gpus, self._board_power()[coh], view.ts0 + self.tick)
        out: list[tuple[ModelCheck, np.ndarray]] = []
        by_name = self._by_name
        for name, m in self.models.items():
            if m.info.source == DCGM:
                score = np.zeros(n)
                warm = np.zeros(n, dtype=bool)
                m.rows_ev = []
                scored = []
                fleet = m.spec.cohort == "fleet"
                for cname, rows in [("fleet", None)] if fleet else groups:
                    det = m.det(cname)
                    e = ent if rows is None else ent[rows]
                    t = ts if rows is None else ts[rows]
                    F = feats.subset(det.features + ("phase",), rows)
                    s = nan_to_num(det.score_many(e, t, F), nan=0.0, posinf=1e6, neginf=0.0)
                    w = det.warm(e)
                    if rows is None:
                        score, warm = s, w
                    else:
                        score[rows], warm[rows] = s, w
                    m.rows_ev.append((rows, det.last, s))
                    scored.append((det, rows, e, t, F))
                flagged = m.decider.decide(ent, score, n_gpus)
                cond = flagged & warm
                m.decider.observe(score[warm & ~flagged])
                # Learning from the very rows scored: a detector takes what scoring left for
                # them (``_take_pending`` knows them by their ``ts``), where rows picked again
                # (a cohort's ``ts[rows]``, a new array) would have them scored a second time.
                for det, rows, e, t, F in scored:
                    det.learn_many(e, t, F, ~cond if rows is None else ~cond[rows])
                self.scores[name] = np.where(warm, score, np.nan)
            elif view.early:
                continue  # judged once the tick is whole (run_deferred)
            else:
                cond, self.scores[name] = self._nccl_condition(m, view, entities)
            if m.spec.explained_by and m.info.level == GPU and cond.any():
                cond = self._explain_away(m.spec, cond, ent)
            chk = by_name.get(name)
            if chk is not None:
                out.append((chk, cond))
        return out

    def run_deferred(self, view: View, entities: Entities) -> list[tuple[ModelCheck, np.ndarray]]:
        """The NCCL models' conditions on rows that ran early (``View.early``), now that every
        host's rows of their tick have run: the tick's findings applied first, as the tick's
        last rows apply them (``Stage.run_deferred``)."""
        self.nccl.run(view.ts0 + self.tick, entities, self.models)
        out: list[tuple[ModelCheck, np.ndarray]] = []
        for name in self.models:
            chk = self._by_name.get(name)
            if name not in self.deferred or chk is None:
                continue
            m = self.models[name]
            cond, _ = self._nccl_condition(m, view, entities)
            if m.spec.explained_by and m.info.level == GPU and cond.any():
                cond = self._explain_away(m.spec, cond, view.frame.gpu)
            out.append((chk, cond))
        return out

    @staticmethod
    def _nccl_condition(m: _Model, view: View, entities: Entities) -> tuple[np.ndarray, np.ndarray]:
        """An NCCL model's finding carried onto the rows' GPUs (or hosts), while fresh and warm,
        and its score per row (what the rules' ``score()`` reads)."""
        idx = view.frame.gpu if m.info.level == GPU else view.frame.host
        m.ensure(max(entities.n_gpus, entities.n_hosts))
        fresh = (view.frame.ts - m.obs_ts[idx]) <= NCCL_FRESH_S
        warm_all = m.nccl_warm
        score = np.where(fresh & warm_all, m.cur[idx], np.nan if not warm_all else 0.0)
        return m.flag[idx] & fresh & warm_all, score

    # -- cohort state by epochs (cohorts.py) -------------------------------------------------------

    def as_shard(self, exchange: CohortExchange, name: str) -> None:
        """Run as shard ``name`` of a fleet split by host: cohort parts through ``exchange``, the
        NCCL findings handed in (``nccl.inbox``) by a scorer elsewhere."""
        self.epochs.exchange, self.epochs.shard, self.nccl.remote = exchange, name, True

    def as_scorer(self) -> None:
        """Run as the NCCL scorer of a fleet split by host: its findings go out (``nccl.out``);
        it runs no DCGM rows, so its own cohort parts are dropped, not kept."""
        self.nccl.out = []
        self.epochs.exchange = NullExchange()

    def nccl_levels(self) -> dict[str, bool]:
        """The NCCL models by name, each with whether it judges GPUs (else hosts): how their
        findings name entities (``Findings.hosts``, ``findings.from_wire``)."""
        return {n: m.info.level == GPU for n, m in self.models.items() if m.info.source != DCGM}

    def check_part(self, part: Any) -> None:
        """``PartError`` unless ``part`` is one another shard of these models makes (``_part``):
        integer epochs, GPUs per cohort, each model's decider and detector parts in the shapes
        this build's models make them, the context's counts. Where parts cross processes (the
        fleet topic), this stands between them and ``_apply``.

        >>> ms = load_models()
        >>> ms.check_part({"epoch": 3, "until": 4})
        >>> ms.check_part({"epoch": 3, "until": 4, "models": {"nope": {}}})
        Traceback (most recent call last):
        ...
        pipeline.models.cohorts.PartError: a part for model 'nope', which these models do not have
        """
        check_frame(part)
        extra = set(part) - {"epoch", "until", "n_gpus", "models", "context"}
        if extra:
            raise PartError(f"a part with unknown keys {sorted(extra)[:4]}")
        n_gpus = part.get("n_gpus", {})
        if not isinstance(n_gpus, dict) or len(n_gpus) > MAX_PART_COHORTS + 1:
            raise PartError("n_gpus: a map of at most 257 cohorts")
        for c, v in n_gpus.items():
            if not isinstance(c, str) or len(c) > 256 or type(v) is not int or not 0 <= v < 2**31:
                raise PartError("n_gpus: cohort names and counts of GPUs expected")
        models = part.get("models", {})
        if not isinstance(models, dict):
            raise PartError("models: a map expected")
        for name, parts in models.items():
            m = self.models.get(name) if isinstance(name, str) else None
            if m is None:
                raise PartError(f"a part for model {str(name)[:64]!r}, which these models do not have")
            if not isinstance(parts, dict) or len(parts) > MAX_PART_COHORTS + 1:
                raise PartError(f"{name}: a map of at most 257 cohort parts expected")
            for c, dp in parts.items():
                if not isinstance(c, str) or len(c) > 256 or not isinstance(dp, dict):
                    raise PartError(f"{name}: cohort names and maps expected")
                if c == "_decider":
                    m.decider.check_part(dp)
                elif m.info.source != DCGM:
                    raise PartError(f"{name}: an NCCL model has no cohort parts")
                else:
                    m.proto.check_part(dp)
        if "context" in part:
            if not self._context_on or not isinstance(part["context"], dict):
                raise PartError("a context part, which these models do not keep")
            self.context.check_part(part["context"], part["epoch"])

    def advanced(self, upto: float, entities: Entities) -> None:
        """The engine released every row before ``upto``: the epochs before it are complete, and
        a scorer for shards elsewhere scores the NCCL records before it."""
        if self.nccl.out is not None:
            self.nccl.run(upto, entities, self.models)
        if math.isfinite(upto):
            self.epochs.advance(epoch_of(upto))

    def _part(self, epoch: int, until: int) -> dict[str, Any]:
        """This shard's part of ``epoch`` (``Epochs``): its GPUs per cohort, each model's and
        decider's part, the fleet context's counts."""
        counts = np.bincount(self.cohort_of[self.cohort_of >= 0], minlength=len(self.cohort_names))
        n_gpus = {name: int(c) for name, c in zip(self.cohort_names, counts.tolist())}
        n_gpus["fleet"] = int(counts.sum())
        models: dict[str, Any] = {}
        for name, m in self.models.items():
            parts = {"_decider": m.decider.cohort_part()}
            if m.info.source == DCGM:
                parts.update({c: d.cohort_part() for c, d in m.dets.items()})
            models[name] = parts
        part: dict[str, Any] = {"epoch": epoch, "until": until, "n_gpus": n_gpus, "models": models}
        if self._context_on:
            part["context"] = self.context.cohort_part(epoch)
        return part

    def _apply(self, k: int, parts: list[dict[str, Any]]) -> None:
        """Epoch ``k`` of every shard's ``parts`` into the models (``Epochs``): sums only from
        the parts of epoch ``k`` itself; a part of an earlier epoch that covers ``k`` brings its
        state (rates, counts of GPUs), not its sums again."""
        own = [p for p in parts if int(p["epoch"]) == k]
        n_gpus: dict[str, int] = {}
        for p in parts:
            for c, v in p.get("n_gpus", {}).items():
                n_gpus[c] = n_gpus.get(c, 0) + int(v)
        for name, m in self.models.items():
            m.decider.apply_epoch([p.get("models", {}).get(name, {}).get("_decider", {}) for p in own])
            if m.info.source != DCGM:
                continue
            cohorts = sorted({c for p in parts for c in p.get("models", {}).get(name, {}) if c != "_decider"})
            for c in cohorts:
                det = m.det(c)
                state_parts = [p.get("models", {}).get(name, {}).get(c, {}) for p in parts]
                sum_parts = [p.get("models", {}).get(name, {}).get(c, {}) for p in own]
                det.apply_epoch(_epoch_parts(det, sum_parts, state_parts), n_gpus.get(c, 0))
        if self._context_on:
            self.context.apply_epoch([p.get("context", {}) for p in parts], k)

    def _phases(self, ent: np.ndarray, entities: Entities) -> np.ndarray:
        """Each row's GPU's turn: a hash of its host's name and its index (zlib's crc32, the
        same in every process), computed once per GPU."""
        n = entities.n_gpus
        if len(self.phase) < n:
            old = len(self.phase)
            self.phase = grow(self.phase, n, -1)
            self.phase[old:n] = [zlib.crc32(f"{h}/{i}".encode()) for h, i in entities.gpus[old:n]]
        return self.phase[ent]

    def _board_power(self) -> np.ndarray:
        """Board power per cohort index, NaN last (cohort -1): looked up again only when the
        cohorts change, not every tick."""
        names = tuple(self.cohort_names)
        if self._board is None or self._board[0] != names:
            self._board = (names, np.append(board_power(self.cohort_names), np.nan))
        return self._board[1]

    def _explain_away(self, spec: ModelSpec, cond: np.ndarray, ent: np.ndarray) -> np.ndarray:
        """``cond`` without the rows whose finding a fleet-wide cause in force explains."""
        rows = np.flatnonzero(cond)
        gone = np.zeros(len(rows), dtype=bool)
        for cause in spec.explained_by:
            gone |= self.context.explains(cause, ent[rows])
        if gone.any():
            cond = cond.copy()
            cond[rows[gone]] = False
            self.explained[spec.name] = self.explained.get(spec.name, 0) + int(gone.sum())
        return cond

    def _cohort_groups(self, coh: np.ndarray) -> list[tuple[str, np.ndarray | None]]:
        if len(coh) == 0:
            return []
        c0 = int(coh[0])
        if (coh == c0).all():
            return [(self.cohort_names[c0] if c0 >= 0 else "unknown", None)]
        out: list[tuple[str, np.ndarray | None]] = []
        for c in np.unique(coh).tolist():
            out.append((self.cohort_names[c] if c >= 0 else "unknown", np.flatnonzero(coh == c)))
        return out

    def evidence(self, name: str, view: View, row: int) -> dict[str, Any]:
        ev = self._evidence(name, view, row)
        causes = self.context.in_force()
        if causes and self.models[name].spec.explained_by:
            # Named on the alert: the fleet-wide causes in force that did not explain it.
            ev["fleet_causes_not_explaining"] = causes
        return ev

    def _evidence(self, name: str, view: View, row: int) -> dict[str, Any]:
        m = self.models[name]
        if m.info.source != DCGM:
            e = int(view.frame.gpu[row] if m.info.level == GPU else view.frame.host[row])
            return dict(m.ent_ev.get(e, {"score": rounded(m.cur[e]) if e < len(m.cur) else None}))
        for rows, last, s in m.rows_ev:
            if rows is None:
                j = row
            else:
                hit = np.flatnonzero(rows == row)
                if not len(hit):
                    continue
                j = int(hit[0])
            drivers = {k: rounded(v[j]) for k, v in last.get("drivers", {}).items()}
            return {
                "score": rounded(s[j]),
                "threshold": rounded(m.decider.threshold()),
                "expected": rounded(last.get("expected", [math.nan] * (j + 1))[j]),
                "observed": rounded(last.get("observed", [math.nan] * (j + 1))[j]),
                "drivers": drivers,
            }
        return {}

    # -- state ------------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Model state as bytes: msgpack of numbers, strings and numeric arrays, no objects."""
        data: dict[str, Any] = {
            "version": STATE_VERSION,
            "cohort_names": self.cohort_names,
            "cohort_of": self.cohort_of,
            "nccl": [f.to_state() for f in self.nccl.frames],
            "models": {},
            "context": self.context.to_state(),
            "explained": self.explained,
            "epochs": self.epochs.to_state(),
        }
        for name, m in self.models.items():
            data["models"][name] = {
                "definition": repr(m.spec.definition()),
                "dets": {c: d.to_state() for c, d in m.dets.items()},
                "decider": m.decider.to_state(),
                "lanes": {str(k): d.to_state() for k, d in m.lane_deciders.items()},
                "cur": m.cur,
                "flag": m.flag,
                "obs_ts": m.obs_ts,
                "ent_ev": {str(k): v for k, v in m.ent_ev.items()},
                "nccl_warm": m.nccl_warm,
            }
        return encode_state(data)

    def restore(self, blob: bytes) -> None:
        """Continue where ``snapshot`` stopped; models whose definition changed start fresh."""
        try:
            data = decode_state(blob)
            if not isinstance(data, dict) or data.get("version") not in READS_VERSIONS:
                v = data.get("version") if isinstance(data, dict) else None
                raise StateError(f"model state version {v} (this build reads {READS_VERSIONS} only)")
            self.cohort_names = [str(c) for c in data["cohort_names"]]
            self.cohort_of = np.asarray(numeric(data["cohort_of"], "cohort_of"), dtype=np.int32).copy()
            if len(self.cohort_of) and not -1 <= int(self.cohort_of.min()) <= int(self.cohort_of.max()) < len(
                self.cohort_names
            ):
                raise StateError("model state: a GPU in a cohort that is not named")
            self.nccl.frames = [_nccl_frame(f) for f in data["nccl"]]
            self.context.load_state(data["context"])
            self.explained = {str(k): int(v) for k, v in data["explained"].items()}
            self.epochs.load_state(data.get("epochs"))
            for name, st in data["models"].items():
                m = self.models.get(name)
                if m is None or st["definition"] != repr(m.spec.definition()):
                    continue
                m.dets, m.lane_deciders = {}, {}
                lane_names = {lane_name(k) for k in range(LANES)}
                for c, ds in st["dets"].items():
                    if m.info.source != DCGM and c not in lane_names:
                        continue  # a version 5 snapshot's one NCCL detector: the lanes start afresh
                    m.det(c).load_state(ds)
                m.decider.load_state(st["decider"])
                for k, ds in st.get("lanes", {}).items():
                    if not (k.isdigit() and int(k) < LANES):
                        raise StateError(f"model state: {name} has a lane {k[:16]!r}")
                    m.lane(int(k))[1].load_state(ds)
                cur, flag, obs_ts = (numeric(st[k], f"{name}.{k}") for k in ("cur", "flag", "obs_ts"))
                if not len(cur) == len(flag) == len(obs_ts):
                    raise StateError(f"model state: {name}'s per-entity arrays differ in length")
                m.cur, m.flag, m.obs_ts = cur.astype(float), flag.astype(bool), obs_ts.astype(float)
                m.ent_ev = {int(k): v for k, v in st["ent_ev"].items()}
                m.nccl_warm = bool(st.get("nccl_warm", False))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise StateError(f"cannot restore model state: {e}") from e
        except StateError as e:
            raise StateError(f"cannot restore model state: {e.message}") from e

    def nbytes_per_gpu(self, n_gpus: int) -> dict[str, float]:
        """Per-GPU state bytes of each model (entity arrays) plus its shared (cohort) bytes."""
        out: dict[str, float] = {}
        for name, m in self.models.items():
            per = sum(d.nbytes_per_entity() for d in m.dets.values())
            per += sum(d.up.itemsize for d in m.lane_deciders.values())
            per += m.decider.up.itemsize + (
                m.cur.itemsize + m.flag.itemsize + m.obs_ts.itemsize if m.info.source != DCGM else 0
            )
            out[name] = per
        out["cohort_of"] = float(self.cohort_of.itemsize)
        return out

    def shared_bytes(self) -> int:
        """Bytes of per-cohort state as the snapshot holds it (msgpack), e.g. a cohort's trees."""
        total = 0
        for m in self.models.values():
            for d in m.dets.values():
                st = d.to_state()
                total += len(encode_state({k: v for k, v in st.items() if k != "arrays"}))
        return total


def _epoch_parts(det: Any, sums: list[dict[str, Any]], states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a detector folds in for an epoch: the sums of the shards that learnt in it and the
    state (multisets) of every shard. A detector's part holds one kind or the other."""
    return states if getattr(det, "epoch_state", False) else sums


def _nccl_frame(d: dict[str, Any]) -> NcclFrame:
    """A queued NCCL frame of a snapshot: numeric columns and string communicators, one length."""
    cols = {k: numeric(d[k], f"nccl.{k}") for k in NCCL_KEYS if k != "comm"}
    if not isinstance(d["comm"], list) or not all(isinstance(c, str) for c in d["comm"]):
        raise StateError("model state: queued NCCL communicators are not strings")
    if len({len(v) for v in cols.values()} | {len(d["comm"])}) != 1:
        raise StateError("model state: queued NCCL columns differ in length")
    return NcclFrame.from_state(d)


def load_models(path: str | Path | None = None, tick: float = 1.0) -> ModelSet:
    """The model set of a ``models.yaml`` (default: the shipped one, ``pipeline/resources.py``)."""
    from pipeline.resources import default_models

    p = Path(path) if path is not None else default_models()
    return ModelSet(load_model_specs(p), tick=tick, source=str(p))
