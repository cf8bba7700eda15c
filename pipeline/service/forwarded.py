"""The records the host stage forwards to ``<prefix>.fleet``, as columns (docs/architecture.md §8,
"The forwarded records' body").

A records message's body is a msgpack map (``Columns``): the DCGM records as columns, only the
fields the fleet stage's engine reads (``Engine.decode_fields``) and a column only when a record
of the message reports it, values as one float64 matrix (NaN: not reported); their hosts, GPU
models and job labels as tables with an index per record; NCCL and progress records whole. The
fleet stage reads the columns as arrays and sorts by them (``pipeline.canonical.SortColumns``)
without a Python step per value, and hands its engine the rows as columns (``pipeline.rows``):
no object is made per DCGM row or value.

Reading is bounded: every column's length is checked against the row count it declares, and
that count against ``MAX_FORWARD``, before an array is made of it; arrays are made from the
bytes with an explicit dtype and shape, never from anything else (no pickle).
"""

from __future__ import annotations

import math
import operator
import struct
from itertools import compress, starmap
from typing import Any, Callable, NamedTuple, Sequence, Union, cast

import msgspec
import numpy as np
from msgspec.structs import astuple

from pipeline import rows
from pipeline.catalog import FIELDS
from pipeline.recordchecks import MAX_GPU_INDEX, MAX_LINK_INDEX
from pipeline.rows import NO_LINK, Combined, DcgmColumns, relayout
from pipeline.schema import (
    JOB_LABELS,
    SCHEMA_VERSION,
    DcgmJobLabels,
    DcgmSample,
    NcclRecord,
    ProgressRecord,
    TelemetryRecord,
    dcgm_fields_type,
    dcgm_record_type,
)
from pipeline.canonical import SortColumns

COLUMNS_VERSION = 1
# Records per message on the fleet topic: a DCGM record is ~8 bytes a field it reports plus ~30,
# an NCCL or progress record ~300-600, so a message stays well under the broker's default 1 MiB
# limit should the topic predate ensure_topics (which gives it 8 MiB).
MAX_FORWARD = 400
_SLOT = {n: i for i, n in enumerate(FIELDS.all_names)}
_TS = operator.attrgetter("ts")
_HOST = operator.attrgetter("host")
_GPU = operator.attrgetter("gpu")
_LINK = operator.attrgetter("link")
_RANK = operator.attrgetter("rank")
_MODEL = operator.attrgetter("model")
_LABELS = operator.attrgetter("labels")
_FIELDS = operator.attrgetter("fields")
_F64 = np.dtype("<f8")
_I32 = np.dtype("<i4")
_U32 = np.dtype("<u4")


class Columns(msgspec.Struct):
    """A records message's body (``cols``: the encoding's version). ``n`` DCGM records: ``ts``
    (float64), ``host``, ``model`` and ``label`` (uint32 indices into ``hosts``, ``models`` and
    ``labels``), ``gpu`` and ``link`` (int32; link -1: none), ``values`` (float64, ``n`` rows of
    ``len(fields)``, row-major; NaN: not reported), every array little-endian bytes; ``other``:
    the NCCL and progress records, whole. A record's index in the message (a dead letter's
    ``#i``) counts the DCGM rows first, then ``other``."""

    cols: int
    n: int
    ts: bytes
    host: bytes
    hosts: list[str]
    gpu: bytes
    link: bytes
    model: bytes
    models: list[Union[str, None]]
    label: bytes
    labels: list[Union[DcgmJobLabels, None]]
    fields: list[str]
    values: bytes
    other: list[Union[NcclRecord, ProgressRecord]]


class Malformed(ValueError):
    """A body that decodes but does not hold what it declares: its ``kind`` (``"version"``,
    ``"size"`` or ``"shape"``: ``bad_envelope``, ``too_large`` or ``wrong_type`` in
    ``FleetTask.check``) and the detail."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def _table(values: list[Any]) -> tuple[list[Any], np.ndarray]:
    """The distinct ``values`` in first-seen order and each value's index among them."""
    index = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return list(index), np.fromiter(map(index.__getitem__, values), np.uint32, len(values))


