"""Messages for ``<prefix>.fleet`` as the host stage writes them, and as an attacker might
(pipeline/service/fleet.py), and a deadline for tests that prove a hostile input cannot hang."""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

import msgspec

from pipeline.bus.base import Message
from pipeline.service.fleetwire import ENVELOPE_VERSION, Envelope, mac
from pipeline.service.state import derived_key

STATE_KEY = b"unit-test-state-key-0123456789ab"
FLEET_KEY = derived_key(STATE_KEY, "fleet")
TOPIC = "t.fleet"
GROUP = "svc"


def envelope(
    body: bytes,
    sender: int,
    *,
    key: bytes | None = FLEET_KEY,
    topic: str = TOPIC,
    group: str = GROUP,
    signed_as: int | None = None,
    v: int = ENVELOPE_VERSION,
    to: int | None = None,
) -> bytes:
    """A fleet message from ``sender``, its MAC made under ``key`` for ``topic``/``group`` and for
    partition ``signed_as`` (default: the sender), and a shard's for fleet partition ``to``;
    ``key`` None: unsigned."""
    tag = b"" if key is None else mac(key, topic, group, sender if signed_as is None else signed_as, body, v, to)
    return msgspec.msgpack.encode(Envelope(v, sender, body, tag))


def mark_body(mark: Any, upto: Any, final: bool = False, n: Any = 2, hosts: str | None = None) -> bytes:
    """A mark's JSON (any values, for hostile ones: an int past 2^64 is written as is);
    ``hosts``: the JSON of its hosts released ahead (``Mark.hosts``), as given."""
    more = "" if hosts is None else f', "hosts": {hosts}'
    return f'{{"mark": {mark}, "upto": {"null" if upto is None else upto}, "final": {str(final).lower()}, "n": {n}{more}}}'.encode()


def records_body(records: list, fields: tuple[str, ...] | None = None) -> bytes:
    """Records as the host stage's ``Outbox`` forwards them: columns (pipeline/service/forwarded.py)
    of ``fields`` (None: every field they report)."""
    from pipeline.service.forwarded import Encoder

    return Encoder(fields).encode(records)


def json_records_body(records: list) -> bytes:
    """Records as a JSON array: what the host stage of earlier builds forwarded."""
    return msgspec.json.encode(records)


def columns_body(records: list, **change: Any) -> bytes:
    """``records_body`` with members of its map replaced (``n=10**9``, ``ts=b"x"``): a hostile body."""
    from pipeline.service.forwarded import Columns

    body = msgspec.msgpack.decode(records_body(records), type=Columns)
    return msgspec.msgpack.encode(msgspec.structs.replace(body, **change))


def alerts_body(alerts: list) -> bytes:
    """An alerts message's JSON, as the host stage's ``Outbox`` writes it."""
    from pipeline.service.fleetwire import AlertBatch

    return msgspec.json.encode(AlertBatch(alerts))


def fleet_message(value: bytes, offset: int, partition: int = 0, topic: str = TOPIC) -> Message:
    return Message(topic, partition, offset, b"fleet", value)


class Deadline(Exception):
    """Raised in the main thread when a ``no_hang`` block runs past its bound."""


@contextlib.contextmanager
def no_hang(seconds: float) -> Iterator[None]:
    """Fail (``Deadline``) a block still running after ``seconds``: a generous bound that proves
    'no hang' (a hostile input the old code never finished), never a speed assertion."""

    def fire(*_: Any) -> None:
        raise Deadline(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
