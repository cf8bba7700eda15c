"""Engine checkpoints in the compacted ``<prefix>.state`` topic, one key per telemetry partition.

A checkpoint is the partition's engine snapshot plus the offset of the next telemetry message
it has not processed. On assignment the service restores the snapshot and seeks to that
offset, so state and input position always agree, whatever happened to the offset commit.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
import zlib
from dataclasses import dataclass

import msgspec
from kafka import KafkaConsumer, TopicPartition

from pipeline.bus.kafka import KafkaBusProducer
from pipeline.errors import StateError

ENVELOPE_VERSION = 1


@dataclass
class Checkpoint:
    partition: int
    next_offset: int
    engine: bytes


class KafkaStateStore:
    """Checkpoints, signed with HMAC-SHA256 when ``GPUWARDEN_STATE_KEY`` is set.

    A snapshot with online models holds pickled river objects; with a key, a checkpoint that
    anyone without it wrote (or altered) is refused before anything in it is read.
    """

    def __init__(self, bootstrap: str, topic: str, group: str, source_topic: str, producer: KafkaBusProducer,
                 security: dict | None = None, key: bytes | None = None) -> None:
        self.bootstrap, self.topic, self.group, self.source = bootstrap, topic, group, source_topic
        self.producer = producer
        self.security = security or {}
        env_key = os.environ.get("GPUWARDEN_STATE_KEY")
        self.mac_key = key if key is not None else (env_key.encode() if env_key else None)

    def key(self, partition: int) -> bytes:
        return f"{self.group}/{self.source}/{partition}".encode()

    def save(self, cp: Checkpoint) -> None:
        """Queue a checkpoint; the caller's ``producer.flush()`` confirms it."""
        # zlib: snapshots are mostly NaN-filled arrays and compress ~10x, which keeps a
        # partition's state well under the topic's message size.
        engine = zlib.compress(cp.engine, 1)
        env = {"v": ENVELOPE_VERSION, "offset": cp.next_offset, "engine": engine}
        if self.mac_key is not None:
            env["mac"] = _mac(self.mac_key, cp.next_offset, engine)
        value = msgspec.msgpack.encode(env)
        self.producer.send(self.topic, value, self.key(cp.partition))

    def load(self, partitions: list[int], timeout_s: float = 30.0) -> dict[int, Checkpoint]:
        """The latest checkpoint of each of ``partitions`` (read the whole compacted topic)."""
        wanted = {self.key(p): p for p in partitions}
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                 max_partition_fetch_bytes=64 << 20, fetch_max_bytes=64 << 20, **self.security)
        try:
            parts = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not tps:
                return {}
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            end = consumer.end_offsets(tps)
            latest: dict[int, Checkpoint] = {}
            deadline = time.monotonic() + timeout_s
            while any(consumer.position(tp) < end[tp] for tp in tps):
                if time.monotonic() > deadline:
                    raise StateError(f"reading {self.topic} took over {timeout_s}s")
                for recs in consumer.poll(timeout_ms=500).values():
                    for r in recs:
                        p = wanted.get(r.key)
                        if p is None or r.value is None:
                            continue
                        latest[p] = _decode(p, r.value, self.mac_key)
            return latest
        finally:
            consumer.close(autocommit=False)


def _mac(key: bytes, offset: int, engine: bytes) -> bytes:
    return hmac.new(key, str(offset).encode() + b"|" + engine, hashlib.sha256).digest()


def _decode(partition: int, value: bytes, key: bytes | None = None) -> Checkpoint:
    try:
        env = msgspec.msgpack.decode(value)
        if env.get("v") != ENVELOPE_VERSION:
            raise StateError(f"checkpoint version {env.get('v')}")
        offset, engine = int(env["offset"]), env["engine"]
        if key is not None and not hmac.compare_digest(env.get("mac") or b"", _mac(key, offset, engine)):
            raise StateError(f"checkpoint for partition {partition} is not signed with this service's key")
        return Checkpoint(partition, offset, zlib.decompress(engine))
    except (msgspec.DecodeError, KeyError, TypeError, zlib.error) as e:
        raise StateError(f"corrupt checkpoint for partition {partition}: {e}") from e
