"""A producer keeps running through a real broker stop/start mid-stream and delivers what it
buffered (a broker of the test's own, stopped and restarted with its data kept)."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusConsumer, ensure_topics
from pipeline.colwire import is_columnar
from pipeline.decode import Decoder
from producers.common import BoundedSender, KafkaSink, run
from tests.integration.scrape_factories import ScrapeSource

pytestmark = pytest.mark.kafka


def test_producer_rides_out_a_broker_restart_and_delivers_its_buffer(private_broker):
    topic = Topics("prodrestart").telemetry
    ensure_topics(private_broker.bootstrap, Topics("prodrestart"), partitions=2)
    src = ScrapeSource()
    sink = KafkaSink(private_broker.bootstrap, topic, send_timeout_s=2.0, ensure=False)
    sender = BoundedSender(sink, max_records=100_000, backoff_s=0.2, max_backoff_s=1.0)
    stop = threading.Event()
    result = {}
    t = threading.Thread(target=lambda: result.update(res=run(src, sender, interval_s=0.2, stop=stop, drain_s=60)))
    t.start()
    time.sleep(3)
    private_broker.stop()                                   # mid-stream
    polls_at_stop = src.polls
    time.sleep(6)
    # Each delivery attempt may hold the loop up to its send timeout (2 s here), never longer:
    # the source keeps being polled through the outage.
    assert t.is_alive() and src.polls >= polls_at_stop + 2
    private_broker.start(keep_data=True)
    time.sleep(4)
    stop.set()
    t.join(90)
    res = result["res"]
    assert res.sender.failures >= 1 and res.sender.dropped == 0 and len(sender) == 0
    produced = {(r.host, r.gpu, r.ts) for r in _records_of(src)}
    got = set()
    c = KafkaBusConsumer(private_broker.bootstrap, topic, group=None)
    dec = Decoder()
    deadline = time.monotonic() + 60
    while len(got) < len(produced) and time.monotonic() < deadline:
        for m in c.poll(timeout=1.0):
            # The producer sends columnar messages by default: their header says so.
            out = dec.decode_many([m.value], [m.origin], [is_columnar(m.headers)])
            assert not out.dead, out.dead
            got |= {(r.host, r.gpu, r.ts) for r in out.records}
    c.close()
    assert got == produced                                  # at least once: nothing lost


def _records_of(src: ScrapeSource):
    from producers.dcgm_exporter import parse_metrics
    from tests.factories import T0
    out = []
    for i in range(src.polls):
        recs, _ = parse_metrics(src.text, ts=T0 + i)
        out += recs
    return out
