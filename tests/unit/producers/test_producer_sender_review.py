"""Trying to break the producers' shared sender (``producers/common.py``): records no encoder can
write, an output file whose writes fail part-way (disk full), a broker that answers but has no
metadata for the topic, a stop while a file is still being sent, many hosts at once, a broker
down at start, a closed stdout, and SASL secrets near error messages. No broker is started: the
Kafka client is a stand-in where the sink accepts one (``make_client``), or a closed port."""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from kafka.errors import KafkaTimeoutError

from pipeline.errors import BrokerUnavailableError
from pipeline.schema import dcgm
from producers.common import (
    BoundedSender,
    JsonlSink,
    KafkaSink,
    ProducerMetrics,
    RunResult,
    install_stop_handlers,
    lost_input,
    run,
)
from tests.factories import T0, ListSink

ROOT = Path(__file__).resolve().parents[3]


def recs(n: int, host: str = "h", start: int = 0) -> list:
    return [dcgm(T0 + start + i, host, 0, {"gpu_temp": 50}) for i in range(n)]


class FakeKafka:
    """Stands in for ``KafkaBusProducer``: keeps what was sent (key, decoded value) and
    acknowledges everything; ``down`` fails every send as an unreachable broker does."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list]] = []
        self._n = 0
        self.down = False

    def send(self, topic, value, key=None, headers=None):
        self._n += 1
        if not self.down:
            self.sent.append((key, json.loads(value)))

    def flush_results(self, timeout=None):
        n, self._n = self._n, 0
        return [KafkaTimeoutError("down") if self.down else None] * n

    def close(self, timeout=0):
        pass


def _poison() -> object:
    r = dcgm(T0 + 2, "h", 0, {"gpu_temp": 50})
    # What a name decoded with surrogateescape carries (a --host argument, a label read from a
    # file name with a byte that is not UTF-8): no JSON encoder writes it.
    r.labels = {"job": "train\udcff"}
    return r


# -- a record no encoder can write -------------------------------------------------------------


def test_a_record_no_encoder_can_write_is_dropped_and_counted_not_retried_as_an_outage(caplog):
    # Before: the UnicodeEncodeError failed the whole batch as a broker outage, retried for ever:
    # nothing behind the record was ever delivered, and the log blamed the broker.
    p = FakeKafka()
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p, encoding="json")
    sender = BoundedSender(sink, backoff_s=0.0)
    batch = recs(5)
    batch[2] = _poison()
    sender.submit(batch)
    sender.pump(force=True)
    s = sender.stats
    assert len(sender) == 0 and s.sent == 4 and s.failures == 0
    assert s.unencodable == 1
    assert [r["ts"] - T0 for _, v in p.sent for r in v] == [0, 1, 3, 4]
    assert not any("delivery failed" in r.getMessage() for r in caplog.records)
    assert any("unencodable" in r.getMessage() for r in caplog.records)
    # ... and it is lost input, by reason, on /metrics and in a file run's exit.
    res = RunResult(sender=s)
    assert lost_input(object(), res) == {"dropped.unencodable": 1}
    fams = {f.name: f for f in ProducerMetrics("t", object(), sender, res).collect()}
    dropped = {smp.labels["reason"]: smp.value for smp in fams["gpuwarden_producer_dropped"].samples}
    assert dropped["unencodable"] == 1


def test_a_jsonl_sink_writes_the_records_around_an_unencodable_one_once(tmp_path):
    # Before: the records before it were written, then the batch failed and was written again
    # at every retry: the file grew duplicates for as long as the producer ran.
    out = tmp_path / "o.jsonl"
    sender = BoundedSender(JsonlSink(str(out)), backoff_s=0.0)
    batch = recs(5)
    batch[2] = _poison()
    sender.submit(batch)
    for _ in range(3):
        sender.pump(force=True)
    sender.close()
    assert [json.loads(line)["ts"] - T0 for line in out.read_text().splitlines()] == [0, 1, 3, 4]
    assert sender.stats.unencodable == 1 and sender.stats.sent == 4


def test_an_outage_with_encodable_records_is_still_an_outage():
    p = FakeKafka()
    p.down = True
    sender = BoundedSender(KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p), backoff_s=0.0)
    sender.submit(recs(10))
    sender.pump(force=True)
    assert len(sender) == 10 and sender.stats.failures == 1 and sender.stats.unencodable == 0


# -- an output file whose writes fail part-way -------------------------------------------------

# In a child: RLIMIT_FSIZE makes the kernel refuse writes past a size (EFBIG, as ENOSPC does on
# a full disk) without touching this process's files; the limit is lifted and the sender goes on.
_FULL_DISK = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from pipeline.schema import dcgm
from producers.common import BoundedSender, JsonlSink
path, limit, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = BoundedSender(JsonlSink(path), backoff_s=0, max_batch=2000)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
s.submit([dcgm(1764403200.0 + i, "h", 0, {"gpu_temp": i % 97, "power_usage": i * 1.37}) for i in range(n)])
s.pump(force=True)
failed = s.stats.failures
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
s.drain(10)
s.close()
print(failed, s.stats.sent, len(s))
"""


