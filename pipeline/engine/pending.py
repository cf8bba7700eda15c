"""Rows waiting for the watermark: each batch's records as columns, until a release takes them.

The engine turns arriving records into columns at once (docs/architecture.md §4): the record
objects are freed, a release works on arrays only, and a checkpoint carries what is buffered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.engine.arrays import from_dict, like, numeric, to_dict
from pipeline.engine.frame import NCCL_KEYS, NcclFrame
from pipeline.errors import StateError
from pipeline.rows import relayout


def in_time_order(ts: np.ndarray, gpu: np.ndarray) -> bool:
    """Whether rows are sorted by (ts, gpu): what a stable lexsort would leave as it is."""
    if len(ts) < 2:
        return True
    dt = ts[1:] - ts[:-1]
    return bool(((dt > 0) | ((dt == 0) & (gpu[1:] >= gpu[:-1]))).all())


def span(ts: np.ndarray, nts: np.ndarray) -> tuple[float, float]:
    """(oldest, newest) event time of a buffer's rows; (inf, -inf) when it has none."""
    both = np.concatenate([ts, nts])
    return (float(both.min()), float(both.max())) if len(both) else (math.inf, -math.inf)


@dataclass
class Pending:
    """Buffered rows of a batch as columns: DCGM samples, and NCCL records' times (and columns,
    when a stage reads them), each in arrival order."""

    ts: np.ndarray  # DCGM rows: event time
    host: np.ndarray  # host id (int32)
    gpu: np.ndarray  # GPU id (int32)
    values: np.ndarray  # (n, len(cols)): Columnizer.compact
    cols: tuple[int, ...]  # the catalog columns of ``values`` (rules may be reloaded meanwhile)
    nccl_ts: np.ndarray  # NCCL rows: event time
    nccl: NcclFrame | None  # their columns, kept when a stage reads them
    tmin: float
    tmax: float

    @staticmethod
    def empty(cols: tuple[int, ...]) -> "Pending":
        """No rows (a batch whose records no stage reads as rows)."""
        none = np.empty(0, np.int32)
        return Pending(np.empty(0), none, none, np.empty((0, len(cols))), cols, np.empty(0), None, math.inf, -math.inf)

    def split(self, wm: float) -> tuple["Pending", "Pending"]:
        """(rows before ``wm``, the rest)."""
        sel, nsel = self.ts < wm, self.nccl_ts < wm
        return self._take(sel, nsel), self._take(~sel, ~nsel)

    def take_rows(self, sel: np.ndarray, nccl: bool = False) -> "Pending":
        """The DCGM rows where ``sel`` holds, with every NCCL record (``nccl``) or none."""
        return self._take(sel, np.full(len(self.nccl_ts), nccl))

    def _take(self, sel: np.ndarray, nsel: np.ndarray) -> "Pending":
        ts, nts = self.ts[sel], self.nccl_ts[nsel]
        return Pending(
            ts,
            self.host[sel],
            self.gpu[sel],
            self.values[sel],
            self.cols,
            nts,
            self.nccl.take(nsel) if self.nccl is not None else None,
            *span(ts, nts),
        )

    def __len__(self) -> int:
        return len(self.ts) + len(self.nccl_ts)

    @staticmethod
    def concat(parts: list["Pending"], cols: tuple[int, ...]) -> "Pending":
        """One run of rows, values in the layout of ``cols`` (the columnizer's now)."""
        parts = [p if p.cols == cols else p.remap(cols) for p in parts]
        if len(parts) == 1:
            return parts[0]
        frames = [p.nccl for p in parts if p.nccl is not None]
        return Pending(
            np.concatenate([p.ts for p in parts]),
            np.concatenate([p.host for p in parts]),
            np.concatenate([p.gpu for p in parts]),
            np.concatenate([p.values for p in parts]),
            cols,
            np.concatenate([p.nccl_ts for p in parts]),
            NcclFrame.concat(frames) if frames else None,
            min(p.tmin for p in parts),
            max(p.tmax for p in parts),
        )

    def remap(self, cols: tuple[int, ...]) -> "Pending":
        """The same rows in another column layout: a column this one lacks reads as not reported."""
        values = relayout(self.values, self.cols, cols)
        return Pending(self.ts, self.host, self.gpu, values, cols, self.nccl_ts, self.nccl, self.tmin, self.tmax)

    def to_state(self) -> dict[str, Any]:
        """The rows as a snapshot holds them (``pending_columns``): numbers and strings only."""
        return {
            "cols": list(self.cols),
            "ts": to_dict(self.ts),
            "host": to_dict(self.host),
            "gpu": to_dict(self.gpu),
            "values": to_dict(self.values),
            "nccl_ts": to_dict(self.nccl_ts),
            "nccl": None
            if self.nccl is None
            else {k: (v if k == "comm" else to_dict(v)) for k, v in self.nccl.to_state().items()},
        }

    @staticmethod
    def from_state(d: dict[str, Any]) -> "Pending":
        """Rows of a snapshot (``to_state``); a bad array, or rows that do not line up (columns
        of unequal length or width, ids that are no whole numbers), is a ``StateError`` here
        rather than a crash at a later release.

        >>> rows = Pending.from_state(Pending.empty((0, 4)).to_state())
        >>> len(rows), rows.cols
        (0, (0, 4))
        >>> bad = Pending.empty((0, 4)).to_state() | {"host": to_dict(np.zeros(1, np.int32))}
        >>> try:
        ...     Pending.from_state(bad)
        ... except StateError as e:
        ...     print(e.message)
        snapshot: pending rows of unequal length or width
        """
        one, two = np.zeros(0), np.zeros((0, 0))  # what the times and values must be
        ts, nts = like(from_dict(d["ts"]), "pending ts", one), like(from_dict(d["nccl_ts"]), "pending nccl_ts", one)
        host, gpu = _ids(from_dict(d["host"]), "pending host"), _ids(from_dict(d["gpu"]), "pending gpu")
        values, cols = like(from_dict(d["values"]), "pending values", two), tuple(d["cols"])
        if not all(type(c) is int for c in cols):
            raise StateError("snapshot: pending columns are not catalog column numbers")
        if not len(ts) == len(host) == len(gpu) == len(values) or values.shape[1] != len(cols):
            raise StateError("snapshot: pending rows of unequal length or width")
        nccl = (
            None
            if d["nccl"] is None
            else NcclFrame.from_state({k: (v if k == "comm" else from_dict(v)) for k, v in d["nccl"].items()})
        )
        if nccl is not None and not all(
            (len(v) == len(nts) if k == "comm" else np.ndim(v) == 1 and len(v) == len(nts))
            for k, v in ((k, getattr(nccl, k)) for k in NCCL_KEYS)
        ):
            raise StateError("snapshot: pending NCCL columns of another length than their times")
        return Pending(ts, host, gpu, values, cols, nts, nccl, *span(ts, nts))


def _ids(a: np.ndarray, what: str) -> np.ndarray:
    """``a`` if it holds ids: a 1-d array of whole numbers, none negative; else ``StateError``."""
    if numeric(a, what).dtype.kind not in "iu" or (len(a) and a.min() < 0):
        raise StateError(f"snapshot: {what} is {a.dtype}{list(a.shape)}, expected ids (whole numbers, none negative)")
    return a
