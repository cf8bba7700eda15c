"""Records -> columns. One matrix row per DCGM sample, one column per catalog field.

This is where field-level bad data is found, vectorised over the whole batch: DCGM blank
sentinels, NaN/Inf and impossible negatives become NaN (the rest of the record is used) and
one dead letter per record and reason says which fields were dropped.
"""

from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass
from itertools import chain, starmap
from typing import Sequence

import msgspec
import numpy as np
from msgspec.structs import astuple

from pipeline.rows import DcgmColumns, relayout
from pipeline.catalog import BLANK_FP64, BLANK_INT64, FIELDS
from pipeline.deadletters import BLANK_SENTINEL, NAN_FIELD, NEGATIVE_VALUE
from pipeline.schema import FIELD_SLOT_COLUMNS, DcgmRecord, DcgmSample, DeadLetter, NcclRecord, dcgm_fields_type

N_FIELDS = len(FIELDS)
_SLOT_NAMES = FIELDS.all_names
# The catalog field of each slot of DcgmFields, in slot order (the slots are the catalog's names).
_SLOT_FIELDS = [f for f in FIELDS for _ in f.names]
_SLOT_BLANK = np.array([BLANK_FP64 if f.dcgm_type == "DOUBLE" else BLANK_INT64 for f in _SLOT_FIELDS])
_SLOT_MIN = np.array([-np.inf if f.min_value is None else f.min_value for f in _SLOT_FIELDS])
ALL_COLUMNS = tuple(range(N_FIELDS))
_FIELDS = operator.attrgetter("fields")


@dataclass
class DcgmFrame:
    """A batch of DCGM samples as columns, rows in processing order."""

    ts: np.ndarray  # float64 (n,)
    gpu: np.ndarray  # int32 entity id (n,)
    host: np.ndarray  # int32 host id (n,)
    values: np.ndarray  # float64 (n, N_FIELDS); NaN = not reported / dropped / not needed
    # (in the engine, until advance(): the compact (n, len(columns)) matrix of Columnizer.compact)

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray | slice) -> "DcgmFrame":
        return DcgmFrame(self.ts[idx], self.gpu[idx], self.host[idx], self.values[idx])

    def col(self, alias: str) -> np.ndarray:
        return self.values[:, FIELDS.require(alias).column]


def _double(v: float) -> float:
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


