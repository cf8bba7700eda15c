"""An in-process bus with Kafka's shape (topics, keyed partitions, offsets, consumer groups,
group members with rebalances).

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
        self._groups: dict[tuple[str, str], _Group] = {}
        self._lock = threading.Lock()

    def _topic(self, topic: str) -> list[list[Message]]:
        if topic not in self._logs:
            self._logs[topic] = [[] for _ in range(self.partitions)]
        return self._logs[topic]

    def append(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Message:
        with self._lock:
            parts = self._topic(topic)
            # Same key -> same partition, like Kafka's keyed partitioner: a host's GPUs stay ordered.
            if partition is not None:
                p = partition % self.partitions
            else:
                p = zlib.crc32(key) % self.partitions if key is not None else sum(map(len, parts)) % self.partitions
            msg = Message(topic, p, len(parts[p]), key, value, None, tuple(headers) if headers else None)
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

    def group_consumer(self, topic: str, group: str) -> "MemoryGroupConsumer":
        """A member of ``group`` on ``topic`` (pipeline/bus/group.py's ``GroupConsumer``)."""
        return MemoryGroupConsumer(self, topic, group)


class MemoryProducer:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self._queued = 0

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.bus.append(topic, value, key, partition, headers)
        self._queued += 1

    def partition_count(self, topic: str) -> int | None:
        return self.bus.partitions

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
                take = parts[p][self._position[p] : self._position[p] + max_records - len(out)]
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


class _Group:
    """One consumer group's members and who owns which partition of its topic."""

    def __init__(self, partitions: int) -> None:
        self.members: list["MemoryGroupConsumer"] = []
        self.owner: dict[int, "MemoryGroupConsumer | None"] = dict.fromkeys(range(partitions))
        self.target: dict[int, "MemoryGroupConsumer | None"] = dict.fromkeys(range(partitions))

    def rebalance(self) -> None:
        # Round-robin over the members in join order, like Kafka's RoundRobinAssignor.
        for p in self.target:
            self.target[p] = self.members[p % len(self.members)] if self.members else None


class MemoryGroupConsumer:
    """``GroupConsumer`` (pipeline/bus/group.py) on a ``MemoryBus``: eager rebalances in process.

    A member that joins or leaves moves partitions at the next ``poll`` of each member: the old
    owner's revocation callback runs in its ``poll`` (or ``close``) first, and only then does the
    new owner's ``poll`` assign it, from the group's committed offset, as Kafka does. ``crash()``
    leaves the group the way kill -9 does: no callback, nothing saved, its partitions move on.
    """

    def __init__(self, bus: MemoryBus, topic: str, group: str) -> None:
        self.bus, self.topic, self.group = bus, topic, group
        self._assigned: set[int] = set()
        self._paused: set[int] = set()
        self._position: dict[int, int] = {}
        self._cb: tuple = (None, None, None)
        self._turn = 0
        self.closed = False

    def _group(self) -> _Group:
        return self.bus._groups.setdefault((self.group, self.topic), _Group(self.bus.partitions))

    def subscribe(self, on_assigned, on_revoked, on_lost=None) -> None:  # noqa: ANN001 - see GroupConsumer
        self._cb = (on_assigned, on_revoked, on_lost)
        with self.bus._lock:
            g = self._group()
            g.members.append(self)
            g.rebalance()

    def _sync(self) -> None:
        """Run this member's part of a pending rebalance (callbacks outside the bus lock)."""
        on_assigned, on_revoked, _ = self._cb
        with self.bus._lock:
            g = self._group()
            revoked = sorted(p for p in self._assigned if g.target[p] is not self)
        if revoked:
            on_revoked(revoked)
            with self.bus._lock:
                for p in revoked:
                    self._group().owner[p] = None
                    self._position.pop(p, None)
                self._assigned -= set(revoked)
                self._paused -= set(revoked)
        with self.bus._lock:
            g = self._group()
            committed = self.bus._committed.setdefault((self.group, self.topic), [0] * self.bus.partitions)
            added = sorted(p for p, t in g.target.items() if t is self and g.owner[p] is None)
            for p in added:
                g.owner[p] = self
                self._position[p] = committed[p]
            self._assigned |= set(added)
        if added:
            on_assigned(added)

    def poll(self, timeout_s: float = 0.0, max_records: int = 500) -> dict[int, list[Message]]:
        if self.closed:
            raise RuntimeError("poll after close")
        self._sync()
        out: dict[int, list[Message]] = {}
        n = 0
        with self.bus._lock:
            parts = self.bus._topic(self.topic)
            ready = sorted(self._assigned - self._paused)
            # Each poll starts at the next partition, as Kafka's fetcher rotates, so none starves.
            self._turn += 1
            for k in range(len(ready)):
                p = ready[(self._turn + k) % len(ready)]
                take = parts[p][self._position[p] : self._position[p] + max_records - n]
                if take:
                    out[p] = take
                    self._position[p] += len(take)
                    n += len(take)
                if n >= max_records:
                    break
        return out

    def assignment(self) -> set[int]:
        return set(self._assigned)

    def pause(self, partitions) -> None:  # noqa: ANN001
        self._paused |= set(partitions) & self._assigned

    def resume(self, partitions) -> None:  # noqa: ANN001
        self._paused -= set(partitions)

    def seek(self, partition: int, offset: int) -> None:
        if partition not in self._assigned:
            raise ValueError(f"partition {partition} is not assigned to this member")
        self._position[partition] = offset

    def commit(self, offsets) -> None:  # noqa: ANN001
        with self.bus._lock:
            committed = self.bus._committed.setdefault((self.group, self.topic), [0] * self.bus.partitions)
            for p, o in offsets.items():
                if self._group().owner.get(p) is not self:
                    from pipeline.errors import BusError

                    raise BusError(f"commit for partition {p}, which this member does not own")
                committed[p] = o

    def committed(self) -> dict[int, int]:
        """The group's committed offsets (for tests)."""
        with self.bus._lock:
            return dict(enumerate(self.bus._committed.get((self.group, self.topic), [0] * self.bus.partitions)))

    def end_offsets(self, partitions) -> dict[int, int]:  # noqa: ANN001
        with self.bus._lock:
            parts = self.bus._topic(self.topic)
            return {p: len(parts[p]) for p in partitions}

    def beginning_offsets(self, partitions) -> dict[int, int]:  # noqa: ANN001
        return {p: 0 for p in partitions}  # the in-process bus deletes nothing

    def _leave(self, callback: bool) -> None:
        if self.closed:
            return
        if callback and self._assigned:
            self._cb[1](sorted(self._assigned))
        with self.bus._lock:
            g = self._group()
            if self in g.members:
                g.members.remove(self)
            for p in self._assigned:
                g.owner[p] = None
            g.rebalance()
        self._assigned.clear()
        self._position.clear()
        self.closed = True

    def close(self) -> None:
        self._leave(callback=True)

    def crash(self) -> None:
        """Leave as a killed process does: no revocation callback, nothing committed."""
        self._leave(callback=False)
