"""A batch of telemetry rows as the engine and the fleet stage take it: a list of records, the
DCGM samples as columns (``DcgmColumns``), or both side by side (``Combined``).

Columns come from a columnar telemetry message (``pipeline/colwire.py``) or from the fleet
topic's forwarded records (``pipeline/service/forwarded.py``); a record is built for a row
only where one is asked for (a dead letter, a GPU's first model). ``take``, ``concat`` and
``split`` work on any of the three shapes and keep columns as columns: what selects, joins
and orders a batch (the engine's screening, the fleet stage's buffer and canonical order)
then costs no Python object per DCGM row.

>>> from pipeline.schema import dcgm
>>> recs = [dcgm(1.0, "a", 0, {}), dcgm(2.0, "b", 1, {})]
>>> [r.host for r in take(recs, np.array([1]))], len(concat([recs, recs])[0])
(['b'], 4)
"""

from __future__ import annotations

import functools
from itertools import compress
from typing import Any, Hashable, Iterable, Sequence, TypeVar

import msgspec
import numpy as np

from pipeline.schema import DcgmSample, TelemetryRecord

NO_LINK = -(1 << 63)  # the link column's "no link": no real link index is negative


@functools.lru_cache(maxsize=256)
def layout(given: tuple[Hashable, ...], wanted: tuple[Hashable, ...]) -> tuple[list[int], list[int]]:
    """Which columns of a value matrix laid out as ``given`` go to which of one laid out as
    ``wanted`` (cached: a producer sends the same layout in every message).

    >>> layout(("a", "b", "c"), ("c", "a", "d"))
    ([0, 2], [1, 0])
    """
    where = {name: j for j, name in enumerate(wanted)}
    src = [i for i, f in enumerate(given) if f in where]
    return src, [where[given[i]] for i in src]


def relayout(values: np.ndarray, given: tuple[Hashable, ...], wanted: tuple[Hashable, ...]) -> np.ndarray:
    """``values`` (a column per ``given``) with a column per ``wanted``: one that ``given`` lacks
    is NaN (not reported), one that ``wanted`` lacks is left out (as the JSON decoder skips the
    fields nobody reads). ``values`` itself when the layouts are the same, else a new array.

    >>> relayout(np.array([[1.0, 2.0]]), ("a", "b"), ("b", "x")).tolist()
    [[2.0, nan]]
    """
    if given == wanted:
        return values
    src, dst = layout(given, wanted)
    out = np.full((len(values), len(wanted)), np.nan)
    if src:
        out[:, dst] = values[:, src]
    return out


_T = TypeVar("_T", covariant=True)


class _Rows(Sequence[_T]):
    """A batch's rows as a sequence: a slice goes to ``take``, one row is built by ``_row``."""

    ts: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n, i = len(self), int(i)
        if not -n <= i < n:
            raise IndexError(f"row {i} of {n}")
        return self._row(i + n if i < 0 else i)

    def take(self, idx: np.ndarray) -> Any:  # pragma: no cover - each kind of rows has its own
        raise NotImplementedError

    def _row(self, i: int) -> _T:  # pragma: no cover - each kind of rows has its own
        raise NotImplementedError


