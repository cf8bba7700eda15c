"""The one publishing path: records -> wire messages, recordings -> the same messages, and
event-time pacing (pipeline/bus/telemetry.py, pipeline/bus/publish.py)."""

from __future__ import annotations

import json

import pytest

from pipeline.bus import MemoryBus
from pipeline.bus.base import FILE_PARTITION, Message
from pipeline.bus.publish import Pacer, send_paced
from pipeline.bus.telemetry import WireMessage, as_consumed, per_host_messages, recorded_messages
from pipeline.schema import dcgm, encode
from producers.sim import Simulator


def _lines(values: list[bytes]) -> list[Message]:
    return [Message("rec.jsonl", FILE_PARTITION, i + 1, None, v) for i, v in enumerate(values)]


def test_per_host_messages_group_by_host_in_first_seen_order_and_keep_each_hosts_order() -> None:
    recs = [{"host": h, "gpu": g, "ts": 1.0} for g in range(4) for h in ("b", "a")]   # interleaved
    msgs = list(per_host_messages(recs))
    assert [k for k, _ in msgs] == [b"b", b"a"]
    assert [[r["gpu"] for r in json.loads(v)] for _, v in msgs] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_per_host_messages_take_structs_and_dicts_alike() -> None:
    rec = dcgm(1764403200.0, "n1", 0, {"gpu_temp": 50})
    as_dict = json.loads(encode(rec))
    assert list(per_host_messages([rec])) == list(per_host_messages([as_dict]))


def test_per_host_messages_split_only_a_host_over_the_bound_into_consecutive_messages() -> None:
    recs = [{"host": "h", "i": i} for i in range(250)] + [{"host": "o", "i": i} for i in range(30)]
    msgs = list(per_host_messages(recs, max_records=100))
    assert [(k, [r["i"] for r in json.loads(v)][:1], len(json.loads(v))) for k, v in msgs] == [
        (b"h", [0], 100), (b"h", [100], 100), (b"h", [200], 50), (b"o", [0], 30)]
    assert list(per_host_messages(recs, max_records=1000)) == list(per_host_messages(recs))
    with pytest.raises(ValueError):
        list(per_host_messages(recs, max_records=0))


def test_a_recording_published_again_is_the_simulators_own_messages() -> None:
    """``replay --to-kafka`` of ``sim --out`` puts on the wire exactly what ``sim --kafka`` does."""
    sim = Simulator(hosts=3, duration=12, seed=2, scenario="mixed")
    direct = [m for batch in sim.batches() if batch for m in per_host_messages(batch)]
    lines = _lines([encode(r) for r in sim.records()])
    again = [(m.key, m.value) for m in recorded_messages(lines)]
    assert again == direct
    assert all(m.ts is not None for m in recorded_messages(lines))


def test_recorded_messages_pass_poison_alone_unkeyed_and_keep_lines_verbatim() -> None:
    a0 = b'{"ts": 10, "host": "a", "gpu": 0}'     # spaces kept: the bytes are never re-encoded
    a1 = b'{"ts":10,"host":"a","gpu":1}'
    b0 = b'{"ts":10,"host":"b","gpu":0}'
    msgs = list(recorded_messages(_lines([a0, b"{not json", a1, b0, b'[1,2]', b'{"ts":"x","host":"a"}'])))
    assert msgs == [
        WireMessage(b"a", b"[" + a0 + b"]", 10.0),
        WireMessage(None, b"{not json"),
        WireMessage(b"a", b"[" + a1 + b"]", 10.0),       # the same host and time after poison: a new message
        WireMessage(b"b", b"[" + b0 + b"]", 10.0),
        WireMessage(None, b"[1,2]"),
        WireMessage(None, b'{"ts":"x","host":"a"}'),
    ]


def test_recorded_messages_key_a_host_no_utf8_writer_can_encode() -> None:
    line = b'{"ts":1,"host":"\\ud800x"}'
    (msg,) = recorded_messages(_lines([line]))
    assert msg.key == b"\\ud800x" and msg.value == b"[" + line + b"]"


