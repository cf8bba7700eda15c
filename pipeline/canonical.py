"""The fleet stage's canonical input order (docs/architecture.md §8): released records sorted by
``record_identity`` -- event time, host, kind, GPU, link, communicator, rank, collective,
sequence number -- so that GPU ids, tick rows and every model's learning order are the same
whichever host-stage task forwarded what first, and a record forwarded twice is dropped. Two
records of one identity that differ otherwise (one GPU's second from two producers, its DCGM
exporter and its kernel-log reader; an NCCL Prometheus file's size buckets of one collective)
are two records, both kept, as a host-stage engine keeps them, in ``repeat_key`` order.

``canonical_order`` computes that order as arrays (``SortColumns``: what the fleet topic's
columnar body carries), not as Python tuples compared one by one.

>>> from pipeline.schema import dcgm
>>> recs = [dcgm(2.0, "b", 0, {}), dcgm(1.0, "a", 0, {})]
>>> canonical_order(recs, np.array([2.0, 1.0]))
([1, 0], 0)
"""

from __future__ import annotations

import operator
from typing import Any, Sequence, cast

import msgspec
import numpy as np

from pipeline import rows
from pipeline.schema import DcgmSample, NcclRecord, ProgressRecord, TelemetryRecord


def sample_values(r: DcgmSample) -> tuple:
    """A DCGM sample's values present, by name: with ``record_identity``, what makes a repeat
    (NaN and unset are both absent, as a columnar row leaves them out).

    >>> from pipeline.schema import dcgm
    >>> sample_values(dcgm(1.0, "a", 0, {"gpu_temp": 50, "power_usage": float("nan")}))
    (('DCGM_FI_DEV_GPU_TEMP', 50.0),)
    """
    # to_builtins leaves the unset fields out (the struct omits defaults), in C.
    return tuple(sorted((k, v) for k, v in msgspec.to_builtins(r.fields).items() if v is not None and v == v))


def repeat_key(r: Any) -> Any:
    """What a record of a shared ``record_identity`` must also share to be a repeat of another:
    a DCGM sample's values (``sample_values``), any other record's whole content."""
    if isinstance(r, DcgmSample):
        return sample_values(r)
    return msgspec.json.encode(r)


def record_identity(r: Any) -> tuple:
    """The canonical sort key (and identity) of a record: event time first, so sorting each
    released slice and concatenating gives the order of sorting them all at once."""
    if isinstance(r, NcclRecord):
        return (r.ts, r.host, 1, -1 if r.gpu is None else r.gpu, -1, r.comm, r.rank, r.coll, r.seq or 0)
    if isinstance(r, ProgressRecord):
        return (r.ts, r.host, 2, -1 if r.gpu is None else r.gpu, -1, _comm_key(r), r.rank, r.state, r.seq or 0)
    return (r.ts, r.host, 0, r.gpu, -1 if r.link is None else r.link, "", 0, "", 0)


_HOST = operator.attrgetter("host")
_COMM, _COLL, _RANK, _SEQ = map(operator.attrgetter, ("comm", "coll", "rank", "seq"))


def _codes(values: list[Any]) -> np.ndarray:
    """Each value's rank among the distinct ones: sorting the codes sorts the values."""
    rank = {v: i for i, v in enumerate(sorted(set(values)))}
    return np.fromiter(map(rank.__getitem__, values), np.int64, len(values))


def _coll_or_state(r: Any) -> str:
    return r.state if isinstance(r, ProgressRecord) else r.coll


def _comm_key(r: Any) -> str:
    """An NCCL record's communicator; a progress record's job and communicator (two jobs' ranks
    share PG ids: both have a default PG "0")."""
    if isinstance(r, ProgressRecord):
        return f"{r.job or ''}\x00{r.comm or ''}"
    return r.comm


