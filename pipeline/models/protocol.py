"""The detector protocol (river's) and the batch form the engine drives.

Every detector answers river's ``learn_one(x)`` and ``score_one(x) -> float`` (higher = more
anomalous, always finite) and is ``clone()``-able; its state (``to_state``/``load_state``) is
numbers, strings and numeric arrays only, never an object (docs/models.md#model-state). The
engine does not call them a sample at a time: it hands a whole tick (one row per GPU sample) to ``score_many`` and
``learn_many``, which work on dense per-entity numpy arrays. ``*_one`` are thin adapters over the
same code, so what the conformance suite checks is what the engine runs.

``x`` is a mapping of feature name -> value; ``x["entity"]`` (default 0) says which GPU/host the
sample is about and ``x["ts"]`` its event time (default: one second after the previous one).
A missing or non-finite feature is NaN: detectors skip what they cannot use, never fail.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from pipeline.engine.arrays import numeric
from pipeline.errors import StateError
from pipeline.numeric import grow

Features = dict[str, np.ndarray]


@runtime_checkable
class Detector(Protocol):
    def learn_one(self, x: Mapping[str, Any]) -> None: ...

    def score_one(self, x: Mapping[str, Any]) -> float: ...


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


class BatchDetector:
    """Base of the DCGM-fed detectors: per-entity state in arrays grown on demand.

    Subclasses set ``features`` and implement ``score_many``/``learn_many``/``warm``; they keep
    their last tick's ``expected``/``observed``/``drivers`` arrays (row-aligned with the last
    ``score_many``) for alert evidence.
    """

    features: tuple[str, ...] = ()
    #: names of per-entity arrays (``self.<name>``) that make up the detector's state
    entity_arrays: tuple[str, ...] = ()
    #: names of scalar / small cohort attributes in the state
    cohort_attrs: tuple[str, ...] = ()
    fills: dict[str, float] = {}
    #: what the last ``score_many`` computed for ``learn_many`` (first item: its ``ts`` array)
    _pending: tuple[Any, ...] | None
    #: set by the model set: what the cohort shares changes only through ``apply_epoch``, once
    #: an epoch of every shard's learning is in (``pipeline/models/cohorts.py``); unset (river's
    #: protocol, one detector alone) it changes with every sample learnt
    deferred: bool = False

    def __init__(self, **params: Any) -> None:
        self.params = dict(params)
        self._t = 0.0
        self.last: dict[str, Any] = {}
        for name in self.entity_arrays:
            setattr(self, name, np.full(0, self.fills.get(name, np.nan)))

    # -- the batch interface ------------------------------------------------------------------

    def _ensure(self, n: int) -> None:
        for name in self.entity_arrays:
            arr = getattr(self, name)
            if len(arr) < n:
                setattr(self, name, grow(arr, n, self.fills.get(name, np.nan)))

    def score_many(self, ent: np.ndarray, ts: np.ndarray, F: Features) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def learn_many(self, ent: np.ndarray, ts: np.ndarray, F: Features, mask: np.ndarray) -> None:  # pragma: no cover
        raise NotImplementedError

    def warm(self, ent: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def cohort_part(self) -> dict[str, Any]:
        """This shard's part of the epoch that ends (``cohorts.py``), and a fresh one begun.
        Detectors without cohort state have none."""
        return {}

    def apply_epoch(self, parts: Sequence[dict[str, Any]], n_gpus: int) -> None:
        """Fold one epoch's parts of every shard into the cohort state; ``n_gpus``: the
        cohort's GPUs over all shards."""

    def _take_pending(self, ent: np.ndarray, ts: np.ndarray, F: Features) -> tuple:
        """What ``score_many`` left for this tick (scoring first if it has not run on ``ts``)."""
        pend = getattr(self, "_pending", None)
        if pend is None or pend[0] is not ts:
            self.score_many(ent, ts, F)
            pend = self._pending
            assert pend is not None, f"{type(self).__name__}.score_many left nothing for learn_many"
        self._pending = None
        return pend

    # -- river's protocol -----------------------------------------------------------------------

    def _one(self, x: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, Features]:
        ent = np.array([int(x.get("entity", 0))], dtype=np.int32)
        t = _num(x.get("ts"))
        if math.isnan(t):
            t = self._t + 1.0
        self._t = t
        ts = np.array([t])
        F = {k: np.array([_num(x.get(k))]) for k in self.features}
        return ent, ts, F

    def score_one(self, x: Mapping[str, Any]) -> float:
        ent, ts, F = self._one(x)
        self._t -= 1.0 if "ts" not in x else 0.0  # scoring does not advance the default clock
        s = float(self.score_many(ent, ts, F)[0])
        return s if math.isfinite(s) else 0.0

    def learn_one(self, x: Mapping[str, Any]) -> None:
        ent, ts, F = self._one(x)
        self.learn_many(ent, ts, F, np.ones(1, dtype=bool))

    def clone(self) -> "BatchDetector":
        """A fresh detector with the same parameters (river's ``clone``)."""
        return type(self)(**self.params)

    # -- state ------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "arrays": {n: getattr(self, n) for n in self.entity_arrays},
            "cohort": {n: copy.deepcopy(getattr(self, n)) for n in self.cohort_attrs},
        }

    def load_state(self, st: dict[str, Any]) -> None:
        for n in self.entity_arrays:
            if n in st["arrays"]:
                now = getattr(self, n)
                a = numeric(st["arrays"][n], f"{type(self).__name__}.{n}", ndim=now.ndim)
                if a.shape[1:] != now.shape[1:]:
                    raise StateError(
                        f"snapshot: {type(self).__name__}.{n} has rows of {a.shape[1:]}, expected {now.shape[1:]}"
                    )
                setattr(self, n, a.astype(now.dtype))
        for n in self.cohort_attrs:
            if n in st["cohort"]:
                setattr(self, n, copy.deepcopy(st["cohort"][n]))

    def nbytes_per_entity(self) -> float:
        """Bytes of per-entity state (arrays indexed by entity id) per entity."""
        return float(
            sum(
                getattr(self, n).itemsize * (getattr(self, n).size // max(1, len(getattr(self, n))))
                for n in self.entity_arrays
            )
        )