class DcgmColumns(_Rows[DcgmSample]):
    """DCGM samples of several columnar messages (or forwarded bodies), concatenated, as the
    engine ingests them: the arrays it reads, and a record built for a row only when one is
    asked for (a dead letter, a GPU's first model). ``names``: the value matrix's columns (the
    decoder's fields, or the fleet engine's)."""

    def __init__(
        self,
        names: tuple[str, ...],
        ts: np.ndarray,
        hosts: list[str],
        gpu: np.ndarray,
        link: np.ndarray,
        values: np.ndarray,
        models: list[str | None],
        labels: list[Any],
        record_type: type,
        fields_type: type,
        v: np.ndarray,
    ) -> None:
        self.names, self.ts, self.hosts, self.gpu, self.link = names, ts, hosts, gpu, link
        self.values, self.models, self.labels = values, models, labels
        self.record_type, self.fields_type, self.v = record_type, fields_type, v

    def _row(self, i: int) -> DcgmSample:
        row = self.values[i]
        have = np.flatnonzero(~np.isnan(row)).tolist()
        # Only the values present: a NaN slot would be written out as null, not left out.
        present = dict(zip([self.names[j] for j in have], row[have].tolist()))
        lk = int(self.link[i])
        return self.record_type(
            v=int(self.v[i]),
            ts=float(self.ts[i]),
            host=self.hosts[i],
            gpu=int(self.gpu[i]),
            link=None if lk == NO_LINK else lk,
            model=self.models[i],
            fields=self.fields_type(**present),
            labels=self.labels[i],
        )

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def take(self, idx: np.ndarray) -> "DcgmColumns":
        """The rows at ``idx`` (indices or a boolean mask), still columns."""
        il = np.flatnonzero(idx).tolist() if idx.dtype == bool else idx.tolist()
        return DcgmColumns(
            self.names,
            self.ts[idx],
            [self.hosts[i] for i in il],
            self.gpu[idx],
            self.link[idx],
            self.values[idx],
            [self.models[i] for i in il],
            [self.labels[i] for i in il],
            self.record_type,
            self.fields_type,
            self.v[idx],
        )

    @staticmethod
    def concat(parts: Iterable["DcgmColumns"]) -> "DcgmColumns":
        ps = list(parts)
        if len(ps) == 1:
            return ps[0]
        p0 = ps[0]
        return DcgmColumns(
            p0.names,
            np.concatenate([p.ts for p in ps]),
            [h for p in ps for h in p.hosts],
            np.concatenate([p.gpu for p in ps]),
            np.concatenate([p.link for p in ps]),
            np.concatenate([p.values for p in ps]),
            [m for p in ps for m in p.models],
            [x for p in ps for x in p.labels],
            p0.record_type,
            p0.fields_type,
            np.concatenate([p.v for p in ps]),
        )


class Combined(_Rows[Any]):
    """A batch of columnar rows and JSON-decoded records together, the columns first (a batch
    with both encodings, as a topic with columnar DCGM producers and JSON NCCL producers has):
    the engine ingests each part as it is, neither turned into the other.

    ``cols`` rows are indices ``0 .. len(cols)-1``, ``others`` follow."""

    def __init__(self, cols: DcgmColumns, others: list[Any]) -> None:
        self.cols, self.others = cols, others
        n = len(others)
        self.ts = np.concatenate([cols.ts, np.fromiter((r.ts for r in others), np.float64, n)])
        self.hosts: list[str] = cols.hosts + [r.host for r in others]

    def _row(self, i: int) -> Any:
        nc = len(self.cols)
        return self.cols[i] if i < nc else self.others[i - nc]

    def __iter__(self) -> Any:
        yield from self.cols
        yield from self.others

    def take(self, idx: np.ndarray) -> "Combined":
        """The rows at ``idx`` (indices or a boolean mask), each part as it is."""
        il = np.flatnonzero(idx) if idx.dtype == bool else np.asarray(idx, np.int64)
        nc = len(self.cols)
        head = il[il < nc]
        return Combined(self.cols.take(head), [self.others[i - nc] for i in il[il >= nc].tolist()])

    @staticmethod
    def concat(parts: Iterable["Combined"]) -> "Combined":
        """The parts one after another, each part's columns and records kept apart."""
        ps = list(parts)
        if len(ps) == 1:
            return ps[0]
        return Combined(DcgmColumns.concat(p.cols for p in ps), [r for p in ps for r in p.others])


def take(rows: Sequence[TelemetryRecord], idx: np.ndarray) -> Sequence[TelemetryRecord]:
    """``rows`` at ``idx`` (indices, in their order, or a boolean mask): columns stay columns,
    a list stays a list. A ``Combined``'s columns come first, then its records, each in
    ``idx``'s order."""
    if isinstance(rows, (DcgmColumns, Combined)):
        return rows.take(np.asarray(idx))
    a = np.asarray(idx)
    il = np.flatnonzero(a).tolist() if a.dtype == np.bool_ else a.tolist()
    return [rows[i] for i in il]