def _label_key(lab: Any) -> tuple | None:
    """Job labels as a hashable tuple (``JOB_LABELS`` order): a decoder's ``DcgmJobLabels`` or a
    record's whole ``labels`` dict (a record built in process)."""
    if lab is None:
        return None
    if isinstance(lab, dict):
        return tuple(lab.get(k) for k in JOB_LABELS)
    return astuple(lab)


def _double(v: Any) -> float:
    try:
        return float(v)
    except (OverflowError, TypeError, ValueError):
        return math.inf if isinstance(v, int) and v > 0 else (-math.inf if isinstance(v, int) else math.nan)


class Encoder:
    """Forwarded records -> a ``Columns`` body, keeping the DCGM fields in ``fields`` (the fleet
    engine's ``decode_fields``; None: every catalog name).

    >>> from pipeline.schema import dcgm
    >>> enc = Encoder(("DCGM_FI_DEV_GPU_TEMP",))
    >>> body = enc.encode([dcgm(1764403200.0, "n1", 0, {"gpu_temp": 71, "power": 500})])
    >>> cols = msgspec.msgpack.decode(body, type=Columns)
    >>> (cols.n, cols.hosts, cols.fields, np.frombuffer(cols.values, "<f8").tolist())
    (1, ['n1'], ['DCGM_FI_DEV_GPU_TEMP'], [71.0])
    """

    def __init__(self, fields: Sequence[str] | None = None) -> None:
        names = FIELDS.all_names if fields is None else fields
        self.names = tuple(sorted((n for n in set(names) if n in _SLOT), key=_SLOT.__getitem__))
        getter_names = self.names if len(self.names) > 1 else [*self.names, *self.names]
        self._get = operator.attrgetter(*getter_names) if self.names else None
        self._pack = struct.Struct(f"<{len(getter_names)}d").pack if self.names else None
        self._enc = msgspec.msgpack.Encoder()
        self._layouts: dict[type, tuple[Callable[..., bytes], np.ndarray]] = {}

    def encode(self, records: Sequence[TelemetryRecord]) -> bytes:
        """One message's body for ``records`` (at most ``MAX_FORWARD`` of them): a list of
        records, or rows as columns (``pipeline.rows``), read as arrays."""
        if isinstance(records, (DcgmColumns, Combined)):
            cols, other = rows.split(records)
            if isinstance(cols, Combined):  # DCGM records of JSON messages beside the columns
                dcgm = _join(self._of_columns(cols.cols), self._of_records(list(cols.others)))
            else:
                dcgm = self._of_columns(cast(DcgmColumns, cols))
        else:
            # By type, not isinstance(): a set lookup per record, and the split in C (compress).
            types = list(map(type, records))
            kinds = set(types)
            dcgm_types = {t for t in kinds if issubclass(t, DcgmSample)}
            if len(dcgm_types) == len(kinds):
                recs, other = list(records), []
            else:
                is_dcgm = list(map(dcgm_types.__contains__, types))
                recs = list(compress(records, is_dcgm))
                other = list(compress(records, map(operator.not_, is_dcgm)))
            dcgm = self._of_records(recs)
        n = len(dcgm.ts)
        hosts, host = _table(dcgm.hosts)
        models, model = _table(dcgm.models)
        labs = dcgm.labels
        # The decoder's job labels (the service's case) turn into tuples in C.
        keys = list(map(astuple, labs)) if set(map(type, labs)) <= {DcgmJobLabels} else list(map(_label_key, labs))
        label_keys, label = _table(keys)
        labels = [None if k is None else DcgmJobLabels(**dict(zip(JOB_LABELS, k))) for k in label_keys]
        with np.errstate(invalid="ignore"):
            seen: list[bool] = np.logical_not(np.isnan(dcgm.values).all(axis=0)).tolist()
        body = Columns(
            cols=COLUMNS_VERSION,
            n=n,
            ts=dcgm.ts.astype(_F64, copy=False).tobytes(),
            host=host.tobytes(),
            hosts=hosts,
            gpu=dcgm.gpu.tobytes(),
            link=dcgm.link.tobytes(),
            model=model.tobytes(),
            models=models,
            label=label.tobytes(),
            labels=labels,
            fields=[nm for nm, s in zip(self.names, seen) if s],
            values=np.ascontiguousarray(dcgm.values[:, seen]).tobytes(),
            other=other,  # type: ignore[arg-type]  # NCCL and progress records, by the split above
        )
        return self._enc.encode(body)

    def _of_records(self, dcgm: list[Any]) -> "_Dcgm":
        """The columns of DCGM records, read record by record (in C where it can)."""
        n = len(dcgm)
        links = list(map(_LINK, dcgm))
        link = (
            np.full(n, -1, _I32)
            if links.count(None) == n
            else np.fromiter((-1 if x is None else x for x in links), _I32, n)
        )
        return _Dcgm(
            np.fromiter(map(_TS, dcgm), _F64, n),
            list(map(_HOST, dcgm)),
            list(map(_MODEL, dcgm)),
            list(map(_LABELS, dcgm)),
            np.fromiter(map(_GPU, dcgm), _I32, n),
            link,
            self._values(dcgm),
        )

    def _of_columns(self, cols: DcgmColumns) -> "_Dcgm":
        """The columns of DCGM rows that are columns already (a columnar telemetry message's):
        arrays as they are, the value matrix laid out as ``names``."""
        values = relayout(cols.values, cols.names, self.names)
        # The decoder bounds GPU and link indices far inside an int32 (MAX_GPU_INDEX, MAX_LINK_INDEX).
        link = np.where(cols.link == NO_LINK, -1, cols.link).astype(_I32)
        return _Dcgm(cols.ts, cols.hosts, cols.models, cols.labels, cols.gpu.astype(_I32), link, values)

    def _layout(self, fields_type: type) -> tuple[Callable[..., bytes], np.ndarray]:
        """For records whose ``fields`` are ``fields_type``: a packer of all its slots, and the
        positions of ``names`` among them (``KeyError`` when it lacks one)."""
        got = self._layouts.get(fields_type)
        if got is None:
            slots: tuple[str, ...] = getattr(fields_type, "__struct_fields__")
            at = {nm: i for i, nm in enumerate(slots)}
            got = (struct.Struct(f"<{len(slots)}d").pack, np.array([at[nm] for nm in self.names], np.intp))
            self._layouts[fields_type] = got
        return got

    def _values(self, dcgm: list[Any]) -> np.ndarray:
        """The value matrix of ``dcgm``, a column per name (NaN: not reported)."""
        n, k = len(dcgm), len(self.names)
        if not n or not k or self._get is None or self._pack is None:
            return np.full((n, k), np.nan)
        fields = list(map(_FIELDS, dcgm))
        types = set(map(type, fields))
        try:
            if len(types) == 1:
                # One fields type (the host decoder's): every slot of a record packed at once in C
                # (astuple), the names wanted picked from the matrix.
                pack, pick = self._layout(types.pop())
                m = np.frombuffer(b"".join(starmap(pack, map(astuple, fields))), _F64).reshape(n, -1)[:, pick]
            else:
                m = np.frombuffer(b"".join(starmap(self._pack, map(self._get, fields))), _F64).reshape(n, -1)[:, :k]
        except (AttributeError, KeyError, struct.error, OverflowError, TypeError):
            # A record decoded for another field set, or an integer past a double: field by field.
            m = np.array([[_double(getattr(f, nm, math.nan)) for nm in self.names] for f in fields], _F64)
            m = m.reshape(n, k)
        return m