@pytest.mark.parametrize("name,limit", [("o.jsonl", 200_000), ("o.jsonl.gz", 75_000), ("o.jsonl.gz", 90_001)])
def test_an_output_whose_disk_filled_mid_write_reads_back_whole_once_the_disk_has_room(tmp_path, name, limit):
    # Before (.gz): the compressed bytes the failed write lost were gone while the compressor
    # had moved on; every record after that point was unreadable (CRC error, or "invalid code
    # lengths"), 11,000 of 20,000, all of them counted as delivered. (Plain: the lines before
    # the failure were written twice.)
    out = tmp_path / name
    n = 20_000
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(out), str(limit), str(n)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    failed, sent, held = map(int, done.stdout.split())
    assert failed >= 1 and sent == n and held == 0   # the disk did fill, then everything went out
    opener = gzip.open if name.endswith(".gz") else open
    with opener(out, "rb") as fh:
        ts = [json.loads(line)["ts"] - T0 for line in fh]
    assert ts == list(range(n))


def test_a_gz_output_shows_each_delivery_to_a_follower_and_closes_as_one_stream(tmp_path):
    # A follower (zcat, replay) sees each interval's records while the producer runs; at close
    # the stream gets its end, and gzip reads it whole.
    out = tmp_path / "o.jsonl.gz"
    sink = JsonlSink(str(out))

    def following() -> list:
        text = zlib.decompressobj(wbits=31).decompress(out.read_bytes())
        return [json.loads(line)["ts"] - T0 for line in text.splitlines()]

    sink.deliver(recs(3))
    assert following() == [0, 1, 2]
    sink.deliver(recs(2, start=3))
    assert following() == [0, 1, 2, 3, 4]
    sink.close()
    with gzip.open(out, "rb") as fh:
        assert [json.loads(line)["ts"] - T0 for line in fh] == [0, 1, 2, 3, 4]


def test_an_empty_gz_output_closes_as_a_valid_gzip(tmp_path):
    out = tmp_path / "o.jsonl.gz"
    JsonlSink(str(out)).close()
    assert gzip.decompress(out.read_bytes()) == b""


def test_a_stdout_that_is_a_closed_pipe_is_a_failed_delivery_not_a_crash(monkeypatch):
    r, w = os.pipe()
    os.close(r)
    wfh = os.fdopen(w, "w")
    try:
        monkeypatch.setattr(sys, "stdout", wfh)
        sender = BoundedSender(JsonlSink("-"), backoff_s=0.0)
        sender.submit(recs(3))
        sender.pump(force=True)
        assert len(sender) == 3 and sender.stats.failures == 1 and sender.stats.sent == 0
    finally:
        monkeypatch.undo()
        try:
            wfh.close()
        except BrokenPipeError:
            pass


