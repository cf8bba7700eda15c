"""Engine output sinks (pipeline/bus/sinks.py): every sink round-trips alerts and dead letters
with the same bytes and keys; a bus sink's flush raises what the producer raises."""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import msgspec
import pytest

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.sinks import BusOutput, FileOutput, OutputSink
from pipeline.errors import DeliveryError
from pipeline.schema import AlertEvent, DeadLetter, encode
from tests.factories import T0

ALERTS = [AlertEvent(id="a1", state="firing", fault="thermal_slowdown", severity="warning", rule="r", host="n1",
                     gpu=3, ts=T0 + 5, started_at=T0),
          AlertEvent(id="a2", state="firing", fault="telemetry_gap", severity="critical", rule="gap", host=None,
                     ts=T0 + 6, started_at=T0 + 6)]
DEAD = [DeadLetter(reason="malformed_json", detail="x", origin="f:1", host="n2"),
        DeadLetter(reason="late", detail="y", origin="f:2", ts=T0)]


def _write(sink: OutputSink) -> None:
    sink.alerts(ALERTS[:1])
    sink.dead(DEAD)
    sink.alerts(ALERTS[1:])
    sink.flush()


def test_bus_output_on_the_memory_bus_round_trips_keyed_by_host() -> None:
    bus, topics = MemoryBus(partitions=3), Topics("gw")
    sink = BusOutput.memory(bus, topics)
    _write(sink)
    sink.close()
    alerts = sorted(bus.messages(topics.alerts), key=lambda m: m.value)
    assert [msgspec.json.decode(m.value, type=AlertEvent) for m in alerts] == ALERTS
    assert [m.key for m in alerts] == [b"n1", b""]
    dead = sorted(bus.messages(topics.dlq), key=lambda m: m.value)
    assert sorted(msgspec.json.decode(m.value, type=DeadLetter).origin for m in dead) == ["f:1", "f:2"]
    assert {m.key for m in dead} == {b"n2", b""}
    assert {m.value for m in dead} == {encode(d) for d in DEAD}


def test_bus_output_flush_raises_the_producers_delivery_error() -> None:
    class Refusing:
        def __init__(self) -> None:
            self.sent: list[tuple[str, bytes, bytes | None]] = []
            self.closed = False

        def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
            self.sent.append((topic, value, key))

        def flush(self, timeout: float | None = None) -> int:
            raise DeliveryError("1 of 3 sends not acknowledged", failed=1, retriable=True)

        def close(self) -> None:
            self.closed = True

    p = Refusing()
    sink = BusOutput(p, Topics("gw"))
    sink.alerts(ALERTS)
    sink.dead(DEAD[:1])
    with pytest.raises(DeliveryError) as e:
        sink.flush()
    assert e.value.retriable
    assert [t for t, _, _ in p.sent] == ["gw.alerts", "gw.alerts", "gw.dlq"]
    sink.close()
    assert p.closed


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_file_output_round_trips_and_appears_only_when_closed(tmp_path: Path, suffix: str) -> None:
    a, d = tmp_path / f"alerts{suffix}", tmp_path / f"dlq{suffix}"
    sink = FileOutput(a, d)
    _write(sink)
    assert not a.exists() and not d.exists()        # written atomically: nothing half-done to read
    sink.close()
    read = (lambda p: gzip.decompress(p.read_bytes())) if suffix.endswith(".gz") else (lambda p: p.read_bytes())
    assert read(a).splitlines() == [encode(x) for x in ALERTS]
    assert read(d).splitlines() == [encode(x) for x in DEAD]
    assert [msgspec.json.decode(line, type=AlertEvent) for line in read(a).splitlines()] == ALERTS


def test_file_output_writes_only_the_files_it_was_given(tmp_path: Path) -> None:
    with FileOutput(None, tmp_path / "dlq.jsonl") as sink:
        _write(sink)
    assert [p.name for p in tmp_path.iterdir()] == ["dlq.jsonl"]


@pytest.mark.kafka
def test_bus_output_on_kafka_round_trips(kafka_bootstrap: str) -> None:
    from pipeline.bus.kafka import KafkaBusConsumer, ensure_topics

    topics = Topics(f"gwtest-{uuid.uuid4().hex[:10]}")
    ensure_topics(kafka_bootstrap, topics, partitions=2)
    sink = BusOutput.kafka(kafka_bootstrap, topics)
    _write(sink)
    sink.close()
    got: dict[str, set[tuple[bytes | None, bytes]]] = {}
    for topic in (topics.alerts, topics.dlq):
        c = KafkaBusConsumer(kafka_bootstrap, topic, group=None)
        seen: set[tuple[bytes | None, bytes]] = set()
        for _ in range(40):
            seen |= {(m.key, m.value) for m in c.poll(timeout=0.5)}
            if len(seen) >= 2:
                break
        c.close()
        got[topic] = seen
    assert got[topics.alerts] == {(b"n1", encode(ALERTS[0])), (b"", encode(ALERTS[1]))}
    assert got[topics.dlq] == {(b"n2", encode(DEAD[0])), (b"", encode(DEAD[1]))}
