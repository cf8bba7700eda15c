#!/usr/bin/env python3
"""Readiness probe for the test Kafka broker started by ``scripts/kafka``.

A broker is "ready" when a real client round trip succeeds: create the topic
``_gpuwarden_ready`` (1 partition, RF 1; "already exists" is fine), produce a
unique message with ``acks=all``, and consume that exact message back.
Attempts are retried until ``--timeout`` seconds have passed.

Exit status: 0 ready, 1 not ready by the deadline, 2 kafka-python missing.

Uses the kafka-python 3.x API (``kafka-python>=3.0,<4``). Topics are created
with the dict form of ``KafkaAdminClient.create_topics`` (``NewTopic`` is
deprecated in 3.x).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

try:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import TopicAlreadyExistsError
except ImportError as exc:  # pragma: no cover - environment problem
    print(f"kafka_ready: cannot import kafka-python ({exc}); "
          f"install 'kafka-python>=3.0,<4' into {sys.executable}", file=sys.stderr)
    sys.exit(2)

TOPIC = "_gpuwarden_ready"


def _cfg(cls, **kwargs):
    """Drop settings this kafka-python version does not know (it rejects them)."""
    known = getattr(cls, "DEFAULT_CONFIG", None)
    if known is None:
        return kwargs
    return {k: v for k, v in kwargs.items() if k in known}


def _close(client) -> None:
    if client is None:
        return
    try:
        client.close()
    except Exception:  # noqa: BLE001 - best effort during cleanup
        pass


def round_trip(bootstrap: str, topic: str, budget_s: float) -> str:
    """One readiness attempt; returns a description, raises on any failure."""
    # Per-request timeout: leave room inside the attempt budget, but never
    # below what the clients accept (request_timeout_ms > fetch_max_wait_ms).
    req_ms = int(max(2.0, min(budget_s, 15.0)) * 1000)
    common = dict(bootstrap_servers=bootstrap, client_id="gpuwarden-ready",
                  request_timeout_ms=req_ms)
    admin = producer = consumer = None
    try:
        admin = KafkaAdminClient(**_cfg(KafkaAdminClient, bootstrap_timeout_ms=req_ms, **common))
        try:
            admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}},
                                timeout_ms=req_ms, wait_for_metadata=True)
        except TopicAlreadyExistsError:
            pass  # KAFKA_KEEP_DATA=1 or a previous attempt got this far
        _close(admin)
        admin = None

        token = f"ready-{uuid.uuid4().hex}".encode()
        producer = KafkaProducer(**_cfg(KafkaProducer, acks="all", max_block_ms=req_ms,
                                        retries=3, linger_ms=0, **common))
        md = producer.send(topic, key=b"ready", value=token, partition=0).get(timeout=budget_s)
        producer.flush(timeout=budget_s)
        _close(producer)
        producer = None

        tp = TopicPartition(topic, md.partition)
        consumer = KafkaConsumer(**_cfg(KafkaConsumer, group_id=None, enable_auto_commit=False,
                                        auto_offset_reset="earliest", **common))
        consumer.assign([tp])
        consumer.seek(tp, md.offset)
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for rec in records:
                    if rec.value == token:
                        return f"{topic}[{md.partition}]@{md.offset}"
        raise TimeoutError(f"produced {topic}[{md.partition}]@{md.offset} but did not consume it "
                           f"back within {budget_s:.0f}s")
    finally:
        _close(consumer)
        _close(producer)
        _close(admin)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092", help="host:port (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="give up after this many seconds (default %(default)s)")
    ap.add_argument("--topic", default=TOPIC, help="probe topic (default %(default)s)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    args = ap.parse_args(argv)

    start = time.monotonic()
    deadline = start + args.timeout
    attempt, last_err = 0, None
    while True:
        attempt += 1
        remaining = deadline - time.monotonic()
        try:
            where = round_trip(args.bootstrap, args.topic, budget_s=max(remaining, 1.0))
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_err = f"{type(exc).__name__}: {exc}"
        else:
            if not args.quiet:
                print(f"kafka_ready: round trip ok via {args.bootstrap} ({where}, "
                      f"attempt {attempt}, {time.monotonic() - start:.1f}s)")
            return 0
        if time.monotonic() + 1.0 >= deadline:
            break
        time.sleep(1.0)
    print(f"kafka_ready: {args.bootstrap} not ready after {args.timeout:.0f}s "
          f"({attempt} attempts); last error: {last_err}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
