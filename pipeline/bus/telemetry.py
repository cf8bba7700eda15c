"""How telemetry goes on the wire: one message per host per interval, a JSON array of records.

Measured (docs/architecture.md, bench/wire_format.py): per-host batching cuts the consumer's
cost per GPU-sample several-fold against one message per GPU, because kafka-python's per-message
overhead is paid once per host instead of once per GPU (docs/performance.md, wire format: 4.9 vs 0.8 us). Keying by host
keeps a host's samples in order on one partition.

Every publisher builds its messages here: ``per_host_messages`` from records (the simulator,
the producers' sender, the demo, evaluation, the benchmarks) and ``recorded_messages`` from the
lines of a recording (``replay --to-kafka``), so the wire format has one definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import msgspec

from pipeline.bus.base import Message
from pipeline.colwire import COLUMNAR_V1, CONTENT_TYPE, encode_dcgm

_enc = msgspec.json.Encoder()

#: A telemetry message's encodings (docs/architecture.md §7): ``columnar`` where the records
#: allow it (DCGM only, pipeline/colwire.py), else JSON; ``json`` always JSON.
COLUMNAR, JSON = "columnar", "json"
ENCODINGS = (COLUMNAR, JSON)
COLUMNAR_HEADERS = [(CONTENT_TYPE, COLUMNAR_V1)]


@dataclass(frozen=True, slots=True)
class WireMessage:
    """A telemetry message ready to send: its key (the host; None for poison passed on as it was
    recorded), its value, and the event time of its records (None: unknown, never paced)."""

    key: bytes | None
    value: bytes
    ts: float | None = None


def _host(rec: dict[str, Any] | msgspec.Struct) -> str:
    return rec["host"] if isinstance(rec, dict) else rec.host  # type: ignore[attr-defined]


def per_host_messages(
    records: Iterable[dict[str, Any] | msgspec.Struct], max_records: int | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """Group records by host into (key, value) messages, hosts in order of first appearance and
    each host's records in their order.

    ``max_records``: a host with more records than that gets several consecutive messages of at
    most ``max_records`` each (a producer's backlog after an outage stays under the broker's and
    the decoder's 8 MiB message limit). None: one message per host.
    """
    for key, recs in _host_chunks(records, max_records, "strict"):
        yield key, _enc.encode(recs)


def _host_chunks(records: Iterable[Any], max_records: int | None, errors: str) -> Iterator[tuple[bytes, list[Any]]]:
    """Records grouped by host (hosts in order of first appearance, each host's in their order),
    each group cut into runs of at most ``max_records`` (None: whole), with the host as the key
    (encoded with ``errors``)."""
    if max_records is not None and max_records <= 0:
        raise ValueError("max_records must be positive")
    groups: dict[str, list[Any]] = {}
    for rec in records:
        groups.setdefault(_host(rec), []).append(rec)
    for host, recs in groups.items():
        key = host.encode("utf-8", errors)
        step = max_records or len(recs)
        for i in range(0, len(recs), step):
            yield key, recs[i : i + step]


def encoded(
    key: bytes, recs: list[dict[str, Any] | msgspec.Struct], encoding: str
) -> tuple[bytes, bytes, list[tuple[str, bytes]] | None]:
    """One host's records as (key, value, headers) in ``encoding``: columnar with its header
    where ``colwire.encode_dcgm`` can carry them, else a JSON array without headers."""
    if encoding == COLUMNAR:
        cols = encode_dcgm(recs)
        if cols is not None:
            return key, cols, COLUMNAR_HEADERS
    elif encoding != JSON:
        raise ValueError(f"encoding {encoding!r} (one of {', '.join(ENCODINGS)})")
    return key, _enc.encode(recs), None


def per_host_wire(
    records: Iterable[dict[str, Any] | msgspec.Struct], encoding: str = COLUMNAR, max_records: int | None = None
) -> Iterator[tuple[bytes, bytes, list[tuple[str, bytes]] | None]]:
    """``per_host_messages`` in ``encoding``, each message as (key, value, headers).

    >>> from pipeline.schema import dcgm
    >>> [(k, h) for k, _, h in per_host_wire([dcgm(1764403200.0, "h1", 0)], "json")]
    [(b'h1', None)]
    """
    for key, recs in _host_chunks(records, max_records, "backslashreplace"):
        yield encoded(key, recs, encoding)


def sized_host_messages(
    records: Iterable[dict[str, Any] | msgspec.Struct], max_records: int, max_bytes: int
) -> tuple[list[tuple[bytes, list[bytes]]], list[dict[str, Any] | msgspec.Struct]]:
    """``per_host_messages`` bounded in bytes as well as records: (messages as (key, encoded
    records), the records that alone are larger than ``max_bytes``).

    A message is ``array(parts)``; it holds at most ``max_records`` records and ``max_bytes``
    bytes, so one host's long label cannot push a message past the broker's limit. A record too
    large on its own is returned, never sent: no broker would take it, and retrying it would
    hold every record behind it."""
    groups, too_large = sized_host_groups(records, max_records, max_bytes)
    return [(key, parts) for key, parts, _ in groups], too_large


def sized_host_groups(
    records: Iterable[dict[str, Any] | msgspec.Struct], max_records: int, max_bytes: int
) -> tuple[list[tuple[bytes, list[bytes], list[Any]]], list[dict[str, Any] | msgspec.Struct]]:
    """``sized_host_messages`` with each message's records beside their JSON parts: (key,
    parts, records), for a sender that may encode them another way (``encoded``)."""
    if max_records <= 0 or max_bytes <= 2:
        raise ValueError("max_records and max_bytes must be positive")
    groups: dict[str, list[Any]] = {}
    for rec in records:
        groups.setdefault(_host(rec), []).append(rec)
    out: list[tuple[bytes, list[bytes], list[Any]]] = []
    too_large: list[Any] = []
    for host, recs in groups.items():
        key = host.encode("utf-8", "backslashreplace")
        parts: list[bytes] = []
        held: list[Any] = []
        size = 2  # "[" and "]"
        run = 0  # where the records of the last one's time start in this message
        for rec in recs:
            b = _enc.encode(rec)
            if len(b) + 2 > max_bytes:
                too_large.append(rec)
                continue
            ts = _ts(rec)
            if held and ts != _ts(held[-1]):
                run = len(held)
            while parts and (len(parts) >= max_records or size + 1 + len(b) > max_bytes):
                # Cut where the time changes: a message holds a host's sample whole, which the
                # consumer's release trusts (docs/architecture.md §4); one larger than a message
                # is cut where it must.
                cut = run if 0 < run < len(parts) and ts == _ts(held[-1]) else len(parts)
                out.append((key, parts[:cut], held[:cut]))
                parts, held = parts[cut:], held[cut:]
                size = 2 + sum(len(p) for p in parts) + max(len(parts) - 1, 0)
                run = 0
            size += len(b) + (1 if parts else 0)
            parts.append(b)
            held.append(rec)
        if parts:
            out.append((key, parts, held))
    return out, too_large


def _ts(rec: dict[str, Any] | msgspec.Struct) -> Any:
    return rec.get("ts") if isinstance(rec, dict) else getattr(rec, "ts", None)


def array(parts: list[bytes]) -> bytes:
    """The JSON array of already encoded records: a telemetry message's value."""
    return b"[" + b",".join(parts) + b"]"


def per_record_messages(records: Iterable[dict[str, Any] | msgspec.Struct]) -> Iterator[tuple[bytes, bytes]]:
    """One message per record (what a naive producer does; kept for the wire-format benchmark)."""
    for rec in records:
        yield _host(rec).encode(), _enc.encode(rec)


def recorded_messages(lines: Iterable[Message]) -> Iterator[WireMessage]:
    """The lines of a JSONL recording (one record a line) as wire messages: each run of
    consecutive lines with the same (ts, host) becomes one message, its lines' bytes kept verbatim.

    A line that is not a record with a ``ts`` and a ``host`` travels alone, as it was recorded,
    unkeyed and unpaced: poison survives a record/publish round trip for the service to
    dead-letter. A host name no UTF-8 writer can encode (a lone surrogate) still travels: the
    key only spreads it onto a partition.
    """
    group: list[bytes] = []
    group_key: tuple[float, str] | None = None

    def take() -> WireMessage | None:
        nonlocal group
        if not group or group_key is None:
            return None
        msg = WireMessage(
            group_key[1].encode("utf-8", "backslashreplace"), b"[" + b",".join(group) + b"]", group_key[0]
        )
        group = []
        return msg

    for m in lines:
        try:
            rec = json.loads(m.value)
            key = (float(rec["ts"]), str(rec["host"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            if (done := take()) is not None:
                yield done
            yield WireMessage(None, m.value)
            continue
        if key != group_key:
            if (done := take()) is not None:
                yield done
            group_key = key
        group.append(m.value)
    if (done := take()) is not None:
        yield done


def as_consumed(
    items: Iterable[tuple[bytes | None, bytes]], topic: str, first_offset: int = 0, partition: int = 0
) -> list[Message]:
    """(key, value) messages as a consumer of one partition would read them, without a bus: what
    an in-process driver (evaluation) hands the decoder, with ``topic[partition]@offset`` origins."""
    return [Message(topic, partition, first_offset + i, key, value) for i, (key, value) in enumerate(items)]
