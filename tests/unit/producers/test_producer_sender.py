"""The shared sender: bounded buffer dropping oldest first, back-off that never blocks the
source, at-least-once retry, the poll loop, and a clean stop of the real CLI on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.errors import BrokerUnavailableError
from pipeline.schema import dcgm
from producers.common import BoundedSender, JsonlSink, run
from tests.factories import T0


class FlakySink:
    """A sink that is down while ``down`` is true; remembers what it received."""

    def __init__(self):
        self.down = False
        self.got: list = []
        self.calls = 0

    def deliver(self, records):
        self.calls += 1
        if self.down:
            raise BrokerUnavailableError("down")
        self.got.extend(records)

    def close(self):
        pass


def recs(start, n, host="h"):
    return [dcgm(T0 + start + i, host, 0, {"gpu_temp": 50}) for i in range(n)]


def test_drops_oldest_beyond_bound_and_delivers_rest_after_recovery():
    sink = FlakySink()
    now = [0.0]
    s = BoundedSender(sink, max_records=10, probe_records=2, backoff_s=1.0, clock=lambda: now[0])
    sink.down = True
    s.submit(recs(0, 6))
    assert s.pump() == 0 and s.stats.failures == 1
    s.submit(recs(6, 8))                       # 14 held > 10: the 4 oldest go
    assert len(s) == 10 and s.stats.dropped == 4
    assert s.pump() == 0 and sink.calls == 1   # backing off: no attempt yet, no blocking
    now[0] += 1.0
    assert s.pump() == 0 and sink.calls == 2   # probe failed; back-off doubles
    now[0] += 1.5
    assert s.pump() == 0 and sink.calls == 2
    sink.down = False
    now[0] += 1.0
    assert s.pump() == 10                      # probe (2) ok, then the rest in one batch
    assert [r.ts - T0 for r in sink.got] == list(range(4, 14))
    assert s.stats.sent == 10 and len(s) == 0


def test_run_loop_keeps_polling_while_sink_is_down():
    sink = FlakySink()
    sink.down = True

    class Src:
        done = False
        polls = 0

        def poll(self):
            self.polls += 1
            return recs(self.polls * 10, 10)

        def close(self):
            pass

    src = Src()
    t0 = time.monotonic()
    res = run(src, BoundedSender(sink, max_records=25, backoff_s=0.01), interval_s=0.01, max_polls=20, drain_s=0.2)
    assert time.monotonic() - t0 < 5
    assert src.polls == 20 and res.records == 200 and res.sender.dropped == 175 and res.sender.sent == 0


def test_jsonl_sink_writes_one_record_per_line(tmp_path):
    p = tmp_path / "out.jsonl"
    s = BoundedSender(JsonlSink(str(p)))
    s.submit(recs(0, 3))
    assert s.pump() == 3
    s.close()
    lines = [json.loads(l) for l in p.read_text().splitlines()]
    assert [l["ts"] for l in lines] == [T0, T0 + 1, T0 + 2] and lines[0]["kind"] == "dcgm"


def test_cli_stops_cleanly_on_sigterm(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    line = json.dumps({"header": {"id": "0x1", "rank": 0, "n_ranks": 2, "nnodes": 1},
                       "metadata": {"dump_timestamp_us": int(T0 * 1e6), "hostname": "n1"},
                       "coll_perf": {"coll": "AllReduce", "coll_sn": 1, "coll_msg_size_bytes": 8, "coll_exec_time_us": 3}})
    (d / "n1-pid1.log").write_text(line + "\n")
    out = tmp_path / "out.jsonl"
    exe = Path(sys.executable).with_name("gpuwarden")
    p = subprocess.Popen([str(exe), "produce", "nccl-inspector", str(d), "--out", str(out), "--interval", "0.2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(d / "n1-pid1.log", "a") as fh:
            fh.write(line.replace('"coll_sn": 1', '"coll_sn": 2') + "\n")
        time.sleep(0.6)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "2 records read, 2 delivered, 0 dropped" in err
    assert [json.loads(l)["seq"] for l in out.read_text().splitlines()] == [1, 2]


def test_kafka_sink_splits_a_hosts_backlog_into_bounded_messages():
    from producers.common import KafkaSink

    sent = []

    class P:
        def send(self, topic, value, key, headers=None):
            sent.append((topic, key, value))

        def flush(self, timeout=None):
            return len(sent)

        def flush_results(self, timeout=None):
            return [None] * len(sent)

    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, max_records_per_message=100, encoding="json")
    sink._producer = P()
    sink.deliver(recs(0, 250) + recs(0, 30, host="other"))
    sizes = [len(json.loads(v)) for _, _, v in sent]
    assert sizes == [100, 100, 50, 30]                       # chunk 3 holds 50 of h and 30 of other
    assert [k for _, k, _ in sent] == [b"h", b"h", b"h", b"other"] and all(t == "gw.telemetry" for t, _, _ in sent)


def test_cli_without_nvml_says_why(tmp_path, capsys):
    """No NVIDIA driver here: the nvml producer must say so in one line, not a traceback."""
    from pipeline.cli import main

    assert main(["produce", "nvml", "--out", str(tmp_path / "x.jsonl"), "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuwarden produce nvml: cannot start") and "Traceback" not in err