def test_as_consumed_numbers_offsets_from_the_first() -> None:
    msgs = as_consumed([(b"a", b"[]"), (b"b", b"[]")], "eval", 5)
    assert [m.origin for m in msgs] == ["eval[0]@5", "eval[0]@6"] and [m.key for m in msgs] == [b"a", b"b"]


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_pacer_at_speed_2_makes_event_time_run_twice_as_fast() -> None:
    c = _Clock()
    p = Pacer(2.0, clock=c, sleep=c.sleep)
    due = []
    for ts in (500.0, 510.0, 510.0, 530.0):
        p.wait(ts)
        due.append(c.t - 1000.0)
    assert due == [0.0, 5.0, 5.0, 15.0] and c.slept == [5.0, 10.0]


def test_pacer_never_waits_for_a_late_event_and_does_not_hurry_after_falling_behind() -> None:
    c = _Clock()
    p = Pacer(1.0, clock=c, sleep=c.sleep)
    p.wait(0.0)
    c.t += 30.0                 # the publisher stalled for 30 s
    assert p.wait(10.0) == 0.0 and p.wait(5.0) == 0.0
    assert p.wait(40.0) == pytest.approx(10.0)


def test_pacer_at_max_speed_never_sleeps_nor_flushes() -> None:
    c = _Clock()
    p = Pacer(None, clock=c, sleep=c.sleep)
    flushed = []
    for ts in (0.0, 1e6, 2e6):
        assert p.wait(ts, before_sleep=lambda: flushed.append(1)) == 0.0
    assert c.slept == [] and flushed == []


@pytest.mark.parametrize("speed", [0.0, -1.0, float("inf"), float("nan")])
def test_pacer_refuses_a_speed_that_is_not_a_positive_factor(speed: float) -> None:
    with pytest.raises(ValueError):
        Pacer(speed)


def test_send_paced_flushes_before_each_wait_and_keeps_order_keys_and_bytes() -> None:
    bus = MemoryBus(partitions=2)
    prod = bus.producer()
    log: list[str] = []
    real_send, real_flush = prod.send, prod.flush

    def send(topic: str, value: bytes, key: bytes | None = None) -> None:
        log.append(f"send {value.decode()}")
        real_send(topic, value, key)

    def flush(timeout: float | None = None) -> int:
        log.append("flush")
        return real_flush(timeout)

    prod.send, prod.flush = send, flush  # type: ignore[method-assign]
    c = _Clock()
    msgs = [WireMessage(b"a", b"1", 0.0), WireMessage(None, b"p"), WireMessage(b"b", b"2", 0.0),
            WireMessage(b"a", b"3", 4.0)]
    assert send_paced(prod, "t", msgs, pacer=Pacer(2.0, clock=c, sleep=c.sleep)) == 4
    assert log == ["send 1", "send p", "send 2", "flush", "send 3", "flush"] and c.slept == [2.0]
    got = sorted(bus.messages("t"), key=lambda m: m.value)
    assert [(m.key, m.value) for m in got] == [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (None, b"p")]


def test_send_paced_waits_for_acknowledgements_every_flush_every_messages() -> None:
    flushes = []

    class P:
        n = 0

        def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
            self.n += 1

        def flush(self, timeout: float | None = None) -> int:
            flushes.append(self.n)
            return 0

        def close(self) -> None:
            pass

    assert send_paced(P(), "t", (WireMessage(b"k", b"v") for _ in range(25)), flush_every=10) == 25
    assert flushes == [10, 20, 25]


def test_replay_to_kafka_publishes_a_recording_through_the_one_path(tmp_path, monkeypatch) -> None:
    """``pipeline.recording.publish``: a file's lines -> ``recorded_messages`` -> ``send_paced``."""
    import pipeline.recording as recording

    sent: list[tuple[str, bytes | None, bytes]] = []

    class P:
        def __init__(self, *a: object, **kw: object) -> None:
            pass

        def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
            sent.append((topic, key, value))

        def flush(self, timeout: float | None = None) -> int:
            return 0

        def close(self) -> None:
            pass

    sim = Simulator(hosts=2, duration=5, seed=4, scenario="mixed")
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(encode(r) + b"\n" for r in sim.records()) + b"{poison\n")
    monkeypatch.setattr(recording, "KafkaBusProducer", P)
    n = recording.publish([str(path)], "unused:1", "gw.telemetry")
    direct = [m for batch in sim.batches() if batch for m in per_host_messages(batch)]
    assert [(k, v) for _, k, v in sent] == direct + [(None, b"{poison")] and n == len(direct) + 1
    assert {t for t, _, _ in sent} == {"gw.telemetry"}