class SortColumns:
    """The columns of ``record_identity`` that a record's kind does not decide by itself, for a
    batch of records: kind (0 DCGM, 1 NCCL, 2 collective progress), host (an index into
    ``hosts``), GPU (-1: none) and link (-1: none). The fleet topic's columnar body carries them
    (``pipeline.service.forwarded``), so records from it sort without a Python step per DCGM
    record; ``of`` reads them off records (the in-process stage's input).

    >>> from pipeline.schema import dcgm
    >>> c = SortColumns.of([dcgm(1.0, "b", 3, {}), dcgm(1.0, "a", 0, {}, link=2)])
    >>> (c.hosts, c.host.tolist(), c.gpu.tolist(), c.link.tolist())
    (['a', 'b'], [1, 0], [3, 0], [-1, 2])
    """

    __slots__ = ("kind", "host", "hosts", "gpu", "link")

    def __init__(self, kind: np.ndarray, host: np.ndarray, hosts: list[str], gpu: np.ndarray, link: np.ndarray) -> None:
        self.kind, self.host, self.hosts, self.gpu, self.link = kind, host, hosts, gpu, link

    def __len__(self) -> int:
        return len(self.kind)

    @staticmethod
    def of(records: Sequence[TelemetryRecord]) -> "SortColumns":
        """The columns of ``records``, read one record at a time (hosts coded by rank)."""
        n = len(records)
        types = list(map(type, records))
        nccl_types = {t for t in set(types) if issubclass(t, (NcclRecord, ProgressRecord))}
        is_nccl = np.fromiter(map(nccl_types.__contains__, types), bool, n)
        kind = is_nccl.astype(np.int64)
        progress = {t for t in nccl_types if issubclass(t, ProgressRecord)}  # the decoder's subclasses too
        kind[np.fromiter(map(progress.__contains__, types), bool, n)] = 2
        names = list(map(_HOST, records))
        hosts = sorted(set(names))
        rank = {h: i for i, h in enumerate(hosts)}
        host = np.fromiter(map(rank.__getitem__, names), np.int64, n)
        gpu = np.full(n, -1, np.int64)
        link = np.full(n, -1, np.int64)
        nccl_idx = np.flatnonzero(is_nccl)
        dcgm_idx = np.flatnonzero(~is_nccl)
        if len(dcgm_idx):
            d = cast("list[DcgmSample]", [records[i] for i in dcgm_idx.tolist()] if len(nccl_idx) else records)
            gpu[dcgm_idx] = np.fromiter((r.gpu for r in d), np.int64, len(d))
            link[dcgm_idx] = np.fromiter((-1 if r.link is None else r.link for r in d), np.int64, len(d))
        if len(nccl_idx):
            nr = cast("list[NcclRecord]", [records[i] for i in nccl_idx.tolist()])
            gpu[nccl_idx] = np.fromiter((-1 if r.gpu is None else r.gpu for r in nr), np.int64, len(nr))
        return SortColumns(kind, host, hosts, gpu, link)

    def take(self, sel: np.ndarray) -> "SortColumns":
        return SortColumns(self.kind[sel], self.host[sel], self.hosts, self.gpu[sel], self.link[sel])

    @staticmethod
    def concat(parts: Sequence["SortColumns"]) -> "SortColumns":
        """One batch of ``parts`` in order, its hosts coded by rank among all of theirs (a
        table lookup per part, not a step per record)."""
        hosts = sorted(set().union(*(p.hosts for p in parts)))
        rank = {h: i for i, h in enumerate(hosts)}
        codes = [np.fromiter(map(rank.__getitem__, p.hosts), np.int64, len(p.hosts))[p.host] for p in parts]
        return SortColumns(
            np.concatenate([p.kind for p in parts]),
            np.concatenate(codes) if codes else np.empty(0, np.int64),
            hosts,
            np.concatenate([p.gpu for p in parts]),
            np.concatenate([p.link for p in parts]),
        )


