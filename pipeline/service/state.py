"""Engine checkpoints in the compacted ``<prefix>.state`` topic, one key per telemetry partition.

A checkpoint is the partition's engine snapshot plus the offset of the next telemetry message
it has not processed. On assignment the service restores the snapshot and seeks to that
offset, so state and input position always agree, whatever happened to the offset commit.

The state topic is outside the process, so what comes back from it is checked before it is used
(docs/operations.md, Security): each checkpoint is signed with HMAC-SHA256 under
``GPUWARDEN_STATE_KEY``, and the MAC covers the consumer group, the telemetry topic, the
partition, the offset and the writer's epoch, so one partition's checkpoint cannot stand in for
another's and an old one cannot be replayed over a newer one. The snapshot is decompressed to
at most the size the envelope states, itself capped, so a small message cannot expand into
gigabytes. A checkpoint that fails any check is skipped, costing only its own partition, which
takes its newest valid checkpoint instead, or starts fresh.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import msgspec
from kafka import KafkaConsumer, TopicPartition

from pipeline.bus.base import Producer
from pipeline.bus.connection import CLIENT_DEFAULTS
from pipeline.errors import StateError, StateKeyError

log = logging.getLogger("gpuwarden.service.state")

# 2: the MAC covers group, topic, partition, offset and epoch; version 1 envelopes are refused
# (their MAC covered the offset only), so after an upgrade a partition starts fresh once.
ENVELOPE_VERSION = 2
KEY_ENV = "GPUWARDEN_STATE_KEY"
MIN_KEY_BYTES = 16
# The largest snapshot a checkpoint may expand to. A real one is a few KiB per GPU
# (docs/performance.md): 512 MiB is far above any partition's and far below what hurts.
DEFAULT_MAX_BYTES = 512 << 20
_INT64_MAX = (1 << 63) - 1


@dataclass
class Checkpoint:
    partition: int
    next_offset: int
    engine: bytes
    epoch: int = 0  # the writer's: a partition's new owner writes with a higher one


def state_key(env: Mapping[str, str], insecure: bool) -> bytes | None:
    """The checkpoint key from ``GPUWARDEN_STATE_KEY``; ``None`` only when told to run insecure."""
    raw = env.get(KEY_ENV, "")
    if not raw:
        if insecure:
            return None
        raise StateKeyError(
            f"{KEY_ENV} is not set: checkpoints are signed, so serve needs the key "
            "(the same on every replica); --insecure-state runs without, trusting the state topic"
        )
    key = raw.encode()
    if len(key) < MIN_KEY_BYTES:
        raise StateKeyError(
            f"{KEY_ENV} is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes (e.g. `openssl rand -hex 32`)"
        )
    return key


def derived_key(key: bytes | None, purpose: str) -> bytes | None:
    """A key for ``purpose`` (e.g. ``fleet``, the fleet topic's MACs) derived from the state key:
    HMAC-SHA256 of a label under it, so a MAC made for one use never verifies for another
    (``None``: insecure, no key)."""
    if key is None:
        return None
    return hmac.new(key, b"gpuwarden/derived-key/v1/" + purpose.encode(), hashlib.sha256).digest()


class StateStore:
    """Signed (``key``) or, when the operator said so, unsigned checkpoints of one consumer group.

    Checkpoints go out through ``producer`` (``save`` queues, ``flush`` confirms) and come back
    from ``_records``, the whole state log as (key, value, where) in log order: Kafka's compacted
    topic (``KafkaStateStore``) or an in-process bus topic (``MemoryStateStore``, for tests)."""

    def __init__(
        self,
        topic: str,
        group: str,
        source_topic: str,
        producer: Producer,
        key: bytes | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.topic, self.group, self.source = topic, group, source_topic
        self.producer = producer
        self.mac_key = key
        self.max_bytes = int(max_bytes)
        self.epochs: dict[int, int] = {}  # partition -> epoch this writer stamps
        self.seen: dict[int, tuple[int, int]] = {}  # partition -> newest (epoch, offset) loaded
        self.rejected: Counter[str] = Counter()  # why checkpoints were skipped, by reason
        self.on_reject: Callable[[str], None] | None = None  # e.g. a metric, called with the reason

    def key(self, partition: int) -> bytes:
        return f"{self.group}/{self.source}/{partition}".encode()

    def save(self, cp: Checkpoint) -> None:
        """Queue a checkpoint; ``flush`` confirms it."""
        self.producer.send(self.topic, self.encode(cp), self.key(cp.partition))

    def encode(self, cp: Checkpoint) -> bytes:
        # zlib: snapshots are mostly NaN-filled arrays and compress ~10x, which keeps a
        # partition's state well under the topic's message size.
        epoch = self.epochs.setdefault(cp.partition, max(cp.epoch, 1))
        env: dict[str, Any] = {
            "v": ENVELOPE_VERSION,
            "group": self.group,
            "topic": self.source,
            "partition": cp.partition,
            "offset": cp.next_offset,
            "epoch": epoch,
            "size": len(cp.engine),
            "engine": zlib.compress(cp.engine, 1),
        }
        if self.mac_key is not None:
            env["mac"] = _mac(self.mac_key, env)
        return msgspec.msgpack.encode(env)

    def decode(self, partition: int, value: bytes) -> Checkpoint:
        """The checkpoint in ``value`` if it is valid for ``partition`` of this group, else ``StateError``."""
        return _decode(value, self.mac_key, (self.group, self.source, partition), self.max_bytes)

    def flush(self) -> int:
        """Wait until the broker acknowledged every queued checkpoint (``DeliveryError`` if not)."""
        return self.producer.flush()

    def _records(self, timeout_s: float) -> Iterator[tuple[bytes | None, bytes | None, str]]:
        raise NotImplementedError

    def load(self, partitions: list[int], timeout_s: float = 30.0) -> dict[int, Checkpoint]:
        """The newest valid checkpoint of each of ``partitions`` (read the whole state log).

        Newest is the highest (epoch, offset): a checkpoint replayed later into the topic does not
        win by arriving last. A bad message is logged, counted in ``rejected`` and skipped."""
        wanted = {self.key(p): p for p in partitions}
        latest: dict[int, Checkpoint] = {}
        for key, value, where in self._records(timeout_s):
            p = wanted.get(key) if key is not None else None
            if p is not None and value is not None:
                self._consider(latest, p, value, where)
        return self._settle(partitions, latest)

    def _consider(self, latest: dict[int, Checkpoint], p: int, value: bytes, where: str) -> None:
        try:
            cp = self.decode(p, value)
        except StateError as e:
            self._reject(str(e.context.get("reason", "corrupt")))
            log.warning(
                "state: skipping the checkpoint at %s for partition %d: %s",
                where,
                p,
                e,
                extra={"partition": p, "origin": where, "code": e.code},
            )
            return
        best = latest.get(p)
        if best is None or (cp.epoch, cp.next_offset) > (best.epoch, best.next_offset):
            latest[p] = cp

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        if self.on_reject is not None:
            self.on_reject(reason)

    def unread(self, partitions: list[int]) -> None:
        """The checkpoints of ``partitions`` could not be read (the topic did not answer): write
        with an epoch above any an earlier owner can have used (counters from 1; this is the wall
        clock in seconds), so this writer's checkpoints are never outranked by stale ones."""
        for p in partitions:
            self.epochs[p] = max(int(time.time()), self.epochs.get(p, 0) + 1, self.seen.get(p, (0, -1))[0] + 1)

    def _settle(self, partitions: list[int], latest: dict[int, Checkpoint]) -> dict[int, Checkpoint]:
        """Refuse going back past what this reader loaded before; pick the epochs to write with."""
        for p in partitions:
            cp, floor = latest.get(p), self.seen.get(p, (0, -1))
            if cp is not None and (cp.epoch, cp.next_offset) < floor:
                self._reject("rollback")
                log.error(
                    "state: partition %d's newest checkpoint (epoch %d, offset %d) is older than the one "
                    "loaded before (epoch %d, offset %d); not going back, starting fresh",
                    p,
                    cp.epoch,
                    cp.next_offset,
                    *floor,
                    extra={"partition": p},
                )
                del latest[p]
                cp = None
            if cp is not None:
                self.seen[p] = (cp.epoch, cp.next_offset)
            # A new owner writes above every epoch it has seen, so its checkpoints win over a
            # previous owner's late ones.
            self.epochs[p] = max(cp.epoch if cp else 0, self.seen.get(p, (0, -1))[0]) + 1
        return latest


class KafkaStateStore(StateStore):
    """Checkpoints in the compacted ``<prefix>.state`` topic of a Kafka cluster."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        source_topic: str,
        producer: Producer,
        security: dict | None = None,
        key: bytes | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        super().__init__(topic, group, source_topic, producer, key=key, max_bytes=max_bytes)
        self.bootstrap = bootstrap
        self.security = security or {}

    def _records(self, timeout_s: float) -> Iterator[tuple[bytes | None, bytes | None, str]]:
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            max_partition_fetch_bytes=64 << 20,
            fetch_max_bytes=64 << 20,
            **{**CLIENT_DEFAULTS, **self.security},
        )
        try:
            parts = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not tps:
                return
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            end = consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout_s
            while any(consumer.position(tp) < end[tp] for tp in tps):
                if time.monotonic() > deadline:
                    raise StateError(f"reading {self.topic} took over {timeout_s}s")
                for tp, recs in consumer.poll(timeout_ms=500).items():
                    for r in recs:
                        yield r.key, r.value, f"{tp.topic}[{tp.partition}]@{r.offset}"
        finally:
            consumer.close(autocommit=False)


class MemoryStateStore(StateStore):
    """Checkpoints in a topic of an in-process ``MemoryBus`` (unit tests of the commit protocol)."""

    def __init__(
        self,
        bus: Any,
        topic: str,
        group: str,
        source_topic: str,
        key: bytes | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        super().__init__(topic, group, source_topic, bus.producer(), key=key, max_bytes=max_bytes)
        self.bus = bus

    def _records(self, timeout_s: float) -> Iterator[tuple[bytes | None, bytes | None, str]]:
        for m in self.bus.messages(self.topic):
            yield m.key, m.value, m.origin


def _signed(env: Mapping[str, Any]) -> bytes:
    """What the MAC covers, in one fixed order (msgpack of a list is canonical)."""
    return msgspec.msgpack.encode(
        [
            env["v"],
            env["group"],
            env["topic"],
            env["partition"],
            env["offset"],
            env["epoch"],
            env["size"],
            env["engine"],
        ]
    )


def _mac(key: bytes, env: Mapping[str, Any]) -> bytes:
    return hmac.new(key, _signed(env), hashlib.sha256).digest()


def _decode(value: bytes, key: bytes | None, want: tuple[str, str, int], max_bytes: int) -> Checkpoint:
    group, topic, partition = want
    try:
        env = msgspec.msgpack.decode(value)
    # RecursionError: nesting past msgspec's depth, which any writer to the topic can send before
    # a MAC is checked; it must cost this checkpoint, not every partition's load.
    except (msgspec.DecodeError, RecursionError) as e:
        raise StateError(f"corrupt checkpoint for partition {partition}: {e}", reason="corrupt") from e
    if not isinstance(env, dict):
        raise StateError(f"corrupt checkpoint for partition {partition}: not an envelope", reason="corrupt")
    if env.get("v") != ENVELOPE_VERSION:
        raise StateError(
            f"checkpoint envelope version {env.get('v')} for partition {partition} "
            f"(this build reads {ENVELOPE_VERSION})",
            reason="version",
        )
    try:
        fields = _signed(env)
    except (KeyError, TypeError) as e:
        raise StateError(f"corrupt checkpoint for partition {partition}: missing {e}", reason="corrupt") from e
    if key is not None:
        mac = env.get("mac")
        if not isinstance(mac, bytes):
            raise StateError(
                f"unsigned checkpoint for partition {partition}; this service requires signed ones", reason="unsigned"
            )
        if not hmac.compare_digest(mac, hmac.new(key, fields, hashlib.sha256).digest()):
            raise StateError(
                f"checkpoint for partition {partition} is not signed with this service's key", reason="bad_signature"
            )
    if (env["group"], env["topic"], env["partition"]) != (group, topic, partition):
        raise StateError(
            f"checkpoint of {env['group']}/{env['topic']}/{env['partition']} found under "
            f"{group}/{topic}/{partition}'s key",
            reason="misplaced",
        )
    offset, epoch, size, engine = env["offset"], env["epoch"], env["size"], env["engine"]
    # Within an int64: a Kafka offset is one, and the next owner writes epoch + 1, which must
    # still encode (msgpack stops at 2**64 - 1) and load again.
    if (
        type(offset) is not int
        or type(epoch) is not int
        or not 0 <= offset <= _INT64_MAX
        or not 0 <= epoch < _INT64_MAX
        or not isinstance(engine, bytes)
    ):
        raise StateError(
            f"corrupt checkpoint for partition {partition}: offset, epoch or snapshot malformed", reason="corrupt"
        )
    if type(size) is not int or not 0 < size <= max_bytes:
        raise StateError(
            f"checkpoint for partition {partition} expands to {size} bytes (at most {max_bytes})", reason="too_large"
        )
    return Checkpoint(partition, offset, _inflate(engine, size, partition), epoch)


def _inflate(data: bytes, size: int, partition: int) -> bytes:
    """Decompress to exactly ``size`` bytes, never more: a stream that goes on is refused."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size)
        if len(out) == size and not d.eof and d.decompress(d.unconsumed_tail, 1):
            raise StateError(
                f"checkpoint for partition {partition} expands past the {size} bytes it states", reason="too_large"
            )
    except zlib.error as e:
        raise StateError(f"corrupt checkpoint for partition {partition}: {e}", reason="corrupt") from e
    if len(out) != size or d.unconsumed_tail or not d.eof or d.unused_data:
        raise StateError(
            f"checkpoint for partition {partition} does not expand to the {size} bytes it states", reason="corrupt"
        )
    return out
