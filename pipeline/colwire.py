"""The columnar telemetry message: one host's DCGM samples as arrays (docs/architecture.md §7).

A per-host message is a JSON array of records, or, when its Kafka record carries the header
``content-type: application/x-gpuwarden-cols; v=1``, this encoding: a msgpack map of the host,
the rows' event times, GPU indices and links as little-endian arrays, the field names once, and
a float64 value matrix with NaN where a sample has no value. The decoder turns it into the
engine's columns with no Python object per value (``pipeline/decode.py``); JSON stays the
format of every producer that sets no header.

The encoder writes a message only for records it can carry exactly (DCGM records of one host
and one schema version, numbers that a float64 or int64 holds, string labels); anything else is
JSON (``encode_dcgm`` returns None), so a record decodes to the same alerts and dead letters
whichever encoding carried it. The parser trusts nothing: every declared length is checked
against the bytes before an array is viewed, arrays come from raw bytes with an explicit dtype
and shape, and the sizes are bounded (``MAX_ROWS``, ``MAX_COLUMNS``, ``MAX_NAME``).
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence, cast

import msgspec
import numpy as np

from pipeline.rows import NO_LINK, relayout
from pipeline.schema import SCHEMA_VERSION, DcgmJobLabels

CONTENT_TYPE = "content-type"
#: The header value of a version-1 columnar message.
COLUMNAR_V1 = b"application/x-gpuwarden-cols; v=1"
_PREFIX = b"application/x-gpuwarden-cols"
FORMAT_VERSION = 1
MAX_ROWS = 1 << 16  # rows of one message: a host's GPUs and links times a backlog's intervals
MAX_COLUMNS = 1024  # field names of one message: the catalog has ~140 spellings
MAX_DISTINCT = 4096  # distinct models or label sets in one message
MAX_NAME = 128  # characters of a field name: a DCGM name has under 64, and the layouts are cached
_INT64 = (-(1 << 63), (1 << 63) - 1)
_F8, _I8, _I4 = np.dtype("<f8"), np.dtype("<i8"), np.dtype("<i4")


class ColumnsError(ValueError):
    """A columnar message that cannot be read: its dead letter's detail."""


class _Wire(msgspec.Struct, kw_only=True):
    """The msgpack map on the wire (every array little-endian, ``n`` rows)."""

    cv: int  # this encoding's version
    v: int = SCHEMA_VERSION  # the record schema version of every row
    host: str
    n: int
    ts: bytes  # float64 (n,)
    gpu: bytes  # int64 (n,)
    link: bytes | None = None  # int64 (n,), NO_LINK: no link; None: no row has one
    fields: list[str] = []
    values: bytes = b""  # float64 (n, len(fields)) row-major, NaN: not reported
    models: list[str] = []
    model: bytes | None = None  # int32 (n,) index into models, -1: none
    uuids: list[str | None] | None = None
    labels: list[dict[str, str]] = []
    label: bytes | None = None  # int32 (n,) index into labels, -1: none


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Wire)
#: A row without labels, as the JSON decoder keeps one.
NO_LABELS = DcgmJobLabels()


def job_labels(labels: list[dict[str, str]]) -> list[Any]:
    """Each label set as the decoder keeps it (``DcgmJobLabels``: the job labels only)."""
    return [msgspec.convert(d, DcgmJobLabels) for d in labels]


def is_columnar(headers: Sequence[tuple[str, bytes]] | None) -> bool | None:
    """Whether a message's headers say columnar (True), say another gpuwarden encoding
    (None: a version this build does not read), or say nothing of it (False: JSON).

    >>> is_columnar([("content-type", COLUMNAR_V1)]), is_columnar(None)
    (True, False)
    """
    for name, value in headers or ():
        if name.lower() == CONTENT_TYPE:
            if value == COLUMNAR_V1:
                return True
            # A Kafka header's value is nullable: None says nothing of the encoding.
            if isinstance(value, (bytes, bytearray, memoryview)) and bytes(value).startswith(_PREFIX):
                return None
    return False


def _finite_int(x: Any) -> bool:
    return type(x) is int and _INT64[0] <= x <= _INT64[1]


