"""Deciding whether a score is an anomaly, separately from scoring it.

Both deciders keep one hysteresis bit per entity: a score at or above ``on`` raises it, and it
stays up until the score falls below ``off`` (< ``on``), so a score hovering around the
threshold does not flap. Points the decider flags are not learnt from (the model set masks
them out), so a lasting fault never becomes the new normal.

- ``ThresholdDecider(on, off)``: fixed thresholds, for scores with a meaning (z-scores,
  -log10 p-values).
- ``QuantileDecider(q, margin, off_ratio, floor)``: the threshold follows a running quantile
  of the scores seen (a decayed histogram over log-spaced bins, cheap and vectorised):
  ``on = max(floor, margin * quantile_q)``. For scores without a natural scale (HalfSpaceTrees).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.models.cohorts import PartError, check_int_array
from pipeline.models.detectors._util import repeats
from pipeline.numeric import grow


class ThresholdDecider:
    def __init__(self, on: float, off: float | None = None) -> None:
        off = on * 0.6 if off is None else off
        if not off < on:
            raise ConfigError("decider.clear", f"must be below decider.threshold ({on}), got {off}")
        self.on, self.off = float(on), float(off)
        self.up = np.zeros(0, dtype=bool)

    def threshold(self) -> float:
        return self.on

    def decide(self, ent: np.ndarray, scores: np.ndarray, n_ent: int) -> np.ndarray:
        """Per row: flagged? Rows of one entity are applied in order (the last one sets the bit)."""
        if len(self.up) < n_ent:
            self.up = grow(self.up, n_ent, False)
        rep = repeats(ent)
        if rep is not None:  # an entity's rows one after another: each sees the bit the one before set
            flagged = np.zeros(len(ent), dtype=bool)
            for r in rep[1]:
                flagged[r] = self.decide(ent[r], scores[r], n_ent)
            return flagged
        was = self.up[ent]
        flagged = np.where(was, scores >= self.off, scores >= self.on)
        self.up[ent] = flagged
        return flagged

    #: set by the model set: what ``observe`` learns waits for ``apply_epoch`` (cohorts.py)
    deferred = False

    def observe(self, scores: np.ndarray) -> None:
        """Thresholds are fixed: nothing to learn."""

    def cohort_part(self) -> dict[str, Any]:
        """This shard's part of the epoch that ends: none, thresholds are fixed."""
        return {}

    def apply_epoch(self, parts: Any) -> None:
        """Nothing to fold in: thresholds are fixed."""

    def check_part(self, part: dict[str, Any]) -> None:
        """``PartError`` unless ``part`` is what ``cohort_part`` makes: nothing."""
        if part:
            raise PartError("a fixed threshold's part is empty")

    def to_state(self) -> dict[str, Any]:
        return {"up": self.up}

    def load_state(self, st: dict[str, Any]) -> None:
        self.up = np.array(st["up"], dtype=bool)


class QuantileDecider(ThresholdDecider):
    EDGES = np.concatenate([[0.0], np.logspace(-4, 4, 160)])

    def __init__(
        self,
        q: float = 0.999,
        margin: float = 1.5,
        off_ratio: float = 0.7,
        floor: float = 0.0,
        half_life: float = 200_000.0,
    ) -> None:
        if not 0.5 <= q < 1.0:
            raise ConfigError("decider.q", f"must be within [0.5, 1), got {q}")
        if margin < 1.0:
            raise ConfigError("decider.margin", f"must be >= 1, got {margin}")
        self.q, self.margin, self.off_ratio, self.floor = float(q), float(margin), float(off_ratio), float(floor)
        self.decay = 0.5 ** (1.0 / float(half_life))
        self.hist = np.zeros(len(self.EDGES))
        self.acc = np.zeros(len(self.EDGES), dtype=np.int64)  # this epoch's counts, while deferred
        self.up = np.zeros(0, dtype=bool)
        self.on, self.off = np.inf, np.inf

    def observe(self, scores: np.ndarray) -> None:
        """Fold scores into the running histogram (only those not flagged: see the model set);
        deferred, into the epoch's counts."""
        s = scores[np.isfinite(scores)]
        if not len(s):
            return
        np.add.at(self.acc, np.searchsorted(self.EDGES, s, side="right") - 1, 1)
        if not self.deferred:
            self.apply_epoch([self.cohort_part()])

    def cohort_part(self) -> dict[str, Any]:
        part, self.acc = self.acc, np.zeros_like(self.acc)
        return {"counts": part}

    def check_part(self, part: dict[str, Any]) -> None:
        """``PartError`` unless ``part`` holds a count per histogram bin."""
        if set(part) != {"counts"}:
            raise PartError("a quantile decider's part is {'counts': ...}")
        check_int_array(part["counts"], "decider counts", length=len(self.EDGES))

    def apply_epoch(self, parts: Any) -> None:
        """Every shard's counts of the epoch into the histogram, and the thresholds it sets."""
        counts = np.zeros(len(self.EDGES), dtype=np.int64)
        for p in parts:
            if p:
                counts += np.asarray(p["counts"], dtype=np.int64)
        n = int(counts.sum())
        if not n:
            return
        self.hist *= self.decay**n
        self.hist += counts
        total = self.hist.sum()
        k = int(np.searchsorted(np.cumsum(self.hist), self.q * total))
        qv = self.EDGES[min(k + 1, len(self.EDGES) - 1)]
        self.on = max(self.floor, self.margin * qv)
        self.off = self.on * self.off_ratio

    def to_state(self) -> dict[str, Any]:
        return {"up": self.up, "hist": self.hist, "acc": self.acc, "on": self.on, "off": self.off}

    def load_state(self, st: dict[str, Any]) -> None:
        self.up = np.array(st["up"], dtype=bool)
        self.hist = np.array(st["hist"], dtype=float)
        if "acc" in st:  # a snapshot before cohort epochs has none
            self.acc = np.array(st["acc"], dtype=np.int64)
        self.on, self.off = float(st["on"]), float(st["off"])


def make_decider(spec: dict[str, Any]) -> ThresholdDecider:
    """Build a decider from its config mapping (already validated by ``config``)."""
    kind = spec.get("kind", "threshold")
    args = {k: v for k, v in spec.items() if k != "kind"}
    if kind == "threshold":
        return ThresholdDecider(args["threshold"], args.get("clear"))
    if kind == "quantile":
        if "clear_ratio" in args:
            args["off_ratio"] = args.pop("clear_ratio")
        return QuantileDecider(**args)
    raise ConfigError("decider.kind", f"unknown decider {kind!r} (known: threshold, quantile)")