class _Dcgm(NamedTuple):
    """A message's DCGM rows as the body's columns, before the tables are made."""

    ts: np.ndarray
    hosts: list[str]
    models: list[Any]
    labels: list[Any]
    gpu: np.ndarray  # int32
    link: np.ndarray  # int32, -1: none
    values: np.ndarray  # a column per ``Encoder.names``


def _join(a: _Dcgm, b: _Dcgm) -> _Dcgm:
    """``a``'s rows, then ``b``'s."""
    return _Dcgm(
        np.concatenate([a.ts, b.ts]),
        a.hosts + b.hosts,
        a.models + b.models,
        a.labels + b.labels,
        np.concatenate([a.gpu, b.gpu]),
        np.concatenate([a.link, b.link]),
        np.concatenate([a.values, b.values]),
    )


class Decoded:
    """A ``Columns`` body read: the DCGM rows' arrays and the other records, not yet checked."""

    __slots__ = (
        "n",
        "ts",
        "host",
        "hosts",
        "gpu",
        "link",
        "model",
        "models",
        "label",
        "labels",
        "fields",
        "values",
        "other",
        "other_gpu",
        "other_rank",
    )

    def __init__(self, c: Columns) -> None:
        n = c.n
        if c.cols != COLUMNS_VERSION:
            raise Malformed("version", f"forwarded records encoding {c.cols} (this build reads {COLUMNS_VERSION})")
        if not 0 <= n <= MAX_FORWARD or len(c.other) > MAX_FORWARD - n:
            raise Malformed("size", f"{n} + {len(c.other)} records; at most {MAX_FORWARD} a message")
        k = len(c.fields)
        if k > len(_SLOT) or len(set(c.fields)) != k:
            raise Malformed("shape", f"{k} field names, repeated or more than the catalog's {len(_SLOT)}")
        for name, blob, width in (
            ("ts", c.ts, 8),
            ("host", c.host, 4),
            ("gpu", c.gpu, 4),
            ("link", c.link, 4),
            ("model", c.model, 4),
            ("label", c.label, 4),
            ("values", c.values, 8 * k),
        ):
            if len(blob) != n * width:
                raise Malformed("shape", f"column {name} of {len(blob)} bytes; {n} rows need {n * width}")
        self.n, self.fields = n, c.fields
        self.other: list[NcclRecord | ProgressRecord] = list(c.other)
        self.other_gpu, self.other_rank = other_columns(self.other)
        self.ts = np.frombuffer(c.ts, _F64)
        self.gpu = np.frombuffer(c.gpu, _I32)
        self.link = np.frombuffer(c.link, _I32)
        self.values = np.frombuffer(c.values, _F64).reshape(n, k)
        # The host stage's decoder passes no other GPU or link index, and one past them would
        # go into the fleet engine and make each later snapshot of the partition unrestorable.
        if n and not (0 <= int(self.gpu.min()) and int(self.gpu.max()) <= MAX_GPU_INDEX):
            raise Malformed("shape", f"a GPU index outside 0..{MAX_GPU_INDEX}")
        if n and not (-1 <= int(self.link.min()) and int(self.link.max()) <= MAX_LINK_INDEX):
            raise Malformed("shape", f"a link index outside 0..{MAX_LINK_INDEX} (-1: none)")
        self.host, self.hosts = self._index("host", c.host, c.hosts)
        self.model, self.models = self._index("model", c.model, c.models)
        self.label, self.labels = self._index("label", c.label, c.labels)

    def _index(self, name: str, blob: bytes, table: list[Any]) -> tuple[np.ndarray, list[Any]]:
        idx = np.frombuffer(blob, _U32)
        if len(table) > self.n or (len(idx) and int(idx.max()) >= len(table)):
            raise Malformed("shape", f"column {name} indexes past its table of {len(table)}")
        return idx.astype(np.int64), table


