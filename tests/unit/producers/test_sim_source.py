"""The simulator as a producer source: ``gpuwarden sim --kafka`` goes through the producers'
bounded sender and Kafka sink and puts on the wire what it always did, one message per host
per step (producers/sim/simulator.py ``SimSource``, producers/common.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.bus.publish import Pacer
from pipeline.bus.telemetry import COLUMNAR_HEADERS, per_host_messages
from pipeline.decode import Decoder
from pipeline.schema import DcgmSample
from producers.common import BoundedSender, KafkaSink, run
from producers.sim import SimSource, Simulator


def _wire_before(sim: Simulator) -> list[tuple[bytes, bytes]]:
    """What ``sim --kafka`` sent before it shared the sender: each step's per-host messages."""
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


class FakeProducer:
    def __init__(self, *_: Any, **__: Any) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.headers: list[Any] = []
        self.fail = False

    def send(self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None) -> None:
        self.sent.append((topic, key, value))
        self.headers.append(headers)

    def flush(self, timeout: float | None = None) -> int:
        if self.fail:
            from pipeline.errors import DeliveryError
            raise DeliveryError("refused", failed=1, retriable=True)
        return len(self.sent)

    def flush_results(self, timeout: float | None = None) -> list[BaseException | None]:
        # What KafkaSink reads: each send's error since the last flush (None: acknowledged).
        from pipeline.errors import DeliveryError
        pending, self._flushed = len(self.sent) - getattr(self, "_flushed", 0), len(self.sent)
        return [DeliveryError("refused", failed=1, retriable=True) if self.fail else None] * pending

    def close(self, timeout: float = 10.0) -> None:
        pass


def test_a_sim_source_polls_each_non_empty_step_then_is_done() -> None:
    sim = Simulator(hosts=2, duration=10, seed=1, scenario="mixed")
    src = SimSource(sim)
    polled = []
    while not src.done:
        polled.append(src.poll())
    assert polled[-1] == [] and polled[:-1] == [b for b in sim.batches() if b]
    assert src.summary() == {"steps": len(polled) - 1, "records": sum(map(len, polled))}


def test_sim_through_the_producers_sender_sends_the_same_messages_as_before() -> None:
    sim = Simulator(hosts=70, duration=12, seed=3, scenario="mixed")   # > 1000 records a step
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, encoding="json")
    sink._producer = p = FakeProducer()
    res = run(SimSource(sim), BoundedSender(sink, max_batch=100_000), interval_s=0.0)
    assert [(k, v) for _, k, v in p.sent] == _wire_before(sim)
    assert res.sender.sent == res.records == sum(len(b) for b in sim.batches())


def test_sim_through_the_sender_goes_columnar_by_default_with_the_same_records() -> None:
    sim = Simulator(hosts=5, duration=6, seed=3, scenario="mixed")
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False)
    sink._producer = p = FakeProducer()
    run(SimSource(sim), BoundedSender(sink, max_batch=100_000), interval_s=0.0)
    # DCGM-only messages go columnar; one holding NCCL records stays JSON.
    assert set(map(str, p.headers)) == {str(COLUMNAR_HEADERS), "None"}
    dec = Decoder()
    got = [
        list(dec.decode_many([v], [f"t@{i}"], [h is not None]).records)
        for i, ((_, _, v), h) in enumerate(zip(p.sent, p.headers))
    ]
    json_dec = Decoder()
    want = [json_dec.decode(v, f"t@{i}").records for i, (_, v) in enumerate(_wire_before(sim))]
    def seen(r: Any) -> tuple:
        temp = getattr(getattr(r, "fields", None), "DCGM_FI_DEV_GPU_TEMP", None)
        return (isinstance(r, DcgmSample), r.ts, r.host, r.gpu, temp)

    assert [list(map(seen, m)) for m in got] == [list(map(seen, m)) for m in want]


def test_a_realtime_sim_source_releases_each_step_at_its_event_time() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    sim = Simulator(hosts=1, duration=5, interval=1.0, seed=1)
    src = SimSource(sim, pacer=Pacer(1.0, clock=lambda: now[0], sleep=sleep))
    released = []
    while not src.done:
        if src.poll():
            released.append(now[0])
    assert released == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_cli_sim_kafka_goes_through_the_sender_and_fails_when_records_are_lost(monkeypatch, capsys) -> None:
    import pipeline.bus.connection as connection
    import pipeline.bus.kafka as kafka
    from pipeline.cli import main

    made: list[FakeProducer] = []

    def producer(*a: Any, **kw: Any) -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]

    monkeypatch.setattr(connection, "check", lambda conn, timeout_s=10.0: None)
    monkeypatch.setattr(kafka, "ensure_topics", lambda *a, **kw: [])
    monkeypatch.setattr(kafka, "KafkaBusProducer", producer)
    args = ["sim", "--hosts", "3", "--duration", "8", "--seed", "2", "--scenario", "mixed", "--kafka", "127.0.0.1:1",
            "--encoding", "json"]
    assert main(args) == 0
    sim = Simulator(hosts=3, duration=8, seed=2, scenario="mixed")
    assert [(k, v) for _, k, v in made[0].sent] == _wire_before(sim)
    assert {t for t, _, _ in made[0].sent} == {"gpuwarden.telemetry"}
    assert "gpuwarden.telemetry on 127.0.0.1:1" in capsys.readouterr().err

    def refusing(*a: Any, **kw: Any) -> FakeProducer:
        p = FakeProducer()
        p.fail = True
        return p

    monkeypatch.setattr(kafka, "KafkaBusProducer", refusing)
    monkeypatch.setattr("producers.common.BoundedSender.drain", lambda self, deadline_s: None)
    assert main(args) == 4
    assert "not delivered" in capsys.readouterr().err


@pytest.mark.parametrize("hosts", [1, 4])
def test_sim_out_writes_one_record_a_line_as_before(tmp_path, hosts: int) -> None:
    from pipeline.cli import main

    out = tmp_path / "sim.jsonl"
    assert main(["sim", "--hosts", str(hosts), "--duration", "6", "--seed", "1", "--out", str(out)]) == 0
    sim = Simulator(hosts=hosts, duration=6, seed=1, scenario="healthy")
    assert [json.loads(line) for line in out.read_text().splitlines()] == list(sim.records())