def canonical_order(
    records: Sequence[TelemetryRecord], ts: np.ndarray, cols: SortColumns | None = None
) -> tuple[list[int], int]:
    """The indices of ``records`` in ``record_identity`` order, each identity once (the first
    fed of records forwarded twice: one identity and ``repeat_key``), and how many were dropped
    as such: the sort as arrays,
    not as Python tuples compared one by one (the fleet stage's cost per record). ``cols``: the
    records' ``SortColumns`` when the caller has them (read off the records otherwise); only
    the NCCL and progress records are then read, for their communicator, rank, collective and
    sequence number: an attribute at a time over the list of them (``rows.records_at``).

    >>> from pipeline.schema import dcgm
    >>> recs = [dcgm(2.0, "b", 0, {}), dcgm(1.0, "b", 1, {}), dcgm(1.0, "a", 3, {}), dcgm(2.0, "b", 0, {})]
    >>> canonical_order(recs, np.array([r.ts for r in recs]))
    ([2, 1, 0], 1)
    """
    n = len(records)
    if cols is None:
        cols = SortColumns.of(records)
    kind, gpu, link = cols.kind, cols.gpu, cols.link
    # Codes that sort as the host names do, whatever order the table is in.
    table = np.argsort(np.argsort(np.array(cols.hosts, dtype=object), kind="stable"), kind="stable")
    host = table[cols.host] if len(cols.hosts) else cols.host
    comm = np.zeros(n, np.int64)
    rank = np.zeros(n, np.int64)
    coll = np.zeros(n, np.int64)
    seq = np.zeros(n, np.int64)
    nccl_idx = np.flatnonzero(kind > 0)
    if len(nccl_idx):
        # NCCL and progress records: a progress record's state stands where a collective is.
        nr = cast("list[NcclRecord]", rows.records_at(records, nccl_idx))
        if all(issubclass(t, NcclRecord) for t in set(map(type, nr))):
            # NCCL records only (progress records come a few at a time): read in C.
            comms, colls = list(map(_COMM, nr)), list(map(_COLL, nr))
        else:
            comms, colls = [_comm_key(r) for r in nr], [_coll_or_state(r) for r in nr]
        # A DCGM record's communicator and collective are "" (record_identity): code 0 of any
        # set of names that holds "", below every other name.
        comm[nccl_idx] = _codes([""] + comms)[1:]
        coll[nccl_idx] = _codes([""] + colls)[1:]
        rank[nccl_idx] = np.fromiter(map(_RANK, nr), np.int64, len(nr))
        seqs = list(map(_SEQ, nr))
        if None in seqs:
            seqs = [s or 0 for s in seqs]
        try:
            seq[nccl_idx] = np.fromiter(seqs, np.int64, len(nr))
        except OverflowError:
            # Beyond an int64 (the decoder refuses such a record; one built in process may
            # still carry it): its rank among the batch's sorts the same.
            seq[nccl_idx] = _codes(seqs)
    # Without NCCL or progress records their four columns are all 0: no key of the sort.
    keys = (seq, coll, rank, comm, link, gpu, kind, host, ts) if len(nccl_idx) else (link, gpu, host, ts)
    order = np.lexsort(keys)  # stable: of records forwarded twice, the first fed comes first
    if n > 1:
        same = np.ones(n - 1, bool)
        for col in keys:
            sc = col[order]
            same &= sc[1:] == sc[:-1]
        if same.any():
            _apart(records, order, same)
            keep = np.ones(n, bool)
            keep[1:] = ~same
            return order[keep].tolist(), int(same.sum())
    return order.tolist(), 0


def _apart(records: Sequence[TelemetryRecord], order: np.ndarray, same: np.ndarray) -> None:
    """Within each run of one identity (``same[i]``: sorted record ``i + 1`` has ``i``'s), keep
    one record per ``repeat_key`` -- the first fed; the others are repeats -- and put the kept
    ones in ``repeat_key`` order, so that two sources of one second reach the models in one
    order whichever was forwarded first: ``order`` and ``same`` are rewritten to say so. A
    Python step per record of a shared identity only, which a repeat or a second source is."""
    idx = np.flatnonzero(same)
    pos = np.unique(np.concatenate([idx, idx + 1]))
    values = dict(zip(pos.tolist(), map(repeat_key, rows.records_at(records, order[pos]))))
    runs: list[list[int]] = []
    for i in idx.tolist():
        if runs and runs[-1][-1] == i:
            runs[-1].append(i + 1)
        else:
            runs.append([i, i + 1])
    for run in runs:
        first: dict[Any, int] = {}
        again: list[int] = []
        for p in run:
            if values[p] in first:
                again.append(p)
            else:
                first[values[p]] = p
        kept = [first[k] for k in sorted(first)]
        s, e = run[0], run[-1]
        order[s : e + 1] = order[kept + again]
        same[s:e] = True
        same[s : s + len(kept) - 1] = False
