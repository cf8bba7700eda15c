"""Record a Kafka topic to JSONL, and publish a JSONL recording to Kafka paced by event time.

``record``: every message's records, one per line (a per-host array becomes one line per
record, a columnar message its rows as JSON records; a message that is neither is kept verbatim,
so poison survives a round trip), the partitions merged by the messages' Kafka timestamps
(``PartitionMerge``), so that the file runs in the order the fleet sent it and replays without
going back in time.
``publish``: lines grouped back into one message per host per second, keyed by host, sent at
``speed`` times event time (``None``: as fast as the broker takes them).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import msgspec

from pipeline import colwire
from pipeline.bus.base import Message
from pipeline.bus.files import FileSink, read_merged
from pipeline.bus.kafka import KafkaBusConsumer, KafkaBusProducer
from pipeline.bus.publish import Pacer, send_paced
from pipeline.bus.telemetry import recorded_messages

log = logging.getLogger(__name__)
_enc = msgspec.json.Encoder()


@dataclass
class RecordResult:
    messages: int
    lines: int


#: Messages a merge holds at most while waiting for a partition that has not caught up: past it,
#: the earliest waiting goes (a partition far behind costs order, not memory).
MERGE_LIMIT = 100_000
MERGE_LIMIT_BYTES = 256 * 1024 * 1024  # and bytes: a message may be up to the broker's 8 MiB


class PartitionMerge:
    """A topic's messages in one order across its partitions: by Kafka timestamp (the producer's
    send time, or the broker's append time), each partition's in offset order, ties by partition
    and offset. A message goes once no partition that may still hold an earlier one is waiting to
    be fetched (``pending``), or once more than ``limit`` messages (or ``limit_bytes``) wait.

    >>> m = PartitionMerge()
    >>> m.add([Message("t", 1, 0, None, b"b", 2000), Message("t", 0, 0, None, b"a", 1000)])
    >>> [x.value for x in m.ready([0, 1], pending=lambda p: False)]
    [b'a', b'b']
    >>> m.add([Message("t", 1, 1, None, b"c", 3000)])
    >>> [x.value for x in m.ready([0, 1], pending=lambda p: p == 0)]  # partition 0 not fetched
    []
    >>> [x.value for x in m.rest()]
    [b'c']
    """

    def __init__(self, limit: int = MERGE_LIMIT, limit_bytes: int = MERGE_LIMIT_BYTES) -> None:
        self.limit, self.limit_bytes = limit, limit_bytes
        self._bytes = 0
        self._q: dict[int, deque[Message]] = {}
        self._heap: list[tuple[int, int, int]] = []  # (timestamp, partition, offset) of each queue's head
        self._n = 0

    @staticmethod
    def _key(m: Message) -> tuple[int, int, int]:
        return (m.timestamp_ms if m.timestamp_ms is not None else -1, m.partition, m.offset)

    def __len__(self) -> int:
        return self._n

    def add(self, msgs: Iterable[Message]) -> None:
        """Messages as a poll returned them (each partition's in offset order)."""
        for m in msgs:
            q = self._q.setdefault(m.partition, deque())
            if not q:
                heapq.heappush(self._heap, self._key(m))
            q.append(m)
            self._n += 1
            self._bytes += len(m.value)

    def ready(self, partitions: Iterable[int], pending: Callable[[int], bool]) -> Iterator[Message]:
        """The messages that can go now, in order: while every partition of ``partitions``
        without a message waiting has nothing left to fetch (``pending`` False)."""
        blocked = {p for p in partitions if not self._q.get(p) and pending(p)}
        while self._heap and (not blocked or self._n > self.limit or self._bytes > self.limit_bytes):
            m = self._pop()
            if not self._q[m.partition] and pending(m.partition):
                blocked.add(m.partition)
            yield m

    def rest(self) -> Iterator[Message]:
        """Every message still waiting, in order (the end of a recording)."""
        while self._heap:
            yield self._pop()

    def _pop(self) -> Message:
        _, p, _ = heapq.heappop(self._heap)
        q = self._q[p]
        m = q.popleft()
        self._n -= 1
        self._bytes -= len(m.value)
        if q:
            heapq.heappush(self._heap, self._key(q[0]))
        return m


def _lines(m: Message) -> list[bytes]:
    """What ``record`` writes of message ``m``: a line per record, or the message verbatim."""
    if colwire.is_columnar(m.headers):
        try:
            return [_enc.encode(r) for r in colwire.records(m.value)]
        except colwire.ColumnsError:
            return [m.value.replace(b"\n", b" ")]
    try:
        obj = msgspec.json.decode(m.value)
    except msgspec.DecodeError:
        return [m.value.replace(b"\n", b" ")]
    return [_enc.encode(item) for item in (obj if isinstance(obj, list) else [obj])]


def record(
    bootstrap: str,
    topic: str,
    out: str,
    *,
    idle_timeout: float = 5.0,
    max_messages: int | None = None,
    security: dict | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> RecordResult:
    """Copy ``topic`` from the beginning to ``out`` until it has been idle for ``idle_timeout``,
    its partitions merged by Kafka timestamp (``PartitionMerge``)."""
    consumer = KafkaBusConsumer(bootstrap, topic, group=None, security=security)
    merge = PartitionMerge()
    msgs = lines = 0
    last = time.monotonic()
    with FileSink(out, atomic=True) as sink:

        def write(ms: Iterable[Message]) -> bool:
            """Write ``ms``; False once ``max_messages`` are written."""
            nonlocal msgs, lines
            for m in ms:
                for line in _lines(m):
                    sink.write(line)
                    lines += 1
                msgs += 1
                if max_messages is not None and msgs >= max_messages:
                    return False
            return True

        going = True
        while going and not should_stop():
            batch = consumer.poll(timeout=0.5, max_records=5000)
            if batch:
                last = time.monotonic()
                merge.add(batch)
            elif time.monotonic() - last > idle_timeout:
                break
            going = write(merge.ready(consumer.partitions(), consumer.pending))
        if going:
            write(merge.rest())
    consumer.close()
    return RecordResult(msgs, lines)


def publish(
    paths: list[str],
    bootstrap: str,
    topic: str,
    *,
    speed: float | None = None,
    security: dict | None = None,
    problems: list[str] | None = None,
) -> int:
    """Send a recording to ``topic``; returns the number of messages sent. A file that cannot be
    read whole is named in ``problems`` (default: logged) and the others are still sent, as
    ``gpuwarden replay`` replays them; several files are merged in event time, as replay reads them."""
    told: list[str] = [] if problems is None else problems
    producer = KafkaBusProducer(bootstrap, security=security)
    try:
        sent = send_paced(producer, topic, recorded_messages(read_merged(paths, told)), pacer=Pacer(speed))
    finally:
        producer.close()
    if problems is None:
        for p in told:
            log.warning("%s", p)
    return sent
