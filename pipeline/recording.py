"""Record a Kafka topic to JSONL, and publish a JSONL recording to Kafka paced by event time.

``record``: every message's records, one per line (a per-host array becomes one line per
record; a message that is not valid JSON is kept verbatim, so poison survives a round trip).
``publish``: lines grouped back into one message per host per second, keyed by host, sent at
``speed`` times event time (``None``: as fast as the broker takes them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import msgspec

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
    """Copy ``topic`` from the beginning to ``out`` until it has been idle for ``idle_timeout``."""
    consumer = KafkaBusConsumer(bootstrap, topic, group=None, security=security)
    msgs = lines = 0
    last = time.monotonic()
    with FileSink(out, atomic=True) as sink:
        while not should_stop():
            batch = consumer.poll(timeout=0.5, max_records=5000)
            if not batch:
                if time.monotonic() - last > idle_timeout:
                    break
                continue
            last = time.monotonic()
            for m in sorted(batch, key=lambda m: (m.partition, m.offset)):
                msgs += 1
                try:
                    obj = msgspec.json.decode(m.value)
                except msgspec.DecodeError:
                    sink.write(m.value.replace(b"\n", b" "))
                    lines += 1
                    continue
                for item in obj if isinstance(obj, list) else [obj]:
                    sink.write(_enc.encode(item))
                    lines += 1
                if max_messages is not None and msgs >= max_messages:
                    break
            if max_messages is not None and msgs >= max_messages:
                break
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
