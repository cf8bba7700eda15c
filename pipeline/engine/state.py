"""Per-entity telemetry state in dense arrays, and what a check sees of a batch.

``GpuState.last`` holds each GPU's last known value of every field; counters' increases are
computed against it (a drop means a reset: the series restarts, never a negative increase).
One GPU's state is a row of ``last`` plus a few scalars: ~0.6 KiB at 67 fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.entities import Entities, grow
from pipeline.engine.frame import N_FIELDS, DcgmFrame

COUNTER_COLS = np.array([f.column for f in FIELDS if f.is_counter], dtype=np.intp)


class GpuState:
    def __init__(self) -> None:
        self.last = np.full((0, N_FIELDS), np.nan)
        self.last_ts = np.full(0, np.nan)          # per GPU
        self.host_last_ts = np.full(0, np.nan)     # per host (any DCGM record)
        self.seen = np.full((0, N_FIELDS), np.nan)  # per GPU and field: when it was last reported

    def ensure(self, n_gpus: int, n_hosts: int) -> None:
        self.last = grow(self.last, n_gpus, np.nan)
        self.last_ts = grow(self.last_ts, n_gpus, np.nan)
        self.host_last_ts = grow(self.host_last_ts, n_hosts, np.nan)
        self.seen = grow(self.seen, n_gpus, np.nan)

    def nbytes_per_gpu(self) -> float:
        n = max(1, len(self.last_ts))
        return (self.last.nbytes + self.last_ts.nbytes + self.seen.nbytes) / n


@dataclass
class View:
    """A chunk of samples as a check sees it, rows in event-time order within each GPU.

    - ``frame.values``: what each sample reported (NaN: not reported);
    - ``filled``: the GPU's last known value of each field as of that sample;
    - ``prev``: the last known value of each field before that sample;
    - ``seen``: when each field was last reported, as of that sample;
    - ``increase``: per counter field, the increase since the GPU's previous sample (0 at a
      reset, NaN when unknown, e.g. the first sample ever);
    - ``ts0``: start of the tick the chunk belongs to (every row of a chunk shares one tick).
    """

    frame: DcgmFrame
    filled: np.ndarray
    prev: np.ndarray
    seen: np.ndarray
    increase: np.ndarray          # (n, len(COUNTER_COLS))
    reset: np.ndarray             # (n, len(COUNTER_COLS)) bool
    entities: Entities
    ts0: float = float("nan")
    model_scores: dict[str, np.ndarray] = field(default_factory=dict)  # per-row, set by the models

    def value(self, alias: str, *, last_known: bool = True) -> np.ndarray:
        col = FIELDS.by_alias(alias).column
        return self.filled[:, col] if last_known else self.frame.values[:, col]

    def inc(self, alias: str) -> np.ndarray:
        col = FIELDS.by_alias(alias).column
        return self.increase[:, int(np.searchsorted(COUNTER_COLS, col))]

    def has_bits(self, alias: str, mask: int) -> np.ndarray:
        v = self.value(alias)
        ok = ~np.isnan(v)
        out = np.zeros(len(v), dtype=bool)
        out[ok] = (v[ok].astype(np.int64) & mask) != 0
        return out


def advance(state: GpuState, frame: DcgmFrame, entities: Entities, ts0: float = float("nan")) -> View:
    """Fold a chunk (rows sorted by GPU, event time within GPU) into the state; return its view."""
    n = len(frame)
    state.ensure(entities.n_gpus, entities.n_hosts)
    if n == 0:
        empty = np.empty((0, len(COUNTER_COLS)))
        m = np.empty((0, N_FIELDS))
        return View(frame, m, m, m, empty, empty.astype(bool), entities, ts0)
    ent = frame.gpu
    vals = frame.values
    start = np.ones(n, dtype=bool)
    start[1:] = ent[1:] != ent[:-1]
    gstart = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    # Forward-fill each column within its GPU's run of rows; fall back to the stored state.
    idx = np.where(np.isnan(vals), -1, np.arange(n)[:, None])
    acc = np.maximum.accumulate(idx, axis=0)
    have = acc >= gstart[:, None]
    cols = np.arange(N_FIELDS)
    filled = np.where(have, vals[np.maximum(acc, 0), cols], state.last[ent])
    seen = np.where(have, frame.ts[np.maximum(acc, 0)], state.seen[ent])
    # Previous known value of each field: the row above within the GPU, else the state.
    prev = np.empty((n, N_FIELDS))
    prev[start] = state.last[ent[start]]
    notstart = np.flatnonzero(~start)
    prev[notstart] = filled[notstart - 1]
    cur = vals[:, COUNTER_COLS]
    with np.errstate(invalid="ignore"):
        inc = cur - prev[:, COUNTER_COLS]
        reset = inc < 0
    inc[reset] = 0.0
    # Store the last row of each GPU's run.
    end = np.ones(n, dtype=bool)
    end[:-1] = ent[1:] != ent[:-1]
    state.last[ent[end]] = filled[end]
    state.seen[ent[end]] = seen[end]
    state.last_ts[ent[end]] = frame.ts[end]
    np.fmax.at(state.host_last_ts, frame.host, frame.ts)
    return View(frame, filled, prev, seen, inc, reset, entities, ts0)
