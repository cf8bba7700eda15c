"""Bytes -> typed telemetry records, and everything that cannot be used -> dead letters.

A message (a Kafka value or a JSONL line) holds one record object or an array of them (a host's
GPUs batched, docs/architecture.md §7). The fast path decodes it straight into Structs; only when that fails
does the slow path take the message apart record by record to say exactly what is wrong with
which one, so one poison record never costs its neighbours. Nothing here raises into the caller.

Field-level problems (blank sentinels, NaN, impossible negatives) are found later, vectorised,
when the engine turns records into columns (``pipeline.engine.frame``).
"""

from __future__ import annotations

import functools
import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence, Union, cast

import msgspec
import numpy as np

# The reason codes and origins belong to the dead letters (pipeline/deadletters.py); they are
# named here too, where the decoder's users have always found them.
from pipeline.deadletters import ENTITY_LIMIT as ENTITY_LIMIT
from pipeline.deadletters import LATE as LATE
from pipeline.deadletters import REASONS as REASONS
from pipeline import colwire, rows
from pipeline.catalog import FIELDS
from pipeline.deadletters import (
    MALFORMED_COLUMNS,
    BAD_IDENTIFIER,
    BLANK_SENTINEL,
    INTERNAL,
    MALFORMED_JSON,
    MISSING_KEY,
    NAN_FIELD,
    NAN_VALUE,
    NEGATIVE_VALUE,
    OUT_OF_RANGE,
    TOO_DEEP,
    TOO_LARGE,
    TS_OUT_OF_RANGE,
    UNKNOWN_KIND,
    UNSUPPORTED_VERSION,
    WRONG_TYPE,
    Origins,
)
from pipeline.deadletters import take_origins as take_origins

# The limits and checked types of each record kind (pipeline/recordchecks.py); the limits are
# named here too, where the decoder's users have always found them.
from pipeline.recordchecks import (
    bad_host,
    bad_identifier,
    CHECKED_BASE,
    clean_counters,
    DOUBLE_MAX,
    GPU_OK,
    HOST_OF,
    ID_OK,
    is_str,
    label_text,
    LINK_OK,
    MAX_GPU_INDEX,
    MAX_LINK_INDEX,
    MAX_SEQ,
    MODEL_OF,
    NCCL_NAMES,
    NcclChecked,
    nccl_problem,
    nic_problem,
    NicChecked,
    PROGRESS_NAMES,
    progress_problem,
    ProgressChecked,
    RAW_KEEP,
    shown,
    TS_MAX,
    TS_MIN,
)
from pipeline.recordchecks import MAX_COUNTER as MAX_COUNTER
from pipeline.recordchecks import MAX_RANKS as MAX_RANKS
from pipeline.recordchecks import MAX_NIC_COUNTERS as MAX_NIC_COUNTERS
from pipeline.recordchecks import MAX_NIC_NAME as MAX_NIC_NAME
from pipeline.recordchecks import MAX_PORT_STATE as MAX_PORT_STATE
from pipeline.recordchecks import MAX_RATE_GBPS as MAX_RATE_GBPS
from pipeline.recordchecks import MAX_NIC_PORT as MAX_NIC_PORT
from pipeline.recordchecks import MAX_ID_LEN as MAX_ID_LEN
from pipeline.recordchecks import MAX_HOST_LEN as MAX_HOST_LEN
from pipeline.schema import (
    DcgmRecord,
    DcgmSample,
    DeadLetter,
    NcclRecord,
    NicRecord,
    ProgressRecord,
    TelemetryRecord,
    dcgm_fields_type,
    dcgm_record_type,
    SCHEMA_VERSION,
)


@functools.lru_cache(maxsize=32)
def _fast_for(fields: tuple[str, ...] | None) -> msgspec.json.Decoder:
    """A decoder of one message into checked types keeping ``fields``."""
    base = DcgmRecord if fields is None else dcgm_record_type(fields)
    rec = msgspec.defstruct(
        base.__name__,
        [*CHECKED_BASE, ("gpu", GPU_OK), ("link", Optional[LINK_OK], None), ("model", Optional[ID_OK], None)],
        bases=(base,),
        tag="dcgm",
        tag_field="kind",
        kw_only=True,
        gc=False,
    )
    checked = Union[rec, NcclChecked, NicChecked, ProgressChecked]  # type: ignore[valid-type]
    one = Union[list[checked], checked]
    return msgspec.json.Decoder(one)


