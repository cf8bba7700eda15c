"""Telemetry through a real Apache Kafka broker with the project's own producer and consumer.

200,000 simulated GPU-samples plus poison records of every kind: none lost, each host's order
kept, every poison record in <prefix>.dlq with its reason and topic[partition]@offset origin.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import msgspec
import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusConsumer, KafkaBusProducer, ensure_topics
from pipeline.bus.telemetry import per_host_messages
from pipeline.runner import Pipeline
from pipeline.schema import DeadLetter, encode
from producers.sim import Simulator

pytestmark = pytest.mark.kafka



def poison(ts: float) -> dict[str, bytes]:
    """One bad message of every kind in docs/architecture.md §3, stamped near the stream's current time."""
    return {
        "malformed_json": b'{"v":1,"kind":"dcgm","ts":17644',
        "nan_value": b'{"v":1,"kind":"dcgm","ts":NaN,"host":"poison-host","gpu":0}',
        "unknown_kind": b'{"v":1,"kind":"smartctl","ts":%d,"host":"poison-host"}' % ts,
        "missing_key": b'{"v":1,"kind":"dcgm","ts":%d,"gpu":0}' % ts,
        "wrong_type": b'{"v":1,"kind":"dcgm","ts":"noon","host":"poison-host","gpu":0}',
        "ts_out_of_range": b'{"v":1,"kind":"dcgm","ts":%d000,"host":"poison-host","gpu":0}' % ts,
        "blank_sentinel": b'{"v":1,"kind":"dcgm","ts":%d,"host":"poison-host","gpu":0,'
                          b'"fields":{"DCGM_FI_DEV_GPU_TEMP":"<<<blank>>>","DCGM_FI_DEV_POWER_USAGE":300}}' % ts,
    }


def test_200k_gpu_samples_through_kafka_none_lost_order_kept_poison_dead_lettered(kafka_bootstrap, topic_prefix,
                                                                                   kafka_report):
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=8)
    sim = Simulator(hosts=25, duration=1000, seed=11, scenario="healthy", nccl_interval=10.0)
    producer = KafkaBusProducer(kafka_bootstrap)
    sent_dcgm = 0
    poison_sent = defaultdict(int)
    t0 = time.perf_counter()
    for step, batch in enumerate(sim.batches()):
        for key, value in per_host_messages(batch):
            producer.send(topics.telemetry, value, key)
        sent_dcgm += sum(1 for r in batch if r["kind"] == "dcgm")
        if step % 50 == 7:
            for reason, payload in poison(batch[0]["ts"]).items():
                producer.send(topics.telemetry, payload, b"poison-host")
                poison_sent[reason] += 1
        if step % 100 == 99:
            producer.flush()
    producer.flush()
    produce_s = time.perf_counter() - t0
    assert sent_dcgm == 200_000

    consumer = KafkaBusConsumer(kafka_bootstrap, topics.telemetry, group=f"{topic_prefix}-svc")
    pipe = Pipeline(clock=time.monotonic)  # a live consumer: partitions may be drained unevenly
    out_producer = KafkaBusProducer(kafka_bootstrap)
    seen_ts: dict[tuple[str, int], list[float]] = defaultdict(list)
    partitions_of_host: dict[str, set[int]] = defaultdict(set)
    got_dcgm = 0
    t1 = time.perf_counter()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        msgs = consumer.poll(timeout=1.0, max_records=5000)
        if not msgs:
            if got_dcgm >= sent_dcgm:
                break
            continue
        for m in msgs:
            partitions_of_host[m.key.decode()].add(m.partition)
        for m in msgs:
            if m.key != b"poison-host":
                for r in msgspec.json.decode(m.value):
                    if r["kind"] == "dcgm":
                        seen_ts[(r["host"], r["gpu"])].append(r["ts"])
                        got_dcgm += 1
        out = pipe.handle(msgs)
        for dl in out.dead:
            out_producer.send(topics.dlq, encode(dl), (dl.host or "").encode())
        out_producer.flush()
        consumer.commit()
    consume_s = time.perf_counter() - t1
    consumer.close()

    assert got_dcgm == sent_dcgm, "records lost or duplicated on the way through Kafka"
    assert len(seen_ts) == 25 * 8
    for key, ts in seen_ts.items():
        assert ts == sorted(ts), f"order broken for {key}"
        assert len(ts) == 1000
    # Keyed by host: each host's messages all on one partition.
    assert all(len(p) == 1 for p in partitions_of_host.values())

    dlq = KafkaBusConsumer(kafka_bootstrap, topics.dlq, group=None)
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 60
    want = sum(poison_sent.values())
    while time.monotonic() < deadline and len([x for x in letters if x.host in (None, "poison-host")]) < want:
        letters += [msgspec.json.decode(m.value, type=DeadLetter) for m in dlq.poll(timeout=1.0)]
    dlq.close()
    poison_letters = [x for x in letters if x.host in (None, "poison-host")]
    # The simulator leaks DCGM blank sentinels now and then, as old exporters do: those fields
    # are dropped and reported, their records kept. No healthy record is dropped, none is late.
    healthy = [x for x in letters if x.host not in (None, "poison-host")]
    assert {(x.reason, x.action) for x in healthy} <= {("blank_sentinel", "fields_dropped")}
    by_reason = defaultdict(int)
    for x in poison_letters:
        by_reason[x.reason] += 1
        assert x.origin.startswith(f"{topics.telemetry}[") and "]@" in x.origin, x.origin
        assert x.raw
    assert dict(by_reason) == dict(poison_sent)
    kafka_report.append(
        f"Kafka integration ({kafka_bootstrap}): {sent_dcgm:,} simulated GPU-samples produced in {produce_s:.1f}s and "
        f"consumed+decoded+processed in {consume_s:.1f}s ({sent_dcgm / consume_s:,.0f}/s); 0 lost, per-GPU order kept; "
        f"{len(poison_letters)} poison records in {topics.dlq} ({', '.join(f'{k}: {v}' for k, v in sorted(by_reason.items()))})")