def encode_dcgm(records: Sequence[dict[str, Any] | msgspec.Struct]) -> bytes | None:
    """One host's records as a columnar message, or None where JSON must carry them (a record
    that is not DCGM, hosts or versions that differ, a value no float64/int64 holds exactly,
    a field or label that is not a number or a string).

    >>> from pipeline.schema import dcgm
    >>> b = encode_dcgm([dcgm(1764403200.0, "h1", 0, {"gpu_temp": 71})])
    >>> parse(b, ("DCGM_FI_DEV_GPU_TEMP",)).values.tolist()
    [[71.0]]
    """
    if not records or len(records) > MAX_ROWS:
        return None
    rows = [r if isinstance(r, dict) else msgspec.to_builtins(r) for r in records]
    first = rows[0]
    host, v = first.get("host"), first.get("v", SCHEMA_VERSION)
    if not isinstance(host, str) or not _finite_int(v):
        return None
    n = len(rows)
    ts = np.empty(n, _F8)
    gpu = np.empty(n, _I8)
    link = np.full(n, NO_LINK, _I8)
    names: dict[str, int] = {}
    cells: list[tuple[int, int, float]] = []
    models: dict[str, int] = {}
    model = np.full(n, -1, _I4)
    uuids: list[str | None] = []
    labelsets: dict[tuple[tuple[str, str], ...], int] = {}
    label = np.full(n, -1, _I4)
    for i, r in enumerate(rows):
        if r.get("kind") != "dcgm" or r.get("host") != host or r.get("v", SCHEMA_VERSION) != v:
            return None
        t, g, lk, m, u = r.get("ts"), r.get("gpu"), r.get("link"), r.get("model"), r.get("uuid")
        if type(t) is int and abs(t) < 2**53:
            t = float(t)
        if (
            type(t) is not float
            or not math.isfinite(t)
            or not _finite_int(g)
            or not (lk is None or (_finite_int(lk) and lk != NO_LINK))
        ):
            return None
        if not (m is None or isinstance(m, str)) or not (u is None or isinstance(u, str)):
            return None
        ts[i], gpu[i] = t, cast(int, g)
        if lk is not None:
            link[i] = int(lk)
        if m is not None:
            model[i] = models.setdefault(m, len(models))
        uuids.append(u)
        fields = r.get("fields", {})
        if not isinstance(fields, dict):
            return None
        for name, val in fields.items():
            if type(val) is int and abs(val) <= 2**53:
                val = float(val)
            # NaN would read as "not reported" and Inf, a bool or a text JSON tells apart from it.
            if type(val) is not float or not math.isfinite(val):
                return None
            cells.append((i, names.setdefault(name, len(names)), val))
        lab = r.get("labels")
        if lab:
            if not isinstance(lab, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in lab.items()):
                return None
            label[i] = labelsets.setdefault(tuple(lab.items()), len(labelsets))
    if len(names) > MAX_COLUMNS or len(models) > MAX_DISTINCT or len(labelsets) > MAX_DISTINCT:
        return None
    # A name the reader refuses (not text, or long) goes as JSON, which skips a name nobody reads.
    if not all(isinstance(name, str) and len(name) <= MAX_NAME for name in names):
        return None
    values = np.full((n, len(names)), np.nan, _F8)
    if cells:
        ri, ci, vals = zip(*cells)
        values[list(ri), list(ci)] = vals
    wire = _Wire(
        cv=FORMAT_VERSION,
        v=v,
        host=host,
        n=n,
        ts=ts.tobytes(),
        gpu=gpu.tobytes(),
        link=link.tobytes() if (link != NO_LINK).any() else None,
        fields=list(names),
        values=values.tobytes(),
        models=list(models),
        model=model.tobytes() if models else None,
        uuids=uuids if any(u is not None for u in uuids) else None,
        labels=[dict(k) for k in labelsets],
        label=label.tobytes() if labelsets else None,
    )
    try:
        return _encoder.encode(wire)
    except UnicodeEncodeError:  # a lone surrogate in a name: JSON escapes it, msgpack cannot
        return None


@dataclass
class Columns:
    """One columnar message parsed: ``values`` has one column per name the reader asked for."""

    v: int
    host: str
    ts: np.ndarray  # float64 (n,)
    gpu: np.ndarray  # int64 (n,)
    link: np.ndarray | None  # int64 (n,), NO_LINK: none
    values: np.ndarray  # float64 (n, len(names)), writable
    models: list[str]
    model: np.ndarray | None  # int32 (n,) into models, -1: none
    uuids: list[str | None] | None
    labels: list[dict[str, str]]
    label: np.ndarray | None  # int32 (n,) into labels, -1: none

    def __len__(self) -> int:
        return len(self.ts)