# -- a broker that answers but has no metadata for the topic ------------------------------------


class NoMetadata(FakeKafka):
    """kafka-python connected to a broker that has no metadata for the topic (deleted, not
    created yet, leader election): each ``send`` waits ``max_block_ms`` for it, then fails."""

    def __init__(self, block_s: float) -> None:
        super().__init__()
        self.block_s, self.sends = block_s, 0

    def send(self, topic, value, key=None, headers=None):
        self.sends += 1
        self._n += 1
        time.sleep(self.block_s)

    def flush_results(self, timeout=None):
        n, self._n = self._n, 0
        return [KafkaTimeoutError("Failed to update metadata after 0.1 secs.")] * n


def test_a_send_that_waited_its_whole_timeout_ends_the_delivery_not_one_wait_per_host():
    # Before: one wait of --send-timeout per host's message, one after the other: 40 hosts at
    # the default 5 s held the source for 200 s ("no send waits longer than --send-timeout").
    p = NoMetadata(block_s=0.1)
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p, send_timeout_s=0.1)
    sender = BoundedSender(sink)
    sender.submit([r for i in range(40) for r in recs(1, host=f"n{i:02d}")])
    t = time.monotonic()
    sender.pump()
    assert time.monotonic() - t < 1.0 and p.sends < 5
    assert len(sender) == 40 and sender.stats.failures == 1   # kept for the next try, nothing lost


def test_sends_that_wait_less_than_the_timeout_all_go():
    p = FakeKafka()
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p, send_timeout_s=0.1,
                     encoding="json")
    sender = BoundedSender(sink)
    sender.submit([r for i in range(40) for r in recs(1, host=f"n{i:02d}")])
    assert sender.pump() == 40 and len(p.sent) == 40


# -- many hosts, a broker down at start --------------------------------------------------------


def test_many_hosts_interleaved_keep_each_hosts_order_under_its_own_key():
    p = FakeKafka()
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p, max_records_per_message=7,
                     encoding="json")
    sender = BoundedSender(sink, max_batch=50)
    sender.submit([dcgm(T0 + i, f"n{i % 13}", 0, {"gpu_temp": i}) for i in range(500)])
    assert sender.pump() == 500
    by_key: dict[bytes, list] = {}
    for key, value in p.sent:
        assert len(value) <= 7 and {r["host"].encode() for r in value} == {key}
        by_key.setdefault(key, []).extend(r["ts"] for r in value)
    assert len(by_key) == 13 and all(ts == sorted(ts) for ts in by_key.values())
    assert sum(len(ts) for ts in by_key.values()) == 500


def test_a_broker_down_at_start_is_an_outage_and_its_return_delivers_the_buffer():
    made = []
    up = [False]

    def make():
        made.append(1)
        if not up[0]:
            raise BrokerUnavailableError("no Kafka broker answered at unused:1")
        return FakeKafka()

    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=make, encoding="json")
    now = [0.0]
    sender = BoundedSender(sink, max_records=50, probe_records=4, backoff_s=1.0, clock=lambda: now[0])
    sender.submit(recs(30))
    assert sender.pump() == 0 and sender.stats.failures == 1
    sender.submit(recs(30, start=30))           # 60 > 50: the 10 oldest go, counted
    up[0] = True
    now[0] += 1.0
    assert sender.pump() == 50 and len(sender) == 0
    s = sender.stats
    assert s.dropped == 10 and s.sent == 50 and s.submitted == s.sent + s.dropped and len(made) == 2


# -- stopping ----------------------------------------------------------------------------------


class SlowSink(ListSink):
    def deliver(self, records):
        time.sleep(0.01)
        return super().deliver(records)


