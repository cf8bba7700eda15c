"""Hostile records against the real service and a real broker (issue 18): each one becomes a
dead letter with its reason and origin, the service keeps running and commits past it, and the
alerts are the clean recording's."""

from __future__ import annotations

import json

from kafka import KafkaAdminClient

from pipeline.bus import Topics
from pipeline.bus.kafka import ensure_topics
from pipeline.recording import publish, record
from tests.faults.factories import ServiceProc, alerts_on_topic, golden_alerts, ids, wait_for, write_config

HOST = "gpu-node-001"   # a real host of the recording: the hostile records speak for it


def _hostile(ts: float) -> list[tuple[str, str]]:
    deep = "[" * 1000 + "]" * 1000
    rec = {"v": 1, "kind": "dcgm", "ts": ts, "host": HOST, "gpu": 0, "fields": {"DCGM_FI_DEV_GPU_TEMP": 60}}
    nccl = {"v": 1, "kind": "nccl", "ts": ts, "host": HOST, "gpu": 0, "comm": "c", "rank": 0, "nranks": 8,
            "coll": "AllReduce", "bytes": 1024, "exec_time_us": 10.0}
    return [
        (deep, "too_deep"),
        ('{"kind":"dcgm","ts":%r,"host":"%s","gpu":0,"x":%s}' % (ts, HOST, deep), "too_deep"),
        (json.dumps({**rec, "gpu": 2 ** 63}), "out_of_range"),
        (json.dumps({**nccl, "gpu": -2000}), "out_of_range"),
        (json.dumps({**nccl, "rank": 2 ** 32, "nranks": 2 ** 32 + 1}), "out_of_range"),
        (json.dumps({**rec, "host": "n\ud800"}), "bad_identifier"),
        (json.dumps({**rec, "host": "h" * 100_000}), "bad_identifier"),
        (json.dumps({**rec, "ts": ts + 70 * 365 * 86400}), "ts_out_of_range"),
    ]


def test_hostile_records_are_dead_letters_and_the_service_commits_past_them(kafka_bootstrap, topic_prefix,
                                                                             tmp_path, sim_recording):
    rec = sim_recording(hosts=4, duration=600, seed=8)
    golden = golden_alerts(rec, tmp_path)
    lines = rec.read_text().splitlines()
    mixed, expected = [], []
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 1500 == 1499:
            first = json.loads(line)
            ts = float((first[0] if isinstance(first, list) else first)["ts"])
            for bad, reason in _hostile(ts):
                mixed.append(bad)
                expected.append(reason)
    dirty = tmp_path / "hostile.jsonl"
    dirty.write_text("\n".join(mixed) + "\n")
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    sent = publish([str(dirty)], kafka_bootstrap, topics.telemetry)
    svc = ServiceProc(write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix), tmp_path / "s.log").start()
    try:
        wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) >= golden,
                 timeout=180, step=1, what="the golden alerts")
        assert svc.alive()

        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        try:
            def committed_all() -> bool:
                group = f"{topic_prefix}-svc"
                offsets = admin.list_group_offsets(group).get(group, {})
                return sum(o.offset for tp, o in offsets.items() if tp.topic == topics.telemetry) == sent
            wait_for(committed_all, timeout=60, step=1, what="offsets committed past every message")
        finally:
            admin.close()
        svc.term()
        assert ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) == golden
        dlq = tmp_path / "dlq.jsonl"
        record(kafka_bootstrap, topics.dlq, str(dlq), idle_timeout=2)
        letters = [json.loads(x) for x in dlq.read_text().splitlines()]
        got = sorted(d["reason"] for d in letters)
        assert got == sorted(expected)
        assert all(d["origin"].startswith(f"{topics.telemetry}[") for d in letters)
    finally:
        if svc.alive():
            svc.kill9()
