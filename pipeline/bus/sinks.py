"""Where engine output goes: one interface for alerts and dead letters, on files or a bus.

Every driver writes what its engine says through an ``OutputSink``: ``gpuwarden replay``
(``FileOutput``: ``--alerts-out``, ``--dlq-out``), the demo (``BusOutput`` on the in-process
bus) and the service (``BusOutput`` on Kafka, whose ``flush`` is the "wait for every ack" step of
its commit protocol, docs/architecture.md §8). The encoding (``pipeline.schema.encode``) and the
keys (the host, so an entity's alerts stay ordered on one partition) are the same on every sink.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

from pipeline.bus.base import Producer, Topics
from pipeline.bus.files import FileSink
from pipeline.bus.memory import MemoryBus
from pipeline.schema import AlertEvent, DeadLetter, encode


class OutputSink(Protocol):
    """Alerts and dead letters out of an engine. ``flush`` returns once everything written so far
    has arrived, or raises (``DeliveryError`` on a bus); ``close`` flushes what a file holds and
    releases the sink."""

    def alerts(self, events: Sequence[AlertEvent]) -> None: ...

    def dead(self, letters: Sequence[DeadLetter]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def _key(host: str | None) -> bytes:
    return (host or "").encode()


class BusOutput:
    """Alerts to ``<prefix>.alerts``, dead letters to ``<prefix>.dlq`` through any ``Producer``:
    the in-process bus (``MemoryBus.producer()``) or Kafka (``KafkaBusProducer``, or ``kafka``
    below), keyed by host. ``flush`` is the producer's: on Kafka it waits on every send and
    raises ``DeliveryError`` unless all were acknowledged."""

    def __init__(self, producer: Producer, topics: Topics) -> None:
        self.producer = producer
        self.topics = topics

    @classmethod
    def kafka(
        cls, bootstrap: str, topics: Topics, *, security: dict[str, Any] | None = None, **options: Any
    ) -> "BusOutput":
        """On a new idempotent ``acks=all`` Kafka producer (``pipeline/bus/kafka.py``)."""
        from pipeline.bus.kafka import KafkaBusProducer

        return cls(KafkaBusProducer(bootstrap, security=security, **options), topics)

    @classmethod
    def memory(cls, bus: MemoryBus, topics: Topics) -> "BusOutput":
        """On a producer of the in-process bus (the demo, unit tests)."""
        return cls(bus.producer(), topics)

    def alerts(self, events: Sequence[AlertEvent]) -> None:
        """Queue each alert event on the alerts topic."""
        for a in events:
            self.producer.send(self.topics.alerts, encode(a), _key(a.host))

    def dead(self, letters: Sequence[DeadLetter]) -> None:
        """Queue each dead letter on the dead-letter topic."""
        for d in letters:
            self.producer.send(self.topics.dlq, encode(d), _key(d.host))

    def flush(self) -> None:
        """Wait until the bus acknowledged everything queued; raises ``DeliveryError`` if not."""
        self.producer.flush()

    def close(self) -> None:
        """Close the producer (it is this sink's, or shared with what the caller closes with it)."""
        self.producer.close()


class FileOutput:
    """Alerts and dead letters as JSONL files (``.gz`` compressed, ``-`` standard output), one
    document a line; either path may be None (not written). Written to a temporary file and
    renamed into place on ``close``, so a reader never sees half a run's output."""

    def __init__(
        self, alerts_path: str | Path | None = None, dlq_path: str | Path | None = None, *, atomic: bool = True
    ) -> None:
        self._alerts = FileSink(alerts_path, atomic=atomic) if alerts_path else None
        self._dead = FileSink(dlq_path, atomic=atomic) if dlq_path else None

    def alerts(self, events: Sequence[AlertEvent]) -> None:
        """Append each alert event as a line."""
        if self._alerts is not None:
            self._alerts.write_many(encode(a) for a in events)

    def dead(self, letters: Sequence[DeadLetter]) -> None:
        """Append each dead letter as a line."""
        if self._dead is not None:
            self._dead.write_many(encode(d) for d in letters)

    def flush(self) -> None:
        """Push what was written to the OS (a tailing reader of a non-atomic file sees it)."""
        for sink in (self._alerts, self._dead):
            if sink is not None:
                sink.flush()

    def close(self) -> None:
        """Close both files, renaming each into place; the dead letters even if the alerts fail."""
        try:
            if self._alerts is not None:
                self._alerts.close()
        finally:
            if self._dead is not None:
                self._dead.close()

    def __enter__(self) -> "FileOutput":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