def _array(raw: bytes, dtype: np.dtype, n: int, what: str) -> np.ndarray:
    if len(raw) != n * dtype.itemsize:
        raise ColumnsError(f"{what}: {len(raw)} bytes for {n} rows of {dtype.itemsize}")
    return np.frombuffer(raw, dtype)


def _rows_of(raw: bytes | None, n: int, table: list[Any], none: Any, what: str) -> list[Any]:
    """Each row's entry of ``table`` by the int32 indices in ``raw`` (-1: ``none``)."""
    if raw is None:
        return [none] * n
    if len(raw) != 4 * n:
        raise ColumnsError(f"{what}: {len(raw)} bytes for {n} rows of 4")
    # A tuple of Python ints: a message has a few rows, where numpy's per-call cost dominates.
    idx = struct.unpack(f"<{n}i", raw)
    if idx and not (-1 <= min(idx) and max(idx) < len(table)):
        raise ColumnsError(f"{what}: an index outside -1..{len(table) - 1}")
    if len(table) == 1 and -1 not in idx:  # the usual message: one model, one label set
        return [table[0]] * n
    return [table[i] if i >= 0 else none for i in idx]


@functools.lru_cache(maxsize=256)
def _distinct(fields: tuple[str, ...]) -> bool:
    """No name twice (cached: a producer sends the same field list in every message)."""
    return len(set(fields)) == len(fields)


@dataclass
class Part:
    """One columnar message read and checked for shape: its arrays still bytes (a batch's are
    joined and viewed once), the per-row models and label sets expanded."""

    wire: _Wire
    n: int
    fields: tuple[str, ...]
    models: list[str | None]
    labels: list[Any]  # DcgmJobLabels

    def __len__(self) -> int:
        return self.n


def read(payload: bytes) -> Part:
    """A columnar message checked for shape; raises ``ColumnsError`` for anything but a
    well-formed message (every declared length against its bytes, every index in its table)."""
    try:
        w = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise ColumnsError(f"not a columnar message: {e}"[:200]) from None
    if w.cv != FORMAT_VERSION:
        raise ColumnsError(f"encoding version {w.cv} (this build reads {FORMAT_VERSION})")
    if not _finite_int(w.v):  # the rows' version column is int64; the encoder writes no other
        raise ColumnsError(f"schema version {w.v} outside int64")
    n, k = w.n, len(w.fields)
    if not 0 <= n <= MAX_ROWS:
        raise ColumnsError(f"{n} rows (0..{MAX_ROWS})")
    if k > MAX_COLUMNS or len(w.models) > MAX_DISTINCT or len(w.labels) > MAX_DISTINCT:
        raise ColumnsError(f"more than {MAX_COLUMNS} fields or {MAX_DISTINCT} models or label sets")
    # Before the cached checks: a cached layout keeps its names alive, so their size is bounded.
    if w.fields and max(map(len, w.fields)) > MAX_NAME:  # map in C: this runs for every message
        raise ColumnsError(f"a field name over {MAX_NAME} characters")
    fields = tuple(w.fields)
    if not _distinct(fields):
        raise ColumnsError("a field named twice")
    if w.uuids is not None and len(w.uuids) != n:
        raise ColumnsError(f"{len(w.uuids)} uuids for {n} rows")
    for what, raw in (("ts", w.ts), ("gpu", w.gpu), ("link", w.link)):
        if raw is not None and len(raw) != 8 * n:
            raise ColumnsError(f"{what}: {len(raw)} bytes for {n} rows of 8")
    if len(w.values) != n * k * 8:
        raise ColumnsError(f"values: {len(w.values)} bytes for {n} rows of {k} fields")
    models = _rows_of(w.model, n, w.models, None, "model")
    # As the JSON decoder keeps them: the job labels only (DcgmJobLabels), one per distinct set.
    labels = _rows_of(w.label, n, job_labels(w.labels) if w.labels else [], NO_LABELS, "label")
    return Part(w, n, fields, models, labels)


