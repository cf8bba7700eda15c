"""What every bus (Kafka, in-process, files) offers: messages with an origin, topics by prefix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol


FILE_PARTITION = -1


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = None
    # Kafka record headers, (name, value) pairs; what says a telemetry message's encoding
    # (pipeline/colwire.py). None: none (a file line, or a record without headers).
    headers: tuple[tuple[str, bytes], ...] | None = None

    @property
    def origin(self) -> str:
        """Where the message came from, as logs and dead letters name it.

        ``topic[partition]@offset`` for a bus, ``file:line`` for a file (partition -1).
        """
        if self.partition == FILE_PARTITION:
            return f"{self.topic}:{self.offset}"
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class Topics:
    """The project's topics under one prefix (docs/architecture.md §1)."""

    prefix: str = "gpuwarden"

    @property
    def telemetry(self) -> str:
        return f"{self.prefix}.telemetry"

    @property
    def alerts(self) -> str:
        return f"{self.prefix}.alerts"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def audit(self) -> str:
        return f"{self.prefix}.audit"

    @property
    def state(self) -> str:
        return f"{self.prefix}.state"

    @property
    def fleet(self) -> str:
        """The repartition topic from the host stage to the fleet stage (pipeline/topology.py)."""
        return f"{self.prefix}.fleet"

    @property
    def incidents(self) -> str:
        """The incident events of the service's fleet stage (pipeline/incidents/)."""
        return f"{self.prefix}.incidents"

    def all(self) -> list[str]:
        return [self.telemetry, self.alerts, self.dlq, self.audit, self.state, self.fleet, self.incidents]


class Producer(Protocol):
    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Queue a message (to ``partition``, else the key's) with ``headers``; ``flush`` raises
        if any queued send was not acknowledged."""

    def flush(self, timeout: float | None = None) -> int:
        """Wait for every queued send; return how many were delivered."""

    def close(self) -> None: ...


class Consumer(Protocol):
    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Message]: ...

    def commit(self) -> None:
        """Commit the offsets of everything returned by ``poll`` so far."""

    def close(self) -> None: ...


def send_all(producer: Producer, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> int:
    """Send (key, value) pairs and wait until the broker acknowledged every one."""
    for key, value in items:
        producer.send(topic, value, key)
    return producer.flush()
