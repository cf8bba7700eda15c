"""Apache Kafka through kafka-python: idempotent acks=all producer, manual-commit consumer.

Every send's result is checked: ``flush`` waits on each send's future and raises
``DeliveryError`` naming how many the broker did not acknowledge, so a caller never commits
input offsets for output that was lost.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import (
    CoordinatorNotAvailableError,
    KafkaError,
    MessageSizeTooLargeError,
    NotCoordinatorError,
    RecordListTooLargeError,
    TopicAlreadyExistsError,
)

from pipeline.bus import connection
from pipeline.bus.base import Message, Topics
from pipeline.errors import BrokerUnavailableError, DeliveryError

log = logging.getLogger(__name__)

# Options passed straight through to kafka-python (TLS, SASL/SCRAM; pipeline/bus/connection.py);
# values are never logged.
SECURITY_KEYS = tuple(connection.Security.__struct_fields__)


def _unavailable(bootstrap: str, err: KafkaError, security: dict[str, Any] | None = None) -> BrokerUnavailableError:
    # kafka-python says "Unable to bootstrap" for a dead broker, a TLS mismatch and a refused
    # login alike; the diagnosis tells them apart.
    return connection.unavailable(bootstrap, security, err)


def _security(options: dict[str, Any] | None) -> dict[str, Any]:
    opts = dict(options or {})
    unknown = set(opts) - set(SECURITY_KEYS)
    if unknown:
        raise ValueError(f"unknown Kafka security options: {sorted(unknown)}")
    return opts


class _Failed:
    """Stands in for the future of a send that failed before reaching the broker."""

    is_done = True

    def __init__(self, err: BaseException) -> None:
        self.err = err

    def get(self, timeout: float | None = None) -> None:
        raise self.err


def is_too_large(err: BaseException) -> bool:
    """True when a send failed because the message is larger than the client's
    ``max_request_size`` or the topic's ``max.message.bytes``: sending it again cannot succeed."""
    return isinstance(err, (MessageSizeTooLargeError, RecordListTooLargeError))


class KafkaBusProducer:
    """Idempotent, ``acks=all`` producer; ``flush`` raises unless every send was acknowledged."""

    def __init__(
        self,
        bootstrap: str,
        *,
        security: dict[str, Any] | None = None,
        linger_ms: int = 5,
        batch_size: int = 256 * 1024,
        client_id: str = "gpuwarden",
        **extra: Any,
    ) -> None:
        extra.setdefault("max_request_size", 8 * 1024 * 1024)
        try:
            self._p = KafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=linger_ms,
                batch_size=batch_size,
                client_id=client_id,
                retries=2**31 - 1,
                **_security(security),
                **{**connection.CLIENT_DEFAULTS, **extra},
            )
        except KafkaError as e:
            raise _unavailable(bootstrap, e, security) from e
        self._futures: list[Any] = []

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        try:
            self._futures.append(self._p.send(topic, value=value, key=key, partition=partition, headers=headers))
        except KafkaError as e:
            # Refused before it left (too large, buffer full past max_block_ms): reported by flush,
            # like a send the broker refused, so callers have one place to check.
            self._futures.append(_Failed(e))

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has (None when the cluster does not say)."""
        try:
            parts = self._p.partitions_for(topic)
        except KafkaError:
            return None
        return len(parts) if parts else None

    def flush_results(self, timeout: float | None = 60.0) -> list[BaseException | None]:
        """Wait for every send since the last flush; each one's error (None: acknowledged), in
        the order they were sent, so a caller can treat a refused message apart from an outage."""
        futures, self._futures = self._futures, []
        try:
            self._p.flush(timeout=timeout)
        except KafkaError as e:
            log.warning("kafka flush: %s", e)
        results: list[BaseException | None] = []
        for f in futures:
            try:
                f.get(timeout=0 if f.is_done else timeout)
                results.append(None)
            except Exception as e:  # noqa: BLE001 - every failure counts, whatever its class
                results.append(e)
        return results

    def flush(self, timeout: float | None = 60.0) -> int:
        results = self.flush_results(timeout)
        failed = [e for e in results if e is not None]
        if failed:
            raise DeliveryError(
                f"{len(failed)} of {len(results)} sends not acknowledged: {failed[0]!r}",
                failed=len(failed),
                retriable=all(getattr(e, "retriable", False) for e in failed),
            )
        return len(results)

    def close(self, timeout: float = 10.0) -> None:
        self._p.close(timeout=timeout)


class KafkaBusConsumer:
    """Manual-commit consumer of one topic in a consumer group."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str | None,
        *,
        security: dict[str, Any] | None = None,
        auto_offset_reset: str = "earliest",
        max_poll_records: int = 2000,
        client_id: str = "gpuwarden",
        **extra: Any,
    ) -> None:
        try:
            self._c = KafkaConsumer(
                topic,
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset=auto_offset_reset,
                max_poll_records=max_poll_records,
                fetch_max_bytes=64 * 1024 * 1024,
                max_partition_fetch_bytes=8 * 1024 * 1024,
                client_id=client_id,
                **_security(security),
                **{**connection.CLIENT_DEFAULTS, **connection.CONSUMER_DEFAULTS, **extra},
            )
        except KafkaError as e:
            raise _unavailable(bootstrap, e, security) from e
        if group is not None:
            know_partitions(self._c, topic)

    def poll(self, timeout: float = 1.0, max_records: int = 2000) -> list[Message]:
        batches = self._c.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        out: list[Message] = []
        for tp, recs in batches.items():
            for r in recs:
                out.append(
                    Message(
                        tp.topic,
                        tp.partition,
                        r.offset,
                        r.key,
                        r.value,
                        r.timestamp,
                        tuple(r.headers) if r.headers else None,
                    )
                )
        return out

    def commit(self) -> None:
        self._c.commit()

    def partitions(self) -> list[int]:
        """The partitions assigned to this consumer now (none before its first poll)."""
        return sorted(tp.partition for tp in self._c.assignment())

    def pending(self, partition: int) -> bool:
        """Whether ``partition`` holds messages that ``poll`` has not returned yet: its high
        watermark (from the last fetch) past this consumer's position; unknown (not fetched
        yet): True."""
        tp = next((t for t in self._c.assignment() if t.partition == partition), None)
        if tp is None:
            return False
        hw = self._c.highwater(tp)
        if hw is None:
            return True
        pos = self._c.position(tp, timeout_ms=1000)
        return pos is None or pos < hw

    def close(self) -> None:
        self._c.close(autocommit=False)

    @property
    def raw(self) -> KafkaConsumer:
        return self._c


