"""A producer through a real broker outage and recovery, without touching the shared broker.

The outage is made in front of it: a TCP proxy on 127.0.0.1 that first refuses (accepts and
closes every connection), then forwards to the real broker. The producer bootstraps through
the proxy; after a failure it rebuilds its Kafka client, so recovery goes through the proxy
again. (Once bootstrapped, kafka-python talks to the broker's advertised address directly,
which is why the outage phase comes before the first successful connection.) A port where
nothing listens is the other outage: the source keeps being polled, the buffer stays bounded.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusConsumer, ensure_topics
from pipeline.colwire import is_columnar
from pipeline.decode import Decoder
from producers.common import BoundedSender, KafkaSink, run
from producers.dcgm_exporter import parse_metrics

pytestmark = pytest.mark.kafka

from tests.factories import T0, SHARED_DATA as DATA  # noqa: E402
from tests.integration.scrape_factories import ScrapeSource  # noqa: E402


class Proxy:
    """127.0.0.1 TCP proxy to ``target``; ``forward=False`` accepts and drops every connection."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.forward = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.refused = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if not self.forward:
                self.refused += 1
                c.close()
                continue
            try:
                up = socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            for a, b in ((c, up), (up, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self._stop = True
        self.sock.close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_no_broker_listening_keeps_polling_and_bounds_buffer():
    src = ScrapeSource()
    sink = KafkaSink(f"127.0.0.1:{_free_port()}", "gwtest-none.telemetry", send_timeout_s=1.0, ensure=False)
    sender = BoundedSender(sink, max_records=20, backoff_s=0.2, max_backoff_s=0.5)
    t0 = time.monotonic()
    res = run(src, sender, interval_s=0.05, max_polls=12, drain_s=0.5)
    elapsed = time.monotonic() - t0
    assert src.polls == 12 and res.records == 96
    assert res.sender.sent == 0 and res.sender.failures >= 1
    assert res.sender.dropped == 96 - 20 and len(sender) == 20      # newest 20 kept
    assert elapsed < 30, f"the source was blocked for {elapsed:.1f}s"


def _consume(bootstrap, topic, want, timeout_s=30.0):
    c = KafkaBusConsumer(bootstrap, topic, group=None)
    got = []
    dec = Decoder()
    try:
        end = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < end:
            for m in c.poll(timeout=1.0):
                # Columnar or JSON, as the message's header says (the sink's default is columnar).
                got.extend(dec.decode_many([m.value], [m.origin], [is_columnar(m.headers)]).records)
    finally:
        c.close()
    return got


def test_outage_then_recovery_delivers_what_was_buffered(kafka_bootstrap, topic_prefix, kafka_report):
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=1)
    host, _, port = kafka_bootstrap.rpartition(":")
    proxy = Proxy((host or "127.0.0.1", int(port)))
    src = ScrapeSource()
    sender = BoundedSender(KafkaSink(f"127.0.0.1:{proxy.port}", topics.telemetry, send_timeout_s=2.0, ensure=False),
                           max_records=40, backoff_s=0.2, max_backoff_s=0.5)
    try:
        # Outage: 8 polls x 8 GPUs = 64 records, the bound is 40: the oldest 24 are dropped.
        for _ in range(8):
            sender.submit(src.poll())
            sender.pump()
            time.sleep(0.1)
        assert sender.stats.sent == 0 and sender.stats.failures >= 1 and proxy.refused >= 1
        assert sender.stats.dropped == 24 and len(sender) == 40
        # Recovery: the broker is reachable again; everything buffered goes out.
        proxy.forward = True
        deadline = time.monotonic() + 40
        while len(sender) and time.monotonic() < deadline:
            sender.pump()
            time.sleep(0.2)
        assert len(sender) == 0 and sender.stats.sent == 40
    finally:
        sender.close()
        proxy.close()
    got = _consume(kafka_bootstrap, topics.telemetry, 40)
    # At least once: a batch half-acknowledged before the outage could repeat; here none was.
    polls = sorted({round(r.ts - T0) for r in got})
    assert polls == [3, 4, 5, 6, 7]                             # polls 0-2 dropped, oldest first
    assert len(got) == 40 and {r.gpu for r in got} == set(range(8))
    r = next(r for r in got if r.gpu == 3 and round(r.ts - T0) == 7)
    assert r.fields.DCGM_FI_DEV_POWER_USAGE == pytest.approx(67.316) and r.host == "gpu-node-1"
    kafka_report.append(f"producer outage: {sender.stats.failures} failed sends, {sender.stats.dropped} dropped "
                        f"(oldest), {sender.stats.sent} delivered after recovery to {topics.telemetry}")


def test_records_too_large_are_dropped_and_the_records_behind_them_delivered(kafka_bootstrap, topic_prefix,
                                                                             kafka_report):
    """One 9 MB record (over the client's 8 MiB request limit) and one of 2 MB (over the topic's
    1 MiB max.message.bytes, refused by the broker) among two real scrapes: both are dropped and
    counted, never retried, and every record around them reaches the topic.

    Before: the batch failed with MessageSizeTooLargeError, was treated as an outage and retried
    forever; nothing behind it was delivered."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topics = Topics(topic_prefix)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topics.telemetry, 1, 1, topic_configs={"max.message.bytes": "1048576"})])
    finally:
        admin.close()
    text = (DATA / "dcgm_exporter_h100_8gpu_sampled.prom").read_text()
    before, _ = parse_metrics(text, ts=T0)
    after, _ = parse_metrics(text, ts=T0 + 2)
    huge, big = parse_metrics(text, ts=T0 + 1)[0][:2]
    huge.labels = {"long": "x" * (9 * 1024 * 1024)}
    big.labels = {"long": "y" * (2 * 1024 * 1024)}
    sender = BoundedSender(KafkaSink(kafka_bootstrap, topics.telemetry, send_timeout_s=10.0, ensure=False),
                           backoff_s=0.2, max_backoff_s=0.5)
    try:
        sender.submit(before + [huge, big] + after)
        deadline = time.monotonic() + 60
        while len(sender) and time.monotonic() < deadline:
            sender.pump()
            time.sleep(0.1)
        s = sender.stats
        assert len(sender) == 0 and s.too_large == 2 and s.sent == 16 and s.failures == 0
    finally:
        sender.close()
    got = _consume(kafka_bootstrap, topics.telemetry, 16)
    assert sorted((round(r.ts - T0), r.gpu) for r in got) == sorted([(0, g) for g in range(8)] + [(2, g) for g in range(8)])
    kafka_report.append(f"record size: 2 too-large records dropped ({s.too_large}), {s.sent} delivered around them")