class Columnizer:
    """Turns records' ``fields`` into the value matrix, reading only the columns in use.

    Reading a field is the expensive part of a sample (a Python number to a C double per slot),
    so the engine reads the fields its checks and rules name, not all of the catalog's.
    """

    def __init__(self, columns: tuple[int, ...] | list[int] = ALL_COLUMNS) -> None:
        self.columns = tuple(sorted(set(columns)))
        self.column_array = np.array(self.columns, dtype=np.intp)
        slots = [s for s, c in enumerate(FIELD_SLOT_COLUMNS) if c in self.columns]
        self.slots = np.asarray(slots, dtype=np.intp)
        self.names: tuple[str, ...] = tuple(_SLOT_NAMES[s] for s in slots)
        # Records decoded with exactly these fields (Decoder.set_fields) turn into a row with one
        # C-level astuple; others (the slow path's, hand-built ones) go through the getter.
        self._subset = dcgm_fields_type(self.names) if self.names else None
        names = list(self.names) or [_SLOT_NAMES[0]]
        # attrgetter returns a bare value for one name; always ask for at least two.
        self._getter_names = names if len(names) > 1 else names * 2
        self._get = operator.attrgetter(*self._getter_names)
        self._pack = struct.Struct(f"{len(slots)}d").pack  # native doubles, as np.float64
        self._blank = _SLOT_BLANK[self.slots]
        self._min = _SLOT_MIN[self.slots]
        self._floor = np.maximum(self._min, -np.finfo(np.float64).max)  # -Inf is below it even without a minimum
        slot_cols = [FIELD_SLOT_COLUMNS[s] for s in slots]
        # Compact layout: one column per entry of ``columns``, from the first spelling a record
        # has (both DCGM spellings of a field land in one column).
        pos = {c: j for j, c in enumerate(self.columns)}
        first: dict[int, int] = {}
        self._second: list[tuple[int, int]] = []
        for i, c in enumerate(slot_cols):
            if c in first:
                self._second.append((pos[c], i))
            else:
                first[c] = i
        self._first_idx = np.array([first[c] for c in self.columns], dtype=np.intp)
        self._identity = self._first_idx.tolist() == list(range(len(slots)))

    def raw(self, records: Sequence[DcgmSample]) -> np.ndarray:
        n, k = len(records), len(self.slots)
        if not records or not k:
            return np.empty((n, k))
        if isinstance(records, DcgmColumns):
            return self._from_columns(records)
        fields = list(map(_FIELDS, records))
        # Each row's tuple packed to doubles by struct in C and the bytes viewed as the matrix:
        # ~2x faster than np.fromiter over the flattened tuples, which converts value by value.
        if set(map(type, fields)) == {self._subset}:
            try:
                return np.frombuffer(b"".join(starmap(self._pack, map(astuple, fields))), np.float64).reshape(n, k)
            except struct.error:
                pass  # an integer too large for a double (300+ digits): the slow way below
        width = max(k, 2)
        try:
            m = np.fromiter(chain.from_iterable(map(self._get, fields)), np.float64, n * width)
        except (AttributeError, OverflowError):
            # Records decoded for an older field set (still pending when the rules were reloaded
            # with new fields): what they lack is simply not reported. An integer beyond a
            # double is infinite, so it is dropped as NaN/Inf with the rest of the record kept.
            m = np.array([[_double(getattr(f, nm, math.nan)) for nm in self._getter_names] for f in fields])
        return m.reshape(n, width)[:, :k]

    def _from_columns(self, cols: DcgmColumns) -> np.ndarray:
        """A columnar batch's matrix in this columnizer's slot order (the decoder laid it out
        as ``names`` unless the rules changed in between)."""
        return relayout(cols.values, cols.names, self.names)

    def compact(self, records: Sequence[DcgmSample], origins: Sequence[str]) -> tuple[np.ndarray, list[DeadLetter]]:
        """The (n, len(columns)) matrix of the columns in use, and dead letters for dropped fields.

        Blank/NaN/negative cells become NaN; both DCGM spellings of a field land in one column.
        """
        raw = self.raw(records)
        dead: list[DeadLetter] = []
        # Two comparisons tell a clean batch (the usual one): a blank or +Inf is at or above
        # the blank threshold, a negative or -Inf below the floor. Only a batch with a bad cell
        # works out which cells and why.
        with np.errstate(invalid="ignore"):  # NaN (not reported) compares False, quietly
            blank = raw >= self._blank
            suspect = bool(blank.any() or (raw < self._floor).any())
            if suspect:
                inf = np.isinf(raw)
                neg = raw < self._min
        if suspect:
            bad = blank | inf | neg
            for i in np.flatnonzero(bad.any(axis=1)).tolist():
                for mask, reason in (
                    (blank[i] & ~inf[i], BLANK_SENTINEL),
                    (inf[i], NAN_FIELD),
                    (neg[i] & ~inf[i], NEGATIVE_VALUE),
                ):
                    if mask.any():
                        names = [_SLOT_NAMES[self.slots[k]] for k in np.flatnonzero(mask)]
                        rec = records[i]
                        dead.append(
                            DeadLetter(
                                reason=reason,
                                detail=_dropped(names),
                                origin=origins[i],
                                action="fields_dropped",
                                fields=names,
                                ts=rec.ts,
                                host=rec.host,
                                raw=msgspec.json.encode(rec).decode()[:2048],
                            )
                        )
            raw = np.where(bad, np.nan, raw)
        out = raw if self._identity else raw[:, self._first_idx]
        for j, i in self._second:
            v = out[:, j]
            miss = np.isnan(v)
            if miss.any():
                v[miss] = raw[miss, i]
        return out, dead

    def values(self, records: list[DcgmRecord], origins: Sequence[str]) -> tuple[np.ndarray, list[DeadLetter]]:
        """``compact`` spread over the catalog's columns: (n, N_FIELDS), NaN where not in use."""
        c, dead = self.compact(records, origins)
        values = np.full((len(records), N_FIELDS), np.nan)
        values[:, self.column_array] = c
        return values, dead