def records_at(rows: Sequence[TelemetryRecord], idx: np.ndarray) -> list[TelemetryRecord]:
    """The rows at ``idx`` (indices) as a list of records, in ``idx``'s order: a ``Combined``'s
    records straight from its list, without a step per row through ``__getitem__`` (a columnar
    row is built, as ``rows[i]`` builds it).

    >>> from pipeline.schema import dcgm
    >>> [r.host for r in records_at([dcgm(1.0, "a", 0, {}), dcgm(1.0, "b", 0, {})], np.array([1]))]
    ['b']
    """
    il = np.asarray(idx, np.int64).tolist()
    if isinstance(rows, Combined) and il and min(il) >= len(rows.cols):
        nc, others = len(rows.cols), rows.others
        if len(il) == len(others) and il[0] == nc and il[-1] == nc + len(il) - 1 and (np.diff(idx) == 1).all():
            return list(others)  # every record, in order: the fleet stage's NCCL records
        return [others[i - nc] for i in il]
    return [rows[i] for i in il]


def concat(parts: Sequence[Sequence[TelemetryRecord]]) -> tuple[Sequence[TelemetryRecord], np.ndarray | None]:
    """The parts one after another, and where each row of the result sits among the parts laid
    end to end (None: in the same place).

    The result is columns where every part holding DCGM samples holds them as columns (a list
    of only NCCL and progress records joins as the records of a ``Combined``): a ``Combined``
    holds every part's columns first, then every part's records, so its rows are in another
    order than the parts'. Otherwise it is one list of records in the parts' order (a record
    built per columnar row: a batch that mixes the encodings, which the fleet stage meets only
    with bodies of earlier builds).

    >>> from pipeline.schema import dcgm
    >>> joined, where = concat([[dcgm(1.0, "a", 0, {})], []])
    >>> len(joined), where
    (1, None)
    """
    ps = [p for p in parts if len(p)]
    if not ps:
        return [], None
    if all(isinstance(p, list) for p in ps):
        return (ps[0] if len(ps) == 1 else [r for p in ps for r in p]), None
    if len(ps) == 1:
        return ps[0], None
    like = next(p for p in ps if isinstance(p, (DcgmColumns, Combined)))
    none = (like.cols if isinstance(like, Combined) else like).take(np.empty(0, np.int64))
    joined: list[Combined] = []
    for p in ps:
        if isinstance(p, Combined):
            joined.append(p)
        elif isinstance(p, DcgmColumns):
            joined.append(Combined(p, []))
        elif isinstance(p, list) and not any(isinstance(r, DcgmSample) for r in p):
            joined.append(Combined(none, p))
        else:
            return [r for q in ps for r in q], None
    if len({c.cols.names for c in joined}) > 1:  # laid out for other fields (a reload in between)
        return [r for q in ps for r in q], None
    nd = np.array([len(c.cols) for c in joined], np.int64)
    no = np.array([len(c.others) for c in joined], np.int64)
    start = np.cumsum(nd + no) - (nd + no)
    where = np.concatenate([_runs(start, nd), _runs(start + nd, no)])
    return Combined.concat(joined), where