class FileOnce:
    """A file source: all of its input in one poll."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, False

    def poll(self):
        self.done = True
        return recs(self.n)

    def close(self):
        pass


def test_a_stop_while_a_file_is_sent_drains_for_the_drain_time_then_counts_what_is_left():
    # Before: a stopped file producer drained for as long as the sink took records (here 10 s;
    # a 12-hour dmon capture, minutes), past the 10 s the docs give a stop, and an init system
    # kills it then: no summary, nothing counted.
    sink = SlowSink()
    sender = BoundedSender(sink, max_records=100, max_batch=10, backpressure=True)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t = time.monotonic()
    res = run(FileOnce(10_000), sender, interval_s=0.0, stop=stop, drain_s=0.3)
    assert time.monotonic() - t < 3.0
    s = res.sender
    assert s.undelivered > 0 and s.sent + s.undelivered + s.dropped == 10_000 and len(sink.got) == s.sent


def test_a_file_read_to_its_end_is_still_delivered_whole_however_long_it_takes():
    sink = SlowSink()
    sender = BoundedSender(sink, max_records=100, max_batch=200, backpressure=True)
    res = run(FileOnce(3_000), sender, interval_s=0.0, drain_s=0.05)
    assert res.sender.sent == 3_000 and res.sender.undelivered == 0 and res.sender.dropped == 0


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_sigterm_during_a_delivery_loses_and_duplicates_nothing():
    class SignalledSink(ListSink):
        calls = 0

        def deliver(self, records):
            self.calls += 1
            if self.calls == 2:
                os.kill(os.getpid(), signal.SIGTERM)   # arrives mid-delivery
            return super().deliver(records)

    class Live:
        done = False
        k = 0

        def poll(self):
            self.k += 1
            return recs(5, start=5 * self.k)

        def close(self):
            pass

    stop = threading.Event()
    restore = install_stop_handlers(stop)
    try:
        sink = SignalledSink()
        res = run(Live(), BoundedSender(sink), interval_s=0.01, stop=stop, drain_s=1.0)
    finally:
        restore()
    ts = [r.ts for r in sink.got]
    assert stop.is_set() and res.records == len(ts) == len(set(ts)) and res.sender.undelivered == 0


# -- secrets -----------------------------------------------------------------------------------


def test_a_sasl_password_is_in_no_log_line_or_error_of_a_failed_delivery(caplog):
    # A closed port on this machine: kafka-python really tries, and fails, to connect.
    secret = "hunter2-s3cr3t-pw"
    caplog.set_level(logging.DEBUG)
    sec = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
           "sasl_plain_username": "gpuwarden-producer", "sasl_plain_password": secret}
    sink = KafkaSink("127.0.0.1:1", "gw.telemetry", send_timeout_s=0.3, security=sec)
    errors = []
    try:
        sink.deliver(recs(1))
    except BrokerUnavailableError as e:
        errors.append(e)
    sender = BoundedSender(sink, backoff_s=0.0)
    sender.submit(recs(1))
    sender.pump()
    sender.drain(0.2)
    sender.close()
    assert errors and sender.stats.failures >= 1
    text = "\n".join(r.getMessage() for r in caplog.records) + "".join(repr(e) for e in errors)
    assert secret not in text


def test_the_cli_summary_counts_an_unencodable_record_among_those_dropped_unsent(tmp_path, capsys):
    # --host from a non-UTF-8 argument (a lone surrogate): every record is unencodable, and the
    # summary line said "0 dropped unsent" beside "LOST input: dropped.unencodable".
    from pipeline.cli import main
    from tests.factories import SHARED_DATA

    out = tmp_path / "o.jsonl"
    dmon = str(SHARED_DATA / "dcgmi_dmon_a100_dcgm3_sample.txt")
    rc = main(["produce", "dcgmi", "--file", dmon, "--host", "n\udcff", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "16 records read, 0 delivered, 16 dropped unsent" in err and "dropped.unencodable 16" in err