def test_unreachable_broker_is_a_retriable_error():
    from pipeline.errors import BrokerUnavailableError
    with pytest.raises(BrokerUnavailableError) as err:
        # kafka-python waits bootstrap_timeout_ms (30 s by default) before it gives up on bootstrapping.
        KafkaBusProducer("127.0.0.1:1", max_block_ms=1500, request_timeout_ms=1500, bootstrap_timeout_ms=1500)
    assert err.value.retriable


def test_every_send_is_checked(kafka_bootstrap, topic_prefix):
    from pipeline.errors import DeliveryError
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=2)
    p = KafkaBusProducer(kafka_bootstrap)
    for i in range(10):
        p.send(topics.alerts, json.dumps({"i": i}).encode(), b"k")
    assert p.flush() == 10
    # Over the broker's 1 MiB message limit: the broker refuses it, flush must say so.
    p.send(topics.alerts, b"x" * (2 * 1024 * 1024), b"k")
    with pytest.raises(DeliveryError) as err:
        p.flush(timeout=30)
    assert err.value.context["failed"] == 1
    assert err.value.retriable is False  # sending the same thing again will not help
    # Refused by the client before it left: reported the same way.
    p.send(topics.alerts, b"x" * (9 * 1024 * 1024), b"k")
    with pytest.raises(DeliveryError):
        p.flush(timeout=30)
    p.close()


def test_replay_to_kafka_names_a_bad_file_and_still_publishes_the_others(kafka_bootstrap, topic_prefix, tmp_path,
                                                                         capsys):
    """``replay --to-kafka`` reads its files as ``replay`` does: one it cannot read whole is named
    (exit 3) and the files after it are still published (it stopped at the bad file)."""
    from pipeline.cli import main
    from pipeline.errors import EXIT_INPUT
    from pipeline.recording import record

    sim = Simulator(hosts=2, duration=20, seed=3, scenario="mixed")
    lines = [encode(r) for r in sim.records()]
    good1, bad, good2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl"
    good1.write_bytes(b"".join(x + b"\n" for x in lines[: len(lines) // 2]))
    bad.write_bytes(b'{"not": "gzip"}\n')
    good2.write_bytes(b"".join(x + b"\n" for x in lines[len(lines) // 2:]))
    rc = main(["replay", str(good1), str(bad), str(good2), "--to-kafka", kafka_bootstrap, "--prefix", topic_prefix])
    err = capsys.readouterr().err
    assert rc == EXIT_INPUT, err
    assert f"{bad}: not a gzip file, though named .gz" in err
    back = tmp_path / "back.jsonl"
    record(kafka_bootstrap, Topics(topic_prefix).telemetry, str(back), idle_timeout=2.0)
    assert sorted(back.read_bytes().splitlines()) == sorted(lines)