def records(payload: bytes) -> list[dict[str, Any]]:
    """A columnar message's rows as the JSON records ``encode_dcgm`` took (what ``gpuwarden
    record`` writes of one): a value a float64 holds as a whole number is written as an integer,
    as producers write them. Raises ``ColumnsError`` for anything but a well-formed message.

    >>> from pipeline.schema import dcgm
    >>> records(encode_dcgm([dcgm(1764403200.0, "h1", 0, {"gpu_temp": 71})]))[0]["fields"]
    {'DCGM_FI_DEV_GPU_TEMP': 71}
    """
    p = read(payload)
    w = p.wire
    ts = np.frombuffer(w.ts, _F8).tolist()
    gpu = np.frombuffer(w.gpu, _I8).tolist()
    link = None if w.link is None else np.frombuffer(w.link, _I8).tolist()
    values = np.frombuffer(w.values, _F8).reshape(p.n, len(p.fields))
    models = _rows_of(w.model, p.n, w.models, None, "model")
    labels = _rows_of(w.label, p.n, w.labels, None, "label")
    out: list[dict[str, Any]] = []
    for i in range(p.n):
        rec: dict[str, Any] = {"kind": "dcgm", "v": w.v, "ts": ts[i], "host": w.host, "gpu": gpu[i]}
        if link is not None and link[i] != NO_LINK:
            rec["link"] = link[i]
        if models[i] is not None:
            rec["model"] = models[i]
        if w.uuids is not None and w.uuids[i] is not None:
            rec["uuid"] = w.uuids[i]
        row = values[i]
        rec["fields"] = {
            p.fields[j]: int(x) if x.is_integer() and abs(x) <= 2**53 else x
            for j, x in zip(np.flatnonzero(~np.isnan(row)).tolist(), row[~np.isnan(row)].tolist())
        }
        if labels[i] is not None:
            rec["labels"] = dict(labels[i])
        out.append(rec)
    return out


def column(parts: Sequence[Part], name: str, dtype: np.dtype, fill: bytes | None = None) -> np.ndarray:
    """One array of the parts (``ts``, ``gpu``, ``link``) joined: one view of the joined bytes.
    ``fill``: an 8-byte cell for a part without that array."""
    raws = [getattr(p.wire, name) if getattr(p.wire, name) is not None else (fill or b"") * p.n for p in parts]
    # A copy: writable, as the engine's arrays are, and not holding the message's bytes alive.
    return np.frombuffer(raws[0] if len(raws) == 1 else b"".join(raws), dtype).copy()


_NO_LINK_CELL = np.array([NO_LINK], _I8).tobytes()


def links(parts: Sequence[Part]) -> np.ndarray:
    """The parts' link column joined, ``NO_LINK`` where a part has none."""
    return column(parts, "link", _I8, _NO_LINK_CELL)


def values_of(parts: Sequence[Part], names: tuple[str, ...]) -> np.ndarray:
    """The parts' value matrices stacked and laid out as ``names`` (``rows.relayout``). A new,
    writable array."""
    n = sum(p.n for p in parts)
    layouts = {p.fields for p in parts}
    if len(layouts) == 1:  # the usual batch: one producer's layout, one view of the joined bytes
        (f,) = layouts
        given = np.frombuffer(b"".join(p.wire.values for p in parts), _F8).reshape(n, len(f))
        out = relayout(given, f, names)
        return out.copy() if out is given else out
    # Producers of several layouts: each part laid out alone, then stacked (a new array).
    each = [relayout(np.frombuffer(p.wire.values, _F8).reshape(p.n, len(p.fields)), p.fields, names) for p in parts]
    return np.concatenate(each)


def parse(payload: bytes, names: Sequence[str]) -> Columns:
    """A columnar message's columns, its values laid out as ``names``; raises ``ColumnsError``
    for anything but a well-formed message."""
    p = read(payload)
    w = p.wire
    return Columns(
        v=w.v,
        host=w.host,
        ts=column([p], "ts", _F8),
        gpu=column([p], "gpu", _I8),
        link=None if w.link is None else column([p], "link", _I8),
        values=values_of([p], tuple(names)),
        models=w.models,
        model=None if w.model is None else np.frombuffer(w.model, _I4),
        uuids=w.uuids,
        labels=w.labels,
        label=None if w.label is None else np.frombuffer(w.label, _I4),
    )