def other_columns(records: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The GPU (-1: none) and rank columns of NCCL or progress ``records``; ``Malformed`` when one
    is past an int64: the fleet stage's canonical order holds them in int64 columns
    (``canonical_order``), and the host stage's decoder never forwards such a record.

    >>> from pipeline.schema import NcclRecord
    >>> r = NcclRecord(ts=1.0, host="h", comm="c", rank=3, nranks=4, coll="AllReduce", bytes=1, exec_time_us=1.0)
    >>> [a.tolist() for a in other_columns([r])]
    [[-1], [3]]
    """
    n = len(records)
    gpus = list(map(_GPU, records))
    try:
        gpu = (
            np.fromiter(gpus, np.int64, n)
            if gpus.count(None) == 0
            else np.fromiter((-1 if g is None else g for g in gpus), np.int64, n)
        )
        rank = np.fromiter(map(_RANK, records), np.int64, n)
    except OverflowError:
        raise Malformed("shape", "an NCCL or progress record's gpu or rank is past an int64") from None
    return gpu, rank


def check_other(records: Sequence[Any]) -> None:
    """``other_columns`` of the NCCL and progress records among ``records`` (a JSON array's),
    and its DCGM records' GPU and link indices, bounded as a columns body's are (``Decoded``)."""
    types = {t for t in set(map(type, records)) if issubclass(t, (NcclRecord, ProgressRecord))}
    if types:
        other_columns([r for r in records if type(r) in types])
    for r in records:
        if type(r) not in types:
            if not 0 <= r.gpu <= MAX_GPU_INDEX:
                raise Malformed("shape", f"a GPU index outside 0..{MAX_GPU_INDEX}")
            if r.link is not None and not 0 <= r.link <= MAX_LINK_INDEX:
                raise Malformed("shape", f"a link index outside 0..{MAX_LINK_INDEX}")


class Builder:
    """Checked columns -> the rows the fleet engine reads (``fields``: its ``decode_fields``),
    as columns: a ``rows.Combined`` of the DCGM rows (``DcgmColumns``, its value matrix laid
    out as ``fields``) and the NCCL and progress records as they came, with their
    ``SortColumns``. No object is made per DCGM row or value; a record is built for a row only
    where one is asked for (``DcgmColumns``)."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.names = tuple(fields)
        # Typed Any: made at run time with the fields' slots (and ``labels``), which mypy cannot see.
        self.record_type: Any = dcgm_record_type(self.names)
        self.fields_type: Any = dcgm_fields_type(self.names)

    def build(self, d: Decoded, keep: np.ndarray, keep_other: np.ndarray) -> tuple[Combined, SortColumns]:
        """The DCGM rows ``keep`` selects as columns, then the other records ``keep_other``
        selects; their sort columns."""
        at = np.flatnonzero(keep)
        m = len(at)
        # A field the engine does not read is left out, as the JSON decoder skips it.
        values = relayout(d.values[at], tuple(d.fields), self.names)
        host_a = d.host[at]
        link_a = d.link[at].astype(np.int64)
        link = np.where(link_a < 0, NO_LINK, link_a)
        dcgm = DcgmColumns(
            self.names,
            d.ts[at].copy(),
            [d.hosts[i] for i in host_a.tolist()],
            d.gpu[at].astype(np.int64),
            link,
            values,
            [d.models[i] for i in d.model[at].tolist()],
            [d.labels[i] for i in d.label[at].tolist()],
            self.record_type,
            self.fields_type,
            np.full(m, SCHEMA_VERSION, np.int64),
        )
        sel = np.flatnonzero(keep_other).tolist()
        other = [d.other[i] for i in sel] if len(sel) < len(d.other) else d.other
        table = list(d.hosts)
        index = {h: i for i, h in enumerate(table)}
        for r in other:
            if r.host not in index:
                index[r.host] = len(table)
                table.append(r.host)
        o = len(other)
        kind = np.zeros(m + o, np.int64)
        if o:
            progress = {t for t in set(map(type, other)) if issubclass(t, ProgressRecord)}
            kind[m:] = np.fromiter(map(progress.__contains__, map(type, other)), bool, o).astype(np.int64) + 1
        host = np.concatenate([host_a, np.fromiter((index[r.host] for r in other), np.int64, o)])
        gpu = np.concatenate([dcgm.gpu, d.other_gpu[keep_other]])
        sort_link = np.concatenate([link_a, np.full(o, -1, np.int64)])
        return Combined(dcgm, other), SortColumns(kind, host, table, gpu, sort_link)
