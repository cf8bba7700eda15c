"""A consumer-group member of one topic: what the service needs from Kafka, and nothing else.

``GroupConsumer`` is the seam between the service's commit protocol (pipeline/service/commit.py)
and a bus: ``KafkaGroupConsumer`` here runs it on kafka-python, ``MemoryGroupConsumer``
(pipeline/bus/memory.py) in process, so the protocol's crash and rebalance cases get fast unit
tests beside the real-broker fault suite (tests/faults/).

The contract every implementation keeps:

* ``poll`` returns messages grouped by partition, each partition's in offset order, only from
  partitions that are assigned and not paused.
* Assignment, revocation and loss callbacks run only while the caller is inside ``poll`` or
  ``close``, never concurrently with the caller's own work, so they may touch the caller's state
  without a lock. Revocation runs before the partition's next owner is assigned it (the state a
  revoke callback saves is what that owner loads); loss (the group moved on without us, e.g.
  after a long pause) gives no such guarantee, so nothing should be saved on it.
* Inside a callback only ``seek``, ``pause``, ``resume`` and ``assignment`` may be called; on
  kafka-python the callbacks run on its network thread, where a blocking consumer call
  (``commit``, ``end_offsets``) cannot complete.
* ``commit`` is synchronous and explicit (no auto-commit) and raises ``BusError`` when the broker
  did not take it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, Protocol

from pipeline.bus.base import Message
from pipeline.errors import BusError

log = logging.getLogger(__name__)

Partitions = Callable[[list[int]], None]


class GroupConsumer(Protocol):
    """One member of a consumer group reading one topic (see the module docstring)."""

    topic: str

    def subscribe(self, on_assigned: Partitions, on_revoked: Partitions, on_lost: Partitions | None = None) -> None:
        """Join the group; the callbacks get partition numbers, in ``poll`` or ``close``."""

    def poll(self, timeout_s: float, max_records: int) -> dict[int, list[Message]]:
        """Up to ``max_records`` messages by partition; ``{}`` after ``timeout_s`` with none."""

    def assignment(self) -> set[int]:
        """The partitions this member holds now."""

    def pause(self, partitions: Iterable[int]) -> None:
        """Stop returning messages of these partitions (still assigned; heartbeats go on)."""

    def resume(self, partitions: Iterable[int]) -> None: ...

    def seek(self, partition: int, offset: int) -> None:
        """The next message ``poll`` returns of ``partition`` is the one at ``offset``."""

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit, per partition, the offset of the next message to read; ``BusError`` if refused."""

    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """The offset the next message produced to each partition will get."""

    def beginning_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """The offset of the first message each partition still holds (retention deletes older)."""

    def close(self) -> None:
        """Leave the group (revocation callbacks run first) without committing anything."""


def _bus_error(message: str, cause: BaseException) -> BusError:
    err = BusError(message)
    err.retriable = bool(getattr(cause, "retriable", False))
    return err


class KafkaGroupConsumer:
    """``GroupConsumer`` on kafka-python's ``KafkaConsumer`` (manual commits, eager rebalances).

    kafka-python (3.x) calls rebalance listeners on its network thread while the thread that
    called ``poll`` waits for it, so the callbacks see the caller's state at rest; a listener that
    blocks (a checkpoint waiting for the broker) delays the rebalance, which is what a save on
    revoke needs: the group does not hand the partition on until the listener returned.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        *,
        security: dict[str, Any] | None = None,
        client_id: str = "gpuwarden",
        **options: Any,
    ) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        from pipeline.bus.connection import CLIENT_DEFAULTS, CONSUMER_DEFAULTS
        from pipeline.bus.kafka import _security, _unavailable

        self.topic = topic
        self._KafkaError = KafkaError
        try:
            self._c = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                client_id=client_id,
                **_security(security),
                **{**CLIENT_DEFAULTS, **CONSUMER_DEFAULTS, **options},
            )
        except KafkaError as e:
            raise _unavailable(bootstrap, e, security) from e

    def _tp(self, partition: int) -> Any:
        from kafka import TopicPartition

        return TopicPartition(self.topic, partition)

    def subscribe(self, on_assigned: Partitions, on_revoked: Partitions, on_lost: Partitions | None = None) -> None:
        from kafka import ConsumerRebalanceListener

        from pipeline.bus.kafka import know_partitions

        def numbers(tps: Iterable[Any]) -> list[int]:
            return sorted(tp.partition for tp in tps if tp.topic == self.topic)

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                on_revoked(numbers(revoked))

            def on_partitions_assigned(self, assigned: Any) -> None:
                on_assigned(numbers(assigned))

            def on_partitions_lost(self, lost: Any) -> None:
                (on_lost or on_revoked)(numbers(lost))

        know_partitions(self._c, self.topic)
        self._c.subscribe([self.topic], listener=Listener())

    def poll(self, timeout_s: float, max_records: int) -> dict[int, list[Message]]:
        try:
            batch = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except self._KafkaError as e:
            raise _bus_error(f"poll of {self.topic} failed: {e}", e) from e
        out: dict[int, list[Message]] = {}
        for tp, recs in batch.items():
            # Message is built here, once per record: the fields are read from kafka-python's
            # ConsumerRecord as they are, no copies of key or value.
            out[tp.partition] = [
                Message(
                    tp.topic,
                    tp.partition,
                    r.offset,
                    r.key,
                    r.value,
                    r.timestamp,
                    tuple(r.headers) if r.headers else None,
                )
                for r in recs
            ]
        return out

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._c.assignment() if tp.topic == self.topic}

    def pause(self, partitions: Iterable[int]) -> None:
        self._c.pause(*[self._tp(p) for p in partitions])

    def resume(self, partitions: Iterable[int]) -> None:
        self._c.resume(*[self._tp(p) for p in partitions])

    def seek(self, partition: int, offset: int) -> None:
        self._c.seek(self._tp(partition), offset)

    def commit(self, offsets: Mapping[int, int]) -> None:
        from kafka import OffsetAndMetadata

        if not offsets:
            return
        try:
            self._c.commit({self._tp(p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
        except self._KafkaError as e:
            raise _bus_error(f"offset commit of {self.topic} failed: {e}", e) from e

    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        tps = [self._tp(p) for p in partitions]
        try:
            return {tp.partition: o for tp, o in self._c.end_offsets(tps).items()}
        except self._KafkaError as e:
            raise _bus_error(f"end offsets of {self.topic}: {e}", e) from e

    def beginning_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        tps = [self._tp(p) for p in partitions]
        try:
            return {tp.partition: o for tp, o in self._c.beginning_offsets(tps).items()}
        except self._KafkaError as e:
            raise _bus_error(f"beginning offsets of {self.topic}: {e}", e) from e

    def close(self) -> None:
        try:
            self._c.close(autocommit=False)
        except self._KafkaError as e:  # leaving a group the broker already dropped us from
            log.warning("closing the consumer of %s: %s", self.topic, e)
