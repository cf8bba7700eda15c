"""``gpuwarden record`` against a real broker (pipeline/recording.py): a recording of a topic
replays as the topic's telemetry does, whatever its partitions and its messages' encoding."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from pipeline.bus.telemetry import COLUMNAR, per_host_wire
from pipeline.recording import record
from pipeline.schema import DcgmRecord, encode
from producers.sim import Simulator

pytestmark = pytest.mark.kafka


def _replayed(path, tmp_path, name):
    """(the alerts, the dead letters' reasons) of ``gpuwarden replay path`` with the rules only."""
    from pipeline.cli import main

    alerts, dlq = tmp_path / f"{name}.alerts.jsonl", tmp_path / f"{name}.dlq.jsonl"
    assert main(["replay", str(path), "--models", "none", "--alerts-out", str(alerts), "--dlq-out", str(dlq)]) == 0
    got = [msgspec.json.decode(x) for x in alerts.read_bytes().splitlines()]
    reasons = [msgspec.json.decode(x)["reason"] for x in dlq.read_bytes().splitlines()]
    return sorted((a["rule"], a["host"], a.get("gpu"), a["state"], a["ts"]) for a in got), reasons


def test_a_recording_of_a_topic_of_eight_partitions_replays_as_the_file_it_came_from(
    kafka_bootstrap, topic_prefix, tmp_path
):
    # Before: the lines ran partition by partition, so the file went back in time at each
    # partition's start and most of its records were late in replay (13 alert events of 36).
    from pipeline.cli import main

    sim = Simulator(hosts=6, duration=400, seed=5, scenario="mixed")
    src = tmp_path / "src.jsonl"
    src.write_bytes(b"".join(encode(r) + b"\n" for r in sim.records()))
    assert main(["replay", str(src), "--to-kafka", kafka_bootstrap, "--prefix", topic_prefix]) == 0
    back = tmp_path / "back.jsonl"
    res = record(kafka_bootstrap, Topics(topic_prefix).telemetry, str(back), idle_timeout=3.0)
    assert res.lines == len(src.read_bytes().splitlines())
    want, _ = _replayed(src, tmp_path, "src")
    got, reasons = _replayed(back, tmp_path, "back")
    assert want and got == want
    assert "late" not in reasons


def test_columnar_messages_are_recorded_as_the_records_they_carry(kafka_bootstrap, topic_prefix, tmp_path):
    # Our producers send columnar messages by default: before, each was written as its msgpack
    # bytes, a line no replay could read.
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=2)
    recs = list(Simulator(hosts=2, duration=20, seed=3, scenario="mixed").records())
    dcgm = [r for r in recs if r.get("kind") == "dcgm"]
    p = KafkaBusProducer(kafka_bootstrap)
    n = 0
    for key, value, headers in per_host_wire(dcgm, COLUMNAR):
        p.send(topics.telemetry, value, key, headers=headers)
        n += headers is not None
    assert p.flush() > 0
    p.close()
    assert n > 0  # columnar, not the JSON fallback
    back = tmp_path / "back.jsonl"
    record(kafka_bootstrap, topics.telemetry, str(back), idle_timeout=3.0)
    got = [msgspec.json.decode(x, type=DcgmRecord) for x in back.read_bytes().splitlines()]
    want = [msgspec.convert(r, DcgmRecord) for r in dcgm]
    key = lambda r: (r.ts, r.host, r.gpu, r.link if r.link is not None else -1)  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)


def test_recording_a_topic_that_does_not_exist_is_refused_and_creates_nothing(kafka_bootstrap, topic_prefix, tmp_path,
                                                                              capsys):
    # Found by an audit: a mistyped prefix gave kafka-python's ERROR line, "recorded 0 messages",
    # exit 0, and a topic the broker auto-created.
    from kafka import KafkaAdminClient

    from pipeline.cli import main
    from pipeline.errors import EXIT_INPUT

    out = tmp_path / "r.jsonl"
    assert main(["record", "--kafka", kafka_bootstrap, "--prefix", topic_prefix, "--out", str(out)]) == EXIT_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"topic {topic_prefix}.telemetry does not exist" in err[0]
    assert not out.exists()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        assert not [t for t in admin.list_topics() if t.startswith(topic_prefix)]
    finally:
        admin.close()
