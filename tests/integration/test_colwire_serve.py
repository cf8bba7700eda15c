"""Columnar telemetry messages (pipeline/colwire.py) through a real broker and `gpuwarden serve`:
the alerts are exactly those of `gpuwarden replay` of the same records as JSON lines, the answer
every JSON path through the service is held to (tests/faults/test_service_faults.py)."""

from __future__ import annotations

import json

import msgspec
import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from pipeline.bus.telemetry import COLUMNAR, per_host_wire
from producers.nccl_tests import parse_text
from producers.sim import Simulator
from tests.factories import nccl_tests_log
from tests.faults.factories import ServiceProc, alerts_on_topic, golden_alerts, wait_for, write_config

pytestmark = pytest.mark.kafka


def test_columnar_messages_through_serve_give_the_json_replays_alerts(kafka_bootstrap, topic_prefix, tmp_path):
    sim = Simulator(hosts=4, duration=600, seed=8, scenario="mixed")
    batches = [b for b in sim.batches() if b]
    # A burn-in on one host returns wrong results (nccl-tests, as its producer sends it): the host
    # stage's built-in check on NCCL records must raise it from a JSON message among columnar ones.
    burn = parse_text(nccl_tests_log("gpu-node-001", wrong=3), ts=batches[120][0]["ts"])
    batches[120] += [msgspec.to_builtins(r) for r in burn]
    rec = tmp_path / "rec.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for b in batches for r in b))
    golden = golden_alerts(rec, tmp_path)
    assert golden, "the scenario injects faults: an empty answer would prove nothing"
    replayed = map(json.loads, (tmp_path / "golden.jsonl").read_text().splitlines())
    wrong = [a for a in replayed if a["fault"] == "nccl_wrong_results"]
    assert [(a["state"], a["host"]) for a in wrong] == [("firing", "gpu-node-001")]

    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    p = KafkaBusProducer(kafka_bootstrap)
    columnar = 0
    for b in batches:
        for key, value, headers in per_host_wire(b, COLUMNAR):
            p.send(topics.telemetry, value, key, headers=headers)
            columnar += headers is not None
    p.flush()
    p.close()
    assert columnar >= 4 * len(batches) // 2  # the DCGM-only messages went columnar, NCCL ones JSON

    log = tmp_path / "s.log"
    svc = ServiceProc(write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix), log).start()
    seen: set = set()

    def arrived() -> bool:
        seen.clear()
        seen.update((a["id"], a["state"]) for a in alerts_on_topic(kafka_bootstrap, topic_prefix))
        return seen >= golden

    try:
        # The fault suite's bound: a service joining a group on a broker the suite keeps busy.
        try:
            wait_for(arrived, timeout=300, step=1, what="the replay's alerts from the columnar messages")
        except AssertionError as e:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(f"{e}; missing {sorted(golden - seen)[:10]}; service log:\n{tail}") from None
        assert svc.term() == 0
    finally:
        if svc.alive():
            svc.kill9()
    assert {(a["id"], a["state"]) for a in alerts_on_topic(kafka_bootstrap, topic_prefix)} == golden
