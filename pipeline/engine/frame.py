"""Records -> columns. One matrix row per DCGM sample, one column per catalog field.

This is where field-level bad data is found, vectorised over the whole batch: DCGM blank
sentinels, NaN/Inf and impossible negatives become NaN (the rest of the record is used) and
one dead letter per record and reason says which fields were dropped.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import msgspec
import numpy as np

from pipeline.catalog import BLANK_FP64, BLANK_INT64, FIELDS
from pipeline.decode import BLANK_SENTINEL, NAN_FIELD, NEGATIVE_VALUE
from pipeline.schema import FIELD_SLOT_COLUMNS, DcgmRecord, DeadLetter, NcclRecord

N_FIELDS = len(FIELDS)
_SLOT_NAMES = FIELDS.all_names
_SLOT_BLANK = np.array([BLANK_FP64 if FIELDS.by_name(n).dcgm_type == "DOUBLE" else BLANK_INT64
                        for n in _SLOT_NAMES])
_SLOT_MIN = np.array([-np.inf if FIELDS.by_name(n).min_value is None else FIELDS.by_name(n).min_value
                      for n in _SLOT_NAMES])
ALL_COLUMNS = tuple(range(N_FIELDS))
_FIELDS = operator.attrgetter("fields")


@dataclass
class DcgmFrame:
    """A batch of DCGM samples as columns, rows in processing order."""

    ts: np.ndarray        # float64 (n,)
    gpu: np.ndarray       # int32 entity id (n,)
    host: np.ndarray      # int32 host id (n,)
    values: np.ndarray    # float64 (n, N_FIELDS); NaN = not reported / dropped / not needed

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray | slice) -> "DcgmFrame":
        return DcgmFrame(self.ts[idx], self.gpu[idx], self.host[idx], self.values[idx])

    def col(self, alias: str) -> np.ndarray:
        return self.values[:, FIELDS.by_alias(alias).column]


class Columnizer:
    """Turns records' ``fields`` into the value matrix, reading only the columns in use.

    Reading a field is the expensive part of a sample (a Python float to a C double per slot),
    so the engine reads the fields its checks and rules name, not all of the catalog's.
    """

    def __init__(self, columns: tuple[int, ...] | list[int] = ALL_COLUMNS) -> None:
        self.columns = tuple(sorted(set(columns)))
        slots = [s for s, c in enumerate(FIELD_SLOT_COLUMNS) if c in self.columns]
        self.slots = np.asarray(slots, dtype=np.intp)
        names = [_SLOT_NAMES[s] for s in slots] or [_SLOT_NAMES[0]]
        # attrgetter returns a bare value for one name; always ask for at least two.
        self._get = operator.attrgetter(*(names if len(names) > 1 else names * 2))
        self._width = max(len(slots), 1)
        self._blank = _SLOT_BLANK[self.slots]
        self._min = _SLOT_MIN[self.slots]
        slot_cols = [FIELD_SLOT_COLUMNS[s] for s in slots]
        first: dict[int, int] = {}
        self._second: list[tuple[int, int]] = []
        for i, c in enumerate(slot_cols):
            if c in first:
                self._second.append((c, i))
            else:
                first[c] = i
        self._first_cols = np.array(list(first), dtype=np.intp)
        self._first_idx = np.array(list(first.values()), dtype=np.intp)

    def raw(self, records: list[DcgmRecord]) -> np.ndarray:
        if not records or not len(self.slots):
            return np.empty((len(records), len(self.slots)))
        m = np.array(list(map(self._get, map(_FIELDS, records))), dtype=np.float64)
        return m[:, : len(self.slots)]

    def values(self, records: list[DcgmRecord], origins: list[str]) -> tuple[np.ndarray, list[DeadLetter]]:
        """The (n, N_FIELDS) matrix and dead letters for the fields dropped on the way.

        Blank/NaN/negative cells become NaN; both DCGM spellings of a field land in one column.
        """
        raw = self.raw(records)
        dead: list[DeadLetter] = []
        with np.errstate(invalid="ignore"):
            blank = raw >= self._blank
            inf = np.isinf(raw)
            neg = raw < self._min
        bad = blank | inf | neg
        if bad.any():
            for i in np.flatnonzero(bad.any(axis=1)):
                for mask, reason in ((blank[i] & ~inf[i], BLANK_SENTINEL), (inf[i], NAN_FIELD), (neg[i], NEGATIVE_VALUE)):
                    if mask.any():
                        names = [_SLOT_NAMES[self.slots[k]] for k in np.flatnonzero(mask)]
                        rec = records[i]
                        dead.append(DeadLetter(
                            reason=reason, detail=f"dropped {', '.join(names)}; rest of the record kept",
                            origin=origins[i], action="fields_dropped", fields=names, ts=rec.ts, host=rec.host,
                            raw=msgspec.json.encode(rec).decode()[:2048]))
            raw = np.where(bad, np.nan, raw)
        values = np.full((len(records), N_FIELDS), np.nan)
        values[:, self._first_cols] = raw[:, self._first_idx]
        for col, i in self._second:
            v = values[:, col]
            miss = np.isnan(v)
            if miss.any():
                v[miss] = raw[miss, i]
        return values, dead



@dataclass
class NcclFrame:
    """A batch of NCCL per-rank records as columns."""

    ts: np.ndarray
    host: np.ndarray          # host id
    gpu: np.ndarray           # GPU entity id, -1 when the record names no GPU
    comm: list[str]
    rank: np.ndarray
    nranks: np.ndarray
    bytes: np.ndarray
    exec_time_us: np.ndarray
    busbw_gbs: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)


def nccl_frame(records: list[NcclRecord], host_ids: np.ndarray, gpu_ids: np.ndarray) -> NcclFrame:
    n = len(records)
    return NcclFrame(
        ts=np.fromiter((r.ts for r in records), np.float64, n),
        host=host_ids,
        gpu=gpu_ids,
        comm=[r.comm for r in records],
        rank=np.fromiter((r.rank for r in records), np.int32, n),
        nranks=np.fromiter((r.nranks for r in records), np.int32, n),
        bytes=np.fromiter((r.bytes for r in records), np.float64, n),
        exec_time_us=np.fromiter((r.exec_time_us for r in records), np.float64, n),
        busbw_gbs=np.fromiter((np.nan if r.busbw_gbs is None else r.busbw_gbs for r in records), np.float64, n),
    )