_TS = operator.attrgetter("ts")
# Valid host and other names a decoder remembers between batches (a few MB): a real fleet's all.
MAX_KNOWN_NAMES = 100_000
_KINDS = {"dcgm": DcgmRecord, "nccl": NcclRecord, "nic": NicRecord, "progress": ProgressRecord}


def _raw(payload: bytes | str) -> str:
    text = payload.decode("utf-8", "replace") if isinstance(payload, (bytes, bytearray)) else payload
    return text if len(text) <= RAW_KEEP else text[:RAW_KEEP] + "…"


@dataclass
class Decoded:
    # A list, or one ``rows.DcgmColumns`` for a batch of columnar messages (decode_many).
    records: Sequence[TelemetryRecord]
    origins: Sequence[str]  # a list from ``decode``, ``Origins`` from ``decode_many``
    dead: list[DeadLetter]
    # Each record's index in its message's array, -1 for a message that was one bare record
    # (``decode``; ``decode_many``'s ``Origins`` carry it): which records came in a per-host message.
    positions: list[int] = field(default_factory=list)


class Decoder:
    """Decode telemetry messages, turning every problem into a ``DeadLetter``.

    ``wall_clock``: when given (the live service), event times further than ``max_future_s``
    ahead of it or ``max_age_s`` behind it are out of range. Replay passes none: recordings are
    old by nature.

    >>> d = Decoder()
    >>> out = d.decode(b'{"kind":"dcgm","ts":1764403200,"host":"h","gpu":0,"fields":{}}', "f:1")
    >>> len(out.records), len(out.dead)
    (1, 0)
    >>> d.decode(b'{"kind":"dcgm","ts":"soon"}', "f:2").dead[0].reason
    'wrong_type'
    """

    def __init__(
        self,
        *,
        wall_clock: Callable[[], float] | None = None,
        max_future_s: float = 300.0,
        max_age_s: float = 7 * 86400.0,
        max_message_bytes: int = 8 * 1024 * 1024,
        fields: tuple[str, ...] | None = None,
    ) -> None:
        self.wall_clock = wall_clock
        self.max_future_s = max_future_s
        self.max_age_s = max_age_s
        self.max_message_bytes = max_message_bytes
        # Identifiers already found valid: a fleet has few names, so each is checked once.
        self._ok_names: set[str | None] = {None}
        self._ok_hosts: set[str] = set()
        self.set_fields(fields)

    def set_fields(self, fields: tuple[str, ...] | None) -> None:
        """Keep only these DCGM fields of each record (``None``: all the catalog knows).

        The engine reads a few dozen of the catalog's 134 spellings; decoding only those is the
        cheapest part of its hot path to cut (``Pipeline`` keeps this in step with its engine).
        Records the slow path rebuilds keep every field; both are ``DcgmSample`` instances.
        """
        self.fields = fields
        self._fast = _fast_for(fields)

    def decode_many(
        self, payloads: Sequence[bytes], origins: Sequence[str], columnar: Sequence[bool | None] | None = None
    ) -> Decoded:
        """Decode a batch of messages; the same result as ``decode`` on each, in order.

        ``columnar``: per message, what its headers say of its encoding (``colwire.is_columnar``:
        True columnar, False JSON, None a columnar version this build does not read); None: all
        JSON. A batch of columnar messages decodes to one ``rows.DcgmColumns`` as ``records``.

        The common case (every message well-formed and plausible) is the fast decoder mapped
        over the messages and one plausibility pass over the batch, without the per-message
        bookkeeping of ``decode``. Anything doubtful falls back to ``decode`` per message.
        """
        if columnar is not None and any(c is not False for c in columnar):
            return self._decode_with_columns(payloads, origins, columnar)
        n = len(payloads)
        if n > 1 and None not in payloads and max(map(len, payloads)) <= self.max_message_bytes:
            try:
                # map() keeps the loop in C. (Decoding the batch joined into one JSON array, as
                # this once did, costs a copy of every byte: measured 1-5 % slower end to end
                # with per-host messages, the same with per-GPU ones.)
                objs = list(map(self._fast.decode, payloads))
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                objs = None
            if objs is not None:
                recs: list[TelemetryRecord] = []
                sizes: list[int] = []
                for obj in objs:
                    if type(obj) is list:
                        recs.extend(obj)
                        sizes.append(len(obj))
                    else:
                        recs.append(obj)
                        sizes.append(-1)
                if self._all_plausible_many(recs) and self._names_ok(recs):
                    return Decoded(recs, Origins.of_messages(origins, sizes), [])
        out = Decoded([], [], [])
        msg: list[int] = []
        for j, (payload, origin) in enumerate(zip(payloads, origins)):
            d = self.decode(payload, origin)
            cast(list, out.records).extend(d.records)
            msg += [j] * len(d.records)
            out.positions += d.positions
            out.dead.extend(d.dead)
        out.origins = Origins(origins, np.array(msg, np.int64), np.array(out.positions, np.int64))
        return out

    # -- columnar messages (pipeline/colwire.py) ------------------------------------------

    def _decode_with_columns(
        self, payloads: Sequence[bytes], origins: Sequence[str], columnar: Sequence[bool | None]
    ) -> Decoded:
        """A batch holding columnar messages: their rows stay columns; beside JSON messages, the
        columns come first and then the JSON records (``rows.Combined``), and the origins keep
        each row's message and place, the order the engine screens them in."""
        parts: list[colwire.Part] = []
        part_msg: list[int] = []
        dead: list[DeadLetter] = []
        json_at: list[int] = []
        for j, (payload, col) in enumerate(zip(payloads, columnar)):
            if col is False:
                json_at.append(j)
                continue
            origin = origins[j]
            if payload is None:
                dead.append(
                    DeadLetter(reason=WRONG_TYPE, detail="message has no value (a Kafka tombstone?)", origin=origin)
                )
            elif col is None:
                dead.append(
                    DeadLetter(
                        reason=UNSUPPORTED_VERSION,
                        detail=f"a columnar encoding this build does not read (it reads {colwire.COLUMNAR_V1.decode()})",
                        origin=origin,
                    )
                )
            elif len(payload) > self.max_message_bytes:
                dead.append(
                    DeadLetter(
                        reason=TOO_LARGE, detail=f"{len(payload)} bytes > {self.max_message_bytes}", origin=origin
                    )
                )
            else:
                try:
                    parts.append(colwire.read(payload))
                    part_msg.append(j)
                except colwire.ColumnsError as e:
                    dead.append(DeadLetter(reason=MALFORMED_COLUMNS, detail=str(e)[:300], origin=origin))
        cols, msg, pos = self._columns(parts, part_msg, origins, dead)
        if not json_at:
            return Decoded(cols, Origins(origins, msg, pos), dead, pos.tolist())
        # Beside JSON messages: the columns first, then the JSON messages' records in message
        # order (rows.Combined); the engine ingests each part as it is.
        jd = self.decode_many([payloads[j] for j in json_at], [origins[j] for j in json_at])
        dead.extend(jd.dead)
        recs = list(jd.records)
        jo = cast(Origins, jd.origins)  # decode_many's origins: indices into the JSON messages
        all_msg = np.concatenate([msg, np.array(json_at, np.int64)[jo.msg]])
        all_pos = np.concatenate([pos, jo.pos])
        records: Sequence[TelemetryRecord] = rows.Combined(cols, recs) if len(cols) else recs
        return Decoded(records, Origins(origins, all_msg, all_pos), dead, all_pos.tolist())

    def _columns(
        self, parts: list[colwire.Part], part_msg: list[int], origins: Sequence[str], dead: list[DeadLetter]
    ) -> tuple[rows.DcgmColumns, np.ndarray, np.ndarray]:
        """The parts' rows as columns, with each row's message and position; every check the
        JSON path makes, made on the arrays, and each row that fails one a dead letter with the
        reason and detail ``_check`` gives its record."""
        names = self.fields if self.fields is not None else tuple(FIELDS.all_names)
        rtype = dcgm_record_type(names)
        ftype = dcgm_fields_type(names)
        sizes = [len(p) for p in parts]
        n = sum(sizes)
        msg = np.repeat(np.array(part_msg, np.int64), sizes)
        pos = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes) if n else np.empty(0, np.int64)
        if not n:
            empty = rows.DcgmColumns(
                names,
                np.empty(0),
                [],
                np.empty(0, np.int64),
                np.empty(0, np.int64),
                np.empty((0, len(names))),
                [],
                [],
                rtype,
                ftype,
                np.empty(0, np.int64),
            )
            return empty, msg, pos
        hosts: list[str] = []
        models: list[str | None] = []
        labels: list[Any] = []
        ok_msg = np.ones(len(parts), bool)
        for k, p in enumerate(parts):
            w = p.wire
            hosts += [w.host] * p.n
            models += p.models
            labels += p.labels
            if w.v != SCHEMA_VERSION or not self._host_ok(w.host) or (w.models and not self._models_ok(w.models)):
                ok_msg[k] = False
        ts = colwire.column(parts, "ts", np.dtype("<f8"))
        gpu = colwire.column(parts, "gpu", np.dtype("<i8"))
        link = colwire.links(parts)
        v = np.repeat(np.array([p.wire.v for p in parts], np.int64), sizes)
        cols = rows.DcgmColumns(
            names, ts, hosts, gpu, link, colwire.values_of(parts, names), models, labels, rtype, ftype, v
        )
        lo, hi = TS_MIN, TS_MAX
        if self.wall_clock is not None:
            now = self.wall_clock()
            lo, hi = max(lo, now - self.max_age_s), min(hi, now + self.max_future_s)
        with np.errstate(invalid="ignore"):  # NaN compares False: a bad row
            ok = (ts >= lo) & (ts <= hi) & (gpu >= 0) & (gpu <= MAX_GPU_INDEX)
            ok &= (link == rows.NO_LINK) | ((link >= 0) & (link <= MAX_LINK_INDEX))
        if not ok_msg.all():
            # A bad host or version fails every row; a bad model among the message's, only the
            # rows naming it (``_check`` accepts the others below).
            ok &= np.repeat(ok_msg, sizes)
        if ok.all():
            return cols, msg, pos
        for i in np.flatnonzero(~ok).tolist():
            rec = cols[i]
            reason = self._check(rec)
            if reason is None:
                ok[i] = True
                continue
            code, detail = reason
            dead.append(
                DeadLetter(
                    reason=code,
                    detail=detail,
                    origin=f"{origins[int(msg[i])]}#{int(pos[i])}",
                    raw=_raw(msgspec.json.encode(rec)),
                    ts=rec.ts if math.isfinite(rec.ts) else None,
                    host=rec.host if bad_host(rec.host) is None else None,
                )
            )
        return cols.take(ok), msg[ok], pos[ok]

    def _host_ok(self, host: str) -> bool:
        if host in self._ok_hosts:
            return True
        if bad_host(host) is not None:
            return False
        self._remember((), (host,))
        return True

    def _models_ok(self, models: Sequence[str]) -> bool:
        new = [m for m in models if m not in self._ok_names]
        if any(bad_identifier(m) is not None for m in new):
            return False
        self._remember(new, ())
        return True

    def _remember(self, names: Iterable[str | None], hosts: Iterable[str]) -> None:
        """Identifiers found valid, kept to skip checking them again; forgotten all at once past
        ``MAX_KNOWN_NAMES``, so a stream of ever-new names cannot grow the decoder's memory."""
        if len(self._ok_names) + len(self._ok_hosts) > MAX_KNOWN_NAMES:
            self._ok_names, self._ok_hosts = {None}, set()
        self._ok_names.update(names)
        self._ok_hosts.update(hosts)

    def _all_plausible_many(self, recs: list[TelemetryRecord]) -> bool:
        """What the checked types cannot know: the live service's wall-clock range."""
        if self.wall_clock is None or not recs:
            return True
        now = self.wall_clock()
        lo, hi = max(TS_MIN, now - self.max_age_s), min(TS_MAX, now + self.max_future_s)
        ts = list(map(_TS, recs))
        return lo <= min(ts) and max(ts) <= hi

    def _names_ok(self, recs: list[TelemetryRecord]) -> bool:
        """Whether every identifier in ``recs`` is one already found valid (else: check the new ones)."""
        hosts = set(map(HOST_OF, recs)) - self._ok_hosts
        names: set[str | None] = set()
        try:
            names.update(map(MODEL_OF, recs))  # DCGM records only, the common case
        except AttributeError:  # NCCL or NIC records among them
            for r in recs:
                if isinstance(r, NicRecord):
                    # Few a host and interval: checked whole each time (device, counters, GPUs).
                    if nic_problem(r) is not None:
                        return False
                elif isinstance(r, NcclRecord):
                    names.update(NCCL_NAMES(r))
                elif isinstance(r, ProgressRecord):
                    names.update(PROGRESS_NAMES(r))
                else:
                    names.add(r.model)
        names -= self._ok_names
        if not hosts and not names:
            return True
        if any(map(bad_host, hosts)) or any(bad_identifier(n) is not None for n in names if n is not None):
            return False
        self._remember(names, hosts)
        return True

    def decode(self, payload: bytes, origin: str) -> Decoded:
        """Decode one message (a record or an array of them); never raises."""
        try:
            return self._decode(payload, origin)
        except Exception as e:  # a bug, or an input nobody thought of: it costs this message only
            return Decoded(
                [],
                [],
                [
                    DeadLetter(
                        reason=INTERNAL,
                        detail=f"{type(e).__name__}: {e}"[:300],
                        origin=origin,
                        raw=_raw(payload) if payload is not None else None,
                    )
                ],
            )

    def _decode(self, payload: bytes, origin: str) -> Decoded:
        out = Decoded([], [], [])
        if payload is None:
            out.dead.append(
                DeadLetter(reason=WRONG_TYPE, detail="message has no value (a Kafka tombstone?)", origin=origin)
            )
            return out
        if len(payload) > self.max_message_bytes:
            out.dead.append(
                DeadLetter(
                    reason=TOO_LARGE,
                    detail=f"{len(payload)} bytes > {self.max_message_bytes}",
                    origin=origin,
                    raw=_raw(payload[:RAW_KEEP]),
                )
            )
            return out
        try:
            obj = self._fast.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            self._slow(payload, origin, out)
            return out
        recs = obj if isinstance(obj, list) else [obj]
        if self._all_plausible(recs) and (not recs or self._names_ok(recs)):
            out.records = recs
            if isinstance(obj, list):
                out.origins = list(map((origin + "#").__add__, map(str, range(len(recs)))))
                out.positions = list(range(len(recs)))
            else:
                out.origins, out.positions = [origin], [-1]
            return out
        for i, rec in enumerate(recs):
            if isinstance(obj, list):
                self._accept(rec, f"{origin}#{i}", out, payload, i)
            else:
                self._accept(rec, origin, out, payload)
        return out

    def _all_plausible(self, recs: list[TelemetryRecord]) -> bool:
        """One cheap pass for the common case; any doubt sends the message to ``_check``."""
        lo, hi = TS_MIN, TS_MAX
        if self.wall_clock is not None:
            now = self.wall_clock()
            lo, hi = max(lo, now - self.max_age_s), min(hi, now + self.max_future_s)
        for r in recs:
            # NaN fails every comparison, so it falls through to the slow path too.
            if not (lo <= r.ts <= hi) or r.v != 1 or not r.host:
                return False
            if isinstance(r, DcgmSample):
                if r.gpu < 0:
                    return False
            elif isinstance(r, NicRecord):
                if nic_problem(r) is not None:
                    return False
            elif isinstance(r, ProgressRecord):
                if progress_problem(r) is not None:
                    return False
            elif not (
                0 <= r.rank < r.nranks
                and (r.seq is None or 0 <= r.seq <= MAX_SEQ)
                and r.exec_time_us >= 0
                and 0 <= r.bytes <= MAX_SEQ
                and (r.busbw_gbs is None or 0 <= r.busbw_gbs < math.inf)
                and (r.algbw_gbs is None or 0 <= r.algbw_gbs < math.inf)
                and r.exec_time_us < math.inf
            ):
                return False
        return True

    # -- checks that the type system cannot make ------------------------------------------

    def _accept(self, rec: TelemetryRecord, origin: str, out: Decoded, payload: bytes | str, pos: int = -1) -> None:
        reason = self._check(rec)
        if reason is None:
            cast(list, out.records).append(rec)  # the slow path's Decoded holds a list
            cast(list, out.origins).append(origin)  # the slow path's Decoded holds a list
            out.positions.append(pos)
        else:
            code, detail = reason
            host = rec.host if bad_host(rec.host) is None else None
            out.dead.append(
                DeadLetter(
                    reason=code,
                    detail=detail,
                    origin=origin,
                    raw=_raw(payload),
                    ts=rec.ts if math.isfinite(rec.ts) else None,
                    host=host,
                )
            )

    def _check(self, rec: TelemetryRecord) -> tuple[str, str] | None:
        ts = rec.ts
        if not math.isfinite(ts):
            return NAN_VALUE, f"ts is {ts}"
        if rec.v != 1:
            return UNSUPPORTED_VERSION, f"schema version {rec.v} (this build reads 1)"
        if not TS_MIN <= ts <= TS_MAX:
            hint = " (milliseconds or microseconds? ts is in seconds)" if ts > TS_MAX else ""
            return TS_OUT_OF_RANGE, f"ts {ts} outside 2001..2100{hint}"
        if self.wall_clock is not None:
            now = self.wall_clock()
            if ts > now + self.max_future_s:
                return TS_OUT_OF_RANGE, f"ts {ts} is {ts - now:.0f}s ahead of the wall clock"
            if ts < now - self.max_age_s:
                return TS_OUT_OF_RANGE, f"ts {ts} is {now - ts:.0f}s behind the wall clock"
        if not rec.host:
            return MISSING_KEY, "host is empty"
        why = bad_host(rec.host)
        if why is not None:
            return BAD_IDENTIFIER, f"host {shown(rec.host)}: {why}"
        if isinstance(rec, DcgmSample):
            if rec.gpu < 0:
                return NEGATIVE_VALUE, f"gpu index {rec.gpu}"
            if rec.gpu > MAX_GPU_INDEX:
                return OUT_OF_RANGE, f"gpu index {rec.gpu} (0..{MAX_GPU_INDEX})"
            if rec.link is not None and not 0 <= rec.link <= MAX_LINK_INDEX:
                return OUT_OF_RANGE, f"link index {rec.link} (0..{MAX_LINK_INDEX})"
            if rec.model is not None and (why := bad_identifier(rec.model)) is not None:
                return BAD_IDENTIFIER, f"model {shown(rec.model)}: {why}"
        elif isinstance(rec, NicRecord):
            return nic_problem(rec)
        elif isinstance(rec, ProgressRecord):
            return progress_problem(rec)
        else:
            return nccl_problem(rec)
        return None

    # -- slow path: say precisely what is wrong ---------------------------------------------

    def _slow(self, payload: bytes, origin: str, out: Decoded) -> None:
        try:
            # Python's json accepts NaN/Infinity tokens that producers written in Python emit;
            # reading them lets us name the problem (nan_value) instead of "malformed".
            obj = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as e:
            out.dead.append(DeadLetter(reason=MALFORMED_JSON, detail=str(e)[:200], origin=origin, raw=_raw(payload)))
            return
        except RecursionError:
            # A record is three levels deep; a thousand nested arrays are an attack or garbage.
            out.dead.append(
                DeadLetter(
                    reason=TOO_DEEP, detail="JSON nested too deep to be a record", origin=origin, raw=_raw(payload)
                )
            )
            return
        items = obj if isinstance(obj, list) else [obj]
        for i, item in enumerate(items):
            if isinstance(obj, list):
                self._slow_one(item, f"{origin}#{i}", out, i)
            else:
                self._slow_one(item, origin, out, -1)

    def _slow_one(self, item: Any, origin: str, out: Decoded, pos: int) -> None:
        try:
            self._slow_item(item, origin, out, pos)
        except RecursionError:  # nested deep inside a key nothing reads
            out.dead.append(DeadLetter(reason=TOO_DEEP, detail="JSON nested too deep to be a record", origin=origin))

    def _slow_item(self, item: Any, origin: str, out: Decoded, pos: int) -> None:
        raw = _raw(json.dumps(item, default=str)) if not isinstance(item, str) else _raw(item)

        def dead(code: str, detail: str) -> None:
            host = item.get("host") if isinstance(item, dict) and isinstance(item.get("host"), str) else None
            if host is not None and bad_host(host) is not None:
                host = None  # never echo a name a JSON writer cannot encode
            out.dead.append(DeadLetter(reason=code, detail=detail, origin=origin, raw=raw, host=host))

        if not isinstance(item, dict):
            return dead(WRONG_TYPE, f"a record is a JSON object, got {type(item).__name__}")
        kind = item.get("kind")
        if not isinstance(kind, str) and kind is not None:  # a list or object is no kind ("in" would raise)
            what = {list: "array", dict: "object", bool: "boolean"}.get(type(kind), "number")
            return dead(WRONG_TYPE, f"kind is a JSON {what}, not a string")
        if kind not in _KINDS:
            return dead(
                UNKNOWN_KIND if kind is not None else MISSING_KEY,
                f"kind {kind!r} (known: {', '.join(_KINDS)})" if kind is not None else "no 'kind'",
            )
        ts = item.get("ts")
        if isinstance(ts, float) and not math.isfinite(ts):
            return dead(NAN_VALUE, f"ts is {ts}")
        fields = item.get("fields")
        dropped: list[tuple[str, str]] = []
        if kind == "dcgm" and isinstance(fields, dict):
            clean = {}
            for name, val in fields.items():
                if isinstance(val, bool) or not isinstance(val, (int, float)):
                    if isinstance(val, str) and val.startswith("<<<"):
                        dropped.append((name, BLANK_SENTINEL))
                    elif isinstance(val, str):
                        try:
                            num = float(val)  # "71" from a loose producer is still 71
                        except ValueError:
                            dropped.append((name, WRONG_TYPE))
                            continue
                        if math.isfinite(num):
                            clean[name] = num
                        else:
                            dropped.append((name, NAN_FIELD))
                    else:
                        dropped.append((name, WRONG_TYPE))
                elif (
                    isinstance(val, float) and not math.isfinite(val) or isinstance(val, int) and abs(val) > DOUBLE_MAX
                ):
                    # An integer beyond a double (300+ digits) is as unusable as Inf.
                    dropped.append((name, NAN_FIELD))
                else:
                    clean[name] = val
            item = {**item, "fields": clean}
        if kind == "nic" and "counters" in item:
            item = {**item, "counters": clean_counters(item["counters"], dropped)}
        labels = item.get("labels", {})
        if labels is None:  # null: no labels
            item = {**item, "labels": {}}
        elif not (isinstance(labels, dict) and all(map(is_str, labels.values()))):
            # Labels are metadata: a number (a Slurm job id written as 1234) is kept as its text,
            # anything else dropped on its own; the record is still used.
            item = {**item, "labels": label_text(labels, dropped)}
        try:
            rec = msgspec.convert(item, _KINDS[kind], strict=False)
        except msgspec.ValidationError as e:
            msg = str(e)
            code = MISSING_KEY if "missing required field" in msg else WRONG_TYPE
            return dead(code, msg)
        if dropped and self._check(rec) is None:  # a refused record's fields need no word of their own
            reasons = sorted({r for _, r in dropped})
            for r in reasons:
                names = [n for n, rr in dropped if rr == r]
                out.dead.append(
                    DeadLetter(
                        reason=r,
                        detail=f"dropped {', '.join(names)}; rest of the record kept",
                        origin=origin,
                        action="fields_dropped",
                        fields=names,
                        ts=rec.ts,
                        host=rec.host,
                        raw=raw,
                    )
                )
        self._accept(rec, origin, out, raw, pos)
