"""Helpers of the model tests: simulator streams through an engine with one model, per-row scores kept."""

from __future__ import annotations

import msgspec
import numpy as np

from pipeline.engine import Engine
from pipeline.models.config import spec_from_mapping
from pipeline.models.modelset import ModelSet
from pipeline.schema import DcgmRecord, NcclRecord
from producers.sim import Simulator

DEC = msgspec.json.Decoder(list[DcgmRecord | NcclRecord])


ENC = msgspec.json.Encoder()


# Which labelled fault each detector is meant to rank high, and a small configuration for it.
TARGETS = {
    "thermal_residual": ("thermal_throttling", {"warmup": 60}),
    "counter_rate": ("hbm_ecc_burst", {"features": ["ecc_sbe_volatile"], "warmup": 60}),
    "cohort_hst": ("nccl_straggler", {"warmup": 200, "params": {"period": 1, "window_size": 100}}),
    "nccl_straggler": ("nccl_straggler", {"warmup": 20}),
    "nccl_busbw": ("nccl_straggler", {"warmup": 20}),
}


# Fleet size per detector where it needs peers (communicators of the same kind on >= 3 hosts).
HOSTS = {"nccl_busbw": 4}


def one_model(detector: str, **extra) -> ModelSet:
    d = {"name": "m", "detector": detector, "fault": "gpu_test_anomaly",
         "decider": {"kind": "threshold", "threshold": 6.0}, **extra}
    return ModelSet([spec_from_mapping(d, "models[0]")])


def records(sim: Simulator) -> list[list]:
    return [DEC.decode(ENC.encode(b)) for b in sim.batches()]


def run_scores(ms: ModelSet, batches: list[list], name: str = "m", engine: Engine | None = None):
    """Feed batches; return (engine, list of (ts, gpu ids, host ids, scores) per evaluated tick)."""
    eng = engine or Engine(row_checks=[], tick_checks=[], models=ms)
    seen: list[tuple] = []
    orig = ms.evaluate

    def spy(view, entities):
        out = orig(view, entities)
        seen.append((view.frame.ts.copy(), view.frame.gpu.copy(), view.frame.host.copy(),
                     ms.scores[name].copy()))
        return out
    ms.evaluate = spy  # type: ignore[method-assign]
    alerts = []
    try:
        for b in batches:
            alerts += eng.process(b).alerts
        alerts += eng.flush().alerts
    finally:
        del ms.evaluate
    return eng, seen, alerts


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC by ranks (ties count half)."""
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    ranks[order] = np.arange(1, len(allv) + 1)
    # average ranks of ties
    _, inv, cnt = np.unique(allv, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / cnt)[inv]
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))
