"""Collective-progress records end to end through a real broker: a training job's watchdog lines,
read by the producer, published with its hosts' GPU telemetry to ``<prefix>.telemetry``, carried
by `gpuwarden serve` (host stage -> the fleet topic -> the fleet stage's hang detector) into the
one alert `gpuwarden replay` of the same recording makes, naming the rank behind; with the models
on and rules only."""

from __future__ import annotations

import io
import json
import time

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import ensure_topics
from pipeline.schema import encode
from producers.torch_watchdog import parse
from tests.factories import T0, fleet
from tests.faults.factories import (
    ServiceProc,
    alerts_on_topic,
    golden_alerts,
    ids,
    published_in_background,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.kafka

LINE = ("[rank{r}]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank {r}] Timeout at NCCL work: 547, last enqueued NCCL "
        "work: 547, last completed NCCL work: {done}.")


@pytest.mark.parametrize("models", ["auto", "none"])
def test_serve_carries_progress_records_into_the_hang_alert_of_replay(kafka_bootstrap, topic_prefix, tmp_path, models):
    # With models the host stage forwards every record; rules only (`--models none`, the
    # hang.yaml beside the rules) the progress records alone: the same hang alert either way.
    recs = fleet(range(240), hosts=4, gpus=2)
    for node in range(4):  # one log a node, two ranks each; rank 5 is behind
        text = "\n".join(LINE.format(r=r, done=500 if r == 5 else 546) for r in (2 * node, 2 * node + 1))
        recs += parse(io.StringIO(text), job="4242", host=f"n{node}", default_ts=T0 + 120 + node, gpus_per_node=2)
    rec = tmp_path / "rec.jsonl"
    rec.write_bytes(b"".join(encode(r) + b"\n" for r in sorted(recs, key=lambda r: r.ts)))
    golden = golden_alerts(rec, tmp_path, models)
    hang = [a for a in map(json.loads, (tmp_path / "golden.jsonl").read_text().splitlines())
            if a["rule"] == "hang_collective"]  # fmt: skip
    assert [(a["state"], a["host"], a["gpu"], [s["rank"] for s in a["evidence"]["suspects"]]) for a in hang] == [
        ("firing", "n2", 1, [5])]
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix, models=models)
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=30)
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()
    pub.join(120)
    wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) >= golden, timeout=180, step=2,
             what="every golden alert on the alerts topic")
    time.sleep(2)
    assert svc.term() == 0
    got = alerts_on_topic(kafka_bootstrap, topic_prefix)
    assert ids(got) == golden
    assert [a["summary"] for a in got if a["rule"] == "hang_collective"] == [hang[0]["summary"]]
