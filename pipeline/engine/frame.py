"""Records -> columns. One matrix row per DCGM sample, one column per catalog field.

This is where field-level bad data is found, vectorised over the whole batch: DCGM blank
sentinels, NaN/Inf and impossible negatives become NaN (the rest of the record is used) and
one dead letter per record and reason says which fields were dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from pipeline.catalog import BLANK_FP64, BLANK_INT64, FIELDS
from pipeline.decode import BLANK_SENTINEL, NAN_FIELD, NEGATIVE_VALUE
from pipeline.schema import FIELD_SLOT_COLUMNS, DcgmRecord, DeadLetter, NcclRecord

N_FIELDS = len(FIELDS)
_SLOTS = np.asarray(FIELD_SLOT_COLUMNS, dtype=np.intp)
_SLOT_NAMES = FIELDS.all_names
_SLOT_BLANK = np.array([BLANK_FP64 if FIELDS.by_name(n).dcgm_type == "DOUBLE" else BLANK_INT64
                        for n in _SLOT_NAMES])
_SLOT_MIN = np.array([-np.inf if FIELDS.by_name(n).min_value is None else FIELDS.by_name(n).min_value
                      for n in _SLOT_NAMES])
# First slot of every column, and (column, second slot) for fields with a 4.6 spelling too.
_FIRST = np.array([FIELD_SLOT_COLUMNS.index(c) for c in range(N_FIELDS)], dtype=np.intp)
_SECOND = [(c, s) for s, c in enumerate(FIELD_SLOT_COLUMNS) if s != _FIRST[c]]
_astuple = msgspec.structs.astuple


@dataclass
class DcgmFrame:
    """A batch of DCGM samples as columns, rows in processing order."""

    ts: np.ndarray        # float64 (n,)
    gpu: np.ndarray       # int32 entity id (n,)
    host: np.ndarray      # int32 host id (n,)
    values: np.ndarray    # float64 (n, N_FIELDS); NaN = not reported / dropped

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray | slice) -> "DcgmFrame":
        return DcgmFrame(self.ts[idx], self.gpu[idx], self.host[idx], self.values[idx])

    def col(self, alias: str) -> np.ndarray:
        return self.values[:, FIELDS.by_alias(alias).column]


def field_matrix(records: list[DcgmRecord]) -> np.ndarray:
    """(n, slots) matrix of the raw field values of ``records``."""
    if not records:
        return np.empty((0, len(_SLOT_NAMES)))
    return np.array([_astuple(r.fields) for r in records], dtype=np.float64)


def clean_fields(raw: np.ndarray, records: list[DcgmRecord], origins: list[str]) -> tuple[np.ndarray, list[DeadLetter]]:
    """Blank/NaN/negative cells -> NaN, both DCGM spellings -> one column; dead letters for what was dropped."""
    dead: list[DeadLetter] = []
    with np.errstate(invalid="ignore"):
        blank = raw >= _SLOT_BLANK
        inf = np.isinf(raw)
        neg = raw < _SLOT_MIN
    bad = blank | inf | neg
    if bad.any():
        for i in np.flatnonzero(bad.any(axis=1)):
            for mask, reason in ((blank[i] & ~inf[i], BLANK_SENTINEL), (inf[i], NAN_FIELD), (neg[i], NEGATIVE_VALUE)):
                if mask.any():
                    names = [_SLOT_NAMES[s] for s in np.flatnonzero(mask)]
                    rec = records[i]
                    dead.append(DeadLetter(
                        reason=reason, detail=f"dropped {', '.join(names)}; rest of the record kept",
                        origin=origins[i], action="fields_dropped", fields=names, ts=rec.ts, host=rec.host,
                        raw=msgspec.json.encode(rec).decode()[:2048]))
        raw = np.where(bad, np.nan, raw)
    values = raw[:, _FIRST]
    for col, slot in _SECOND:
        v = values[:, col]
        miss = np.isnan(v)
        if miss.any():
            v[miss] = raw[miss, slot]
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
