"""Every Kafka client the product makes reconnects within seconds after a broker comes back,
not after kafka-python's default back-off of up to 30 s (pipeline/bus/connection.py CLIENT_DEFAULTS):
the clients' own configuration, as built against a real broker."""

from __future__ import annotations

import pytest

from pipeline.bus.group import KafkaGroupConsumer
from pipeline.bus.kafka import KafkaBusConsumer, KafkaBusProducer

pytestmark = pytest.mark.kafka


def test_every_client_caps_its_reconnect_back_off(kafka_bootstrap, topic_prefix):
    producer = KafkaBusProducer(kafka_bootstrap)
    consumer = KafkaBusConsumer(kafka_bootstrap, f"{topic_prefix}.t", None)
    group = KafkaGroupConsumer(kafka_bootstrap, f"{topic_prefix}.t", f"{topic_prefix}-g")
    try:
        for client in (producer._p, consumer._c, group._c):
            assert client.config["reconnect_backoff_max_ms"] <= 5000, type(client)
    finally:
        producer.close()
        consumer.close()
        group.close()
    # An explicit setting still wins.
    p = KafkaBusProducer(kafka_bootstrap, reconnect_backoff_max_ms=10_000)
    try:
        assert p._p.config["reconnect_backoff_max_ms"] == 10_000
    finally:
        p.close()