def know_partitions(consumer: KafkaConsumer, topic: str) -> None:
    """Fetches ``topic``'s metadata before ``consumer`` first joins its group. A member that
    joins not knowing its topic's partitions is assigned none, and rejoins at its next metadata
    refresh: kafka-python 3.0 has been seen to stall that rejoin for over a minute (tests saw a
    service and a remediator read nothing). Best effort: the join itself reports a dead broker."""
    try:
        consumer.partitions_for_topic(topic)
    except KafkaError as e:
        log.debug("metadata of %s before joining: %s", topic, e)


def _admin(bootstrap: str, security: dict[str, Any] | None, timeout_s: float) -> KafkaAdminClient:
    """An admin client of the cluster; ``BrokerUnavailableError`` when none answers."""
    try:
        return KafkaAdminClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(timeout_s * 1000),
            **_security(security),
            **connection.CLIENT_DEFAULTS,
        )
    except KafkaError as e:
        raise _unavailable(bootstrap, e, security) from e


def topic_exists(
    bootstrap: str, topic: str, *, security: dict[str, Any] | None = None, timeout_s: float = 30.0
) -> bool:
    """Whether the cluster has ``topic``, asked of its admin API (a consumer's metadata request
    would have a broker that auto-creates topics make it)."""
    admin = _admin(bootstrap, security, timeout_s)
    try:
        return topic in set(admin.list_topics())
    finally:
        admin.close()


def ensure_topics(
    bootstrap: str,
    topics: Topics,
    *,
    partitions: int = 8,
    replication: int = 1,
    security: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
    fleet_partitions: int | None = None,
) -> list[str]:
    """Create the project's topics if missing (the state topic compacted); return those created.
    ``fleet_partitions``: of the fleet stage's topic (default ``partitions``)."""
    admin = _admin(bootstrap, security, timeout_s)
    try:
        existing = set(admin.list_topics())
        created = []
        for name in topics.all():
            if name in existing:
                continue
            n = fleet_partitions if name == topics.fleet and fleet_partitions else partitions
            spec: dict[str, Any] = {"num_partitions": n, "replication_factor": replication}
            if name == topics.state:
                # Latest snapshot per partition is all a restart needs; a big partition's engine
                # state can exceed the broker's default 1 MiB message limit.
                spec["configs"] = {"cleanup.policy": "compact", "max.message.bytes": str(64 * 1024 * 1024)}
            elif name == topics.fleet:
                # What the host stage forwards: up to MAX_FORWARD records a message (service/fleet.py).
                spec["configs"] = {"max.message.bytes": str(8 * 1024 * 1024)}
            try:
                admin.create_topics({name: spec}, wait_for_metadata=True)
                created.append(name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        admin.close()


def group_view(bootstrap: str, group: str) -> tuple[str, dict[str, tuple]]:
    """What the broker says of ``group``: its state and each member's partitions ("Unknown"
    while no coordinator answers: a new broker makes its offsets topic at the first group).
    For drivers that wait for a group of replicas: the real-broker tests and benchmarks."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **connection.CLIENT_DEFAULTS)
    try:
        g = admin.describe_groups([group]).get(group) or {}
    except (CoordinatorNotAvailableError, NotCoordinatorError):
        return "Unknown", {}
    finally:
        admin.close()
    held: dict[str, tuple] = {}
    for m in g.get("members") or []:
        a = m.get("member_assignment")
        tps = a.get("assigned_partitions", []) if isinstance(a, dict) else []
        held[m["member_id"]] = tuple(sorted((t["topic"], p) for t in tps for p in t["partitions"]))
    return str(g.get("group_state")), held


def group_settled(bootstrap: str, group: str, members: int, hold_s: float = 5.0) -> bool:
    """``group`` is Stable with ``members`` members, each holding partitions, and stays so,
    unchanged, for ``hold_s``: a group that keeps rebalancing (a member re-joining after every
    assignment, as a loaded machine has shown for ~15 s) is not settled yet."""
    state, held = group_view(bootstrap, group)
    if state != "Stable" or len(held) != members or not all(held.values()):
        return False
    time.sleep(hold_s)
    return group_view(bootstrap, group) == (state, held)
