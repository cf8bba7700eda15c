"""The messages on ``<prefix>.fleet`` (docs/operations.md, "Topology"): what they hold, their
envelope and its signature. ``pipeline.service.outbox`` sends them (``Outbox``) and
``pipeline.service.fleet`` reads them (``FleetTask``).

On ``<prefix>.fleet`` there are three kinds of message:

- **records**: the records one host-stage task accepted, as columns of what the fleet stage's
  engine reads (``pipeline.service.forwarded``: msgpack, the DCGM fields as a float64 matrix,
  NCCL and progress records whole), keyed by the fleet stage's key
  (``pipeline.fleetstage.FLEET_KEY``), so every record of one key lands on one partition; sent
  when the fleet stage runs models (every record) or, rules only, the hang detector (the
  progress records: ``pipeline.topology.Topology``'s ``progress_only``). A JSON array of records (the encoding of earlier builds) is still read;
- **alerts**: ``{"alerts": [<alert event>, ...]}``, the alerts of a host-stage task, for the
  incident stage the fleet stage runs (``service.incidents``), with the same key;
- **marks**: ``{"mark": <telemetry partition>, "upto": <ts>, "final": <bool>, "n": <partitions>}``
  (and, with model shards, ``"nccl"``: the fleet partitions sent NCCL records; without,
  ``"hosts"``: ``{<host>: <ts>}``, the hosts released further on their own),
  sent by each host-stage task after the records and alerts they cover, with their key and on
  the same producer, so on their partition a mark follows everything it covers. The other
  fleet partitions get neither: they hold nothing to release.

Each travels in an envelope (``Envelope``, msgpack): the sending telemetry partition, the body,
and an HMAC-SHA256 under a key derived from the state key (``pipeline.service.state.derived_key``)
over the envelope version, the fleet topic, the consumer group, the sender and the body. The
fleet topic is outside the process, so what a fleet-stage task reads from it is checked before
it is used (docs/operations.md, Security): a message that fails is a dead letter with its reason
and origin, costing only itself (``FleetTask.check``).
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec

from pipeline.schema import AlertEvent

ENVELOPE_VERSION = 1
# Alerts per message on the fleet topic (each well under 2 KiB): a message over it is refused
# (``too_large``), so a forged one costs bounded work.
MAX_FORWARD_ALERTS = 500


class Mark(msgspec.Struct):
    mark: int
    upto: float | None  # None: -inf (nothing released yet)
    final: bool = False
    n: int = 1
    # With model shards: the fleet partitions this task has sent NCCL records to (whose scorers
    # have findings to wait for); None: not said (every scorer is waited for).
    nccl: list[int] | None = None
    # The sender's hosts whose rows it released ahead of ``upto`` on their own, each with how
    # far (``Engine.hosts_ahead``): the fleet stage may run their rows of the next tick early
    # (``FleetStage.mark``). None: none said.
    hosts: dict[str, float] | None = None


class AlertBatch(msgspec.Struct):
    """An alerts message's body: ``{"alerts": [...]}`` (the encoder writes no space, so a body
    starting ``{"alerts":`` is one, any other object a mark)."""

    alerts: list[AlertEvent]


ALERTS_PREFIX = b'{"alerts":'
# What a msgpack map starts with (fixmap, map 16, map 32): a columns body; a JSON body starts
# with "{" or "[" (or whitespace), never one of these.
COLUMNS_MAP = frozenset([*(bytes([b]) for b in range(0x80, 0x90)), b"\xde", b"\xdf"]).__contains__


class Envelope(msgspec.Struct, array_like=True):
    """What every message on the fleet topic is: ``[v, sender, body, mac]`` in msgpack.

    ``sender``: the telemetry partition of the host-stage task that wrote it (a fleet partition
    in a ``PEER_ENVELOPE``); ``body``: the records' columns (or, from earlier builds, their JSON
    array), or the JSON of a mark or of alerts; ``mac``: HMAC-SHA256 of ``signed(...)`` (empty
    when the service runs without a state key, ``--insecure-state``)."""

    v: int
    sender: int
    body: bytes
    mac: bytes = b""


def signed(topic: str, group: str, sender: int, body: bytes, v: int = ENVELOPE_VERSION, to: int | None = None) -> bytes:
    """What a fleet message's MAC covers, in one fixed order (msgpack of a list is canonical):
    bound to the envelope version (which says whether the sender is a telemetry partition or,
    ``PEER_ENVELOPE``, a fleet partition), the topic, the group and the sender, so a message of
    one partition, group or cluster's topic never verifies as another's; and ``to``, the fleet
    partition a shard's message is for, so a copy put on another partition does not verify."""
    return msgspec.msgpack.encode([v, topic, group, sender, body] + ([] if to is None else [to]))


def mac(
    key: bytes, topic: str, group: str, sender: int, body: bytes, v: int = ENVELOPE_VERSION, to: int | None = None
) -> bytes:
    """The MAC of a fleet message (``signed``) under ``key``, the fleet key."""
    return hmac.new(key, signed(topic, group, sender, body, v, to), hashlib.sha256).digest()


def wrap(
    key: bytes | None,
    topic: str,
    group: str,
    sender: int,
    body: bytes,
    v: int = ENVELOPE_VERSION,
    to: int | None = None,
) -> bytes:
    """``body`` in its signed envelope (unsigned without a key: ``--insecure-state``)."""
    tag = b"" if key is None else mac(key, topic, group, sender, body, v, to)
    return msgspec.msgpack.encode(Envelope(v, sender, body, tag))


Send = tuple[str, bytes | None, bytes, int | None]  # topic, key, value, partition