def _runs(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``start[k], start[k] + 1, ..., start[k] + length[k] - 1`` for every k, one after another."""
    total = int(length.sum())
    if not total:
        return np.empty(0, np.int64)
    return np.repeat(start - (np.cumsum(length) - length), length) + np.arange(total, dtype=np.int64)


def split(rows: Sequence[TelemetryRecord]) -> tuple[Sequence[TelemetryRecord], list[TelemetryRecord]]:
    """The DCGM samples of ``rows`` and the other records, each in order. Columns stay columns;
    a ``Combined``'s DCGM records (a JSON message's, decoded beside columnar ones) stay beside
    its columns, as the records of a ``Combined`` of DCGM samples only.

    >>> from pipeline.schema import dcgm, NcclRecord
    >>> n = NcclRecord(ts=1.0, host="a", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=8, exec_time_us=1.0)
    >>> d, o = split([dcgm(1.0, "a", 0, {}), n])
    >>> len(d), o == [n]
    (1, True)
    """
    if isinstance(rows, Combined):
        if not any(isinstance(r, DcgmSample) for r in rows.others):
            return rows.cols, rows.others
        # DCGM records of JSON messages beside columnar ones: they stay beside the columns.
        d, o = split(rows.others)
        return Combined(rows.cols, list(d)), o
    if isinstance(rows, DcgmColumns):
        return rows, []
    is_dcgm = [isinstance(r, DcgmSample) for r in rows]
    if all(is_dcgm):
        return rows, []
    return list(compress(rows, is_dcgm)), [r for r, d in zip(rows, is_dcgm) if not d]


def dcgm_rows(rows: Sequence[TelemetryRecord]) -> np.ndarray:
    """Which rows are DCGM samples.

    >>> from pipeline.schema import dcgm, NcclRecord
    >>> n = NcclRecord(ts=1.0, host="a", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=8, exec_time_us=1.0)
    >>> dcgm_rows([dcgm(1.0, "a", 0, {}), n]).tolist()
    [True, False]
    """
    if isinstance(rows, DcgmColumns):
        return np.ones(len(rows), bool)
    if isinstance(rows, Combined):
        return np.concatenate([np.ones(len(rows.cols), bool), dcgm_rows(rows.others)])
    # By type, a lookup per record: the decoder's checked types are subclasses.
    types = list(map(type, rows))
    kinds = {t: issubclass(t, DcgmSample) for t in set(types)}
    return np.fromiter(map(kinds.__getitem__, types), bool, len(types))


def with_times(rows: Sequence[TelemetryRecord], idx: np.ndarray, ts: np.ndarray) -> Sequence[TelemetryRecord]:
    """``rows`` with the rows at ``idx`` (indices) at times ``ts``: a new batch of the same
    shape; the records given are left as they are.

    >>> from pipeline.schema import dcgm
    >>> recs = [dcgm(1.0, "a", 0, {}), dcgm(1.95, "a", 0, {})]
    >>> [r.ts for r in with_times(recs, np.array([1]), np.array([2.0]))], recs[1].ts
    ([1.0, 2.0], 1.95)
    """
    if isinstance(rows, DcgmColumns):
        t = rows.ts.copy()
        t[idx] = ts
        return DcgmColumns(
            rows.names, t, rows.hosts, rows.gpu, rows.link, rows.values, rows.models, rows.labels,
            rows.record_type, rows.fields_type, rows.v,
        )  # fmt: skip
    if isinstance(rows, Combined):
        nc = len(rows.cols)
        head = idx < nc
        cols = with_times(rows.cols, idx[head], ts[head]) if head.any() else rows.cols
        others = with_times(rows.others, idx[~head] - nc, ts[~head]) if not head.all() else rows.others
        return Combined(cols, list(others))  # type: ignore[arg-type]
    out = list(rows)
    for i, t in zip(idx.tolist(), ts.tolist()):
        out[i] = msgspec.structs.replace(out[i], ts=t)
    return out


def times(rows: Sequence[TelemetryRecord]) -> np.ndarray:
    """Every row's event time, as an array."""
    if isinstance(rows, (DcgmColumns, Combined)):
        return rows.ts
    return np.fromiter((r.ts for r in rows), np.float64, len(rows))


def hosts(rows: Sequence[TelemetryRecord]) -> list[str]:
    """Every row's host."""
    if isinstance(rows, (DcgmColumns, Combined)):
        return rows.hosts
    return [r.host for r in rows]


class Batches(Sequence[TelemetryRecord]):
    """Rows of several batches one after another, each batch kept in its shape (what a host
    stage forwards: ``EngineOutput.forwarded``), so columns handed on stay columns.

    >>> from pipeline.schema import dcgm
    >>> b = Batches()
    >>> b.add([dcgm(1.0, "a", 0, {})]); b.add([]); b.add([dcgm(2.0, "b", 0, {})])
    >>> len(b), [r.host for r in b], len(b.parts)
    (2, ['a', 'b'], 2)
    """

    def __init__(self, parts: Iterable[Sequence[TelemetryRecord]] = ()) -> None:
        self.parts: list[Sequence[TelemetryRecord]] = [p for p in parts if len(p)]

    def add(self, rows: Sequence[TelemetryRecord]) -> None:
        """One more batch's rows (an empty one is not kept)."""
        if len(rows):
            self.parts.append(rows)

    def joined(self) -> Sequence[TelemetryRecord]:
        """Every part's rows as one batch (``concat``: columns stay columns)."""
        return concat(self.parts)[0]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return list(self)[i]
        i = int(i)
        if i < 0:
            i += len(self)
        for p in self.parts:
            if i < len(p):
                return p[i]
            i -= len(p)
        raise IndexError("Batches index out of range")

    def __iter__(self) -> Any:
        for p in self.parts:
            yield from p
