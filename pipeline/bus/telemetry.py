"""How telemetry goes on the wire: one message per host per interval, a JSON array of records.

Measured (docs/architecture.md, bench/wire_format.py): per-host batching cuts the consumer's
cost per GPU-sample several-fold against one message per GPU, because kafka-python's per-message
overhead is paid once per host instead of once per GPU (docs/performance.md, wire format: 4.9 vs 0.8 us). Keying by host
keeps a host's samples in order on one partition.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import msgspec

_enc = msgspec.json.Encoder()


def per_host_messages(records: Iterable[dict[str, Any] | msgspec.Struct]) -> Iterator[tuple[bytes, bytes]]:
    """Group consecutive records by host into (key, value) messages, order kept within a host."""
    groups: dict[str, list[Any]] = {}
    for rec in records:
        host = rec["host"] if isinstance(rec, dict) else rec.host  # type: ignore[union-attr]
        groups.setdefault(host, []).append(rec)
    for host, recs in groups.items():
        yield host.encode(), _enc.encode(recs)


def per_record_messages(records: Iterable[dict[str, Any] | msgspec.Struct]) -> Iterator[tuple[bytes, bytes]]:
    """One message per record (what a naive producer does; kept for the wire-format benchmark)."""
    for rec in records:
        host = rec["host"] if isinstance(rec, dict) else rec.host  # type: ignore[union-attr]
        yield host.encode(), _enc.encode(rec)
