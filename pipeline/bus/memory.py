"""An in-process bus with Kafka's shape (topics, keyed partitions, offsets, consumer groups).

For the demo and unit tests only: integration tests use a real broker.
"""

from __future__ import annotations

import threading
import zlib

from pipeline.bus.base import Message


class MemoryBus:
    def __init__(self, partitions: int = 4) -> None:
        self.partitions = partitions
        self._logs: dict[str, list[list[Message]]] = {}
        self._committed: dict[tuple[str, str], list[int]] = {}
        self._lock = threading.Lock()

    def _topic(self, topic: str) -> list[list[Message]]:
        if topic not in self._logs:
            self._logs[topic] = [[] for _ in range(self.partitions)]
        return self._logs[topic]

    def append(self, topic: str, value: bytes, key: bytes | None) -> Message:
        with self._lock:
            parts = self._topic(topic)
            # Same key -> same partition, like Kafka's keyed partitioner: a host's GPUs stay ordered.
            p = zlib.crc32(key) % self.partitions if key is not None else sum(map(len, parts)) % self.partitions
            msg = Message(topic, p, len(parts[p]), key, value)
            parts[p].append(msg)
            return msg

    def messages(self, topic: str) -> list[Message]:
        """Every message of a topic, partition by partition (for tests and the demo summary)."""
        with self._lock:
            return [m for part in self._topic(topic) for m in part]

    def producer(self) -> "MemoryProducer":
        return MemoryProducer(self)

    def consumer(self, topic: str, group: str) -> "MemoryConsumer":
        return MemoryConsumer(self, topic, group)


class MemoryProducer:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self._queued = 0

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.bus.append(topic, value, key)
        self._queued += 1

    def flush(self, timeout: float | None = None) -> int:
        n, self._queued = self._queued, 0
        return n

    def close(self) -> None:
        pass


class MemoryConsumer:
    def __init__(self, bus: MemoryBus, topic: str, group: str) -> None:
        self.bus, self.topic, self.group = bus, topic, group
        with bus._lock:
            committed = bus._committed.setdefault((group, topic), [0] * bus.partitions)
        self._position = list(committed)
        self._next = 0

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Message]:
        out: list[Message] = []
        with self.bus._lock:
            parts = self.bus._topic(self.topic)
            # Round-robin over partitions so no partition starves, as Kafka's fetcher does.
            for k in range(self.bus.partitions):
                p = (self._next + k) % self.bus.partitions
                take = parts[p][self._position[p]: self._position[p] + max_records - len(out)]
                out.extend(take)
                self._position[p] += len(take)
                if len(out) >= max_records:
                    break
            self._next = (self._next + 1) % self.bus.partitions
        return out

    def commit(self) -> None:
        with self.bus._lock:
            self.bus._committed[(self.group, self.topic)] = list(self._position)

    def lag(self) -> int:
        with self.bus._lock:
            return sum(len(p) - pos for p, pos in zip(self.bus._topic(self.topic), self._position))

    def close(self) -> None:
        pass