def _dropped(names: list[str]) -> str:
    return f"dropped {', '.join(names)}; rest of the record kept"


def joined(first: list[DeadLetter], more: list[DeadLetter]) -> list[DeadLetter]:
    """``first`` and ``more`` (two columnizers' letters on one batch), a record's fields dropped
    for one reason in one letter, as one columnizer over both sets of columns would write it.

    >>> a = DeadLetter(reason="negative_value", detail=_dropped(["x"]), origin="m@1", fields=["x"])
    >>> [(d.origin, d.fields, d.detail) for d in joined([a], [msgspec.structs.replace(a, fields=["y"])])]
    [('m@1', ['x', 'y'], 'dropped x, y; rest of the record kept')]
    """
    if not first or not more:
        return first + more
    out = list(first)
    at = {(d.origin, d.reason, d.ts, d.host): i for i, d in enumerate(out)}
    for d in more:
        i = at.get((d.origin, d.reason, d.ts, d.host))
        if i is None:
            out.append(d)
        else:
            names = out[i].fields + d.fields
            out[i] = msgspec.structs.replace(out[i], fields=names, detail=_dropped(names))
    return out


@dataclass
class NcclFrame:
    """A batch of NCCL per-rank records as columns."""

    ts: np.ndarray
    host: np.ndarray  # host id
    gpu: np.ndarray  # GPU entity id, -1 when the record names no GPU
    comm: list[str]
    rank: np.ndarray
    nranks: np.ndarray
    bytes: np.ndarray
    exec_time_us: np.ndarray
    busbw_gbs: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray) -> "NcclFrame":
        il = idx.tolist() if idx.dtype != bool else np.flatnonzero(idx).tolist()
        return NcclFrame(
            self.ts[idx],
            self.host[idx],
            self.gpu[idx],
            [self.comm[i] for i in il],
            self.rank[idx],
            self.nranks[idx],
            self.bytes[idx],
            self.exec_time_us[idx],
            self.busbw_gbs[idx],
        )

    @staticmethod
    def concat(frames: list["NcclFrame"]) -> "NcclFrame":
        if len(frames) == 1:
            return frames[0]
        cols = {k: np.concatenate([getattr(f, k) for f in frames]) for k in NCCL_KEYS if k != "comm"}
        return NcclFrame(comm=[c for f in frames for c in f.comm], **cols)

    def to_state(self) -> dict:
        return {k: getattr(self, k) for k in NCCL_KEYS}

    @staticmethod
    def from_state(d: dict) -> "NcclFrame":
        cols = {k: np.asarray(d[k]).copy() for k in NCCL_KEYS if k != "comm"}
        return NcclFrame(comm=list(d["comm"]), **cols)


NCCL_KEYS = ("ts", "host", "gpu", "comm", "rank", "nranks", "bytes", "exec_time_us", "busbw_gbs")

_NCCL = {n: operator.attrgetter(n) for n in ("ts", "comm", "rank", "nranks", "bytes", "exec_time_us", "busbw_gbs")}


def nccl_frame(records: list[NcclRecord], host_ids: np.ndarray, gpu_ids: np.ndarray) -> NcclFrame:
    n = len(records)

    def col(name: str, dtype: type) -> np.ndarray:
        return np.fromiter(map(_NCCL[name], records), dtype, n)

    return NcclFrame(
        ts=col("ts", np.float64),
        host=host_ids,
        gpu=gpu_ids,
        comm=list(map(_NCCL["comm"], records)),
        rank=col("rank", np.int32),
        nranks=col("nranks", np.int32),
        bytes=col("bytes", np.float64),
        exec_time_us=col("exec_time_us", np.float64),
        # An optional field: None (not reported) becomes NaN.
        busbw_gbs=np.array(list(map(_NCCL["busbw_gbs"], records)), dtype=np.float64),
    )
