"""The state topic is not trusted (issue 18): forged checkpoints on a real broker are not used.

Partition 0's key in ``<prefix>.state`` is given (1) an unsigned checkpoint whose model state
carries a pickle that would create a marker file when unpickled, and (2) a checkpoint validly
signed with the service's key but for partition 1. The service must use neither: the marker
never appears and it processes partition 0 from the group's committed offset.
"""

from __future__ import annotations

import json
import os
import pickle
import time

import msgspec
import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from pipeline.detection import build_engine
from pipeline.models.modelset import STATE_VERSION
from pipeline.service.state import Checkpoint, KafkaStateStore
from tests.factories import T0
from tests.faults.factories import RULES, ServiceProc, wait_for, write_config
from tests.integration.http_factories import get, metric

pytestmark = pytest.mark.kafka

N, COMMITTED = 60, 40


class _Mkdir:
    """Pickles as a call to os.mkdir: unpickling it anywhere creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _snapshot_with_pickle(marker: str) -> bytes:
    """A real engine snapshot (rules and models) whose model state holds the pickle."""
    engine, _ = build_engine([str(RULES)], "auto", None)
    outer = msgspec.msgpack.decode(engine.snapshot())
    outer["models"] = msgspec.msgpack.encode({"version": STATE_VERSION,
                                              "cohort_names": msgspec.msgpack.Ext(2, pickle.dumps(_Mkdir(marker)))})
    return msgspec.msgpack.encode(outer)


@pytest.mark.parametrize("mode", ["signed", "insecure"])
def test_forged_and_misplaced_checkpoints_are_not_used(kafka_bootstrap, topic_prefix, tmp_path, monkeypatch, mode):
    topics = Topics(topic_prefix)
    group = f"{topic_prefix}-svc"
    ensure_topics(kafka_bootstrap, topics, partitions=1)
    marker = tmp_path / "unpickled"
    key = os.environ["GPUWARDEN_STATE_KEY"].encode()
    if mode == "insecure":
        monkeypatch.delenv("GPUWARDEN_STATE_KEY")

    p = KafkaBusProducer(kafka_bootstrap)
    for t in range(N):
        rec = {"v": 1, "kind": "dcgm", "ts": T0 + t, "host": "n1", "gpu": 0, "fields": {"DCGM_FI_DEV_GPU_TEMP": 60}}
        p.send(topics.telemetry, json.dumps([rec]).encode(), b"n1")
    # Under partition 0's key: a checkpoint validly signed but for partition 1, resuming at 5;
    # then, newest, an unsigned one with the pickle inside, resuming at 0.
    unsigned = KafkaStateStore(kafka_bootstrap, topics.state, group, topics.telemetry, p, key=None)
    signed = KafkaStateStore(kafka_bootstrap, topics.state, group, topics.telemetry, p, key=key)
    engine, _ = build_engine([str(RULES)], "none", None)
    p.send(topics.state, signed.encode(Checkpoint(1, 5, engine.snapshot())), signed.key(0))
    p.send(topics.state, unsigned.encode(Checkpoint(0, 0, _snapshot_with_pickle(str(marker)))), signed.key(0))
    p.flush()
    p.close()
    c = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    tp = TopicPartition(topics.telemetry, 0)
    c.assign([tp])
    c.commit({tp: OffsetAndMetadata(COMMITTED, "", -1)})
    c.close()

    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix, models="auto",
                       insecure_state=(mode == "insecure"))
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()
    try:
        wait_for(lambda: any("http_port" in x for x in svc.lines()), 90, what="the service to start")
        port = next(x["http_port"] for x in svc.lines() if "http_port" in x)
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: metric(get(url)[1], "gpuwarden_records_total") >= N - COMMITTED, 90,
                 what="the records after the committed offset")
        time.sleep(3)
        # From the committed offset, no further back (from offset 0 or 5 it would count 60 or 55).
        text = get(url)[1]
        assert metric(text, "gpuwarden_records_total") == N - COMMITTED
        skipped_metric = {"signed": ('reason="misplaced"', 'reason="unsigned"'), "insecure": ('reason="misplaced"',)}
        for reason in skipped_metric[mode]:
            assert f"gpuwarden_state_checkpoints_skipped_total{{{reason}}} 1.0" in text, text
        assert metric(text, "gpuwarden_state_checkpoints_skipped_total") == len(skipped_metric[mode])
        assert svc.term() == 0
        msgs = [x.get("message", "") for x in svc.lines()]
        stopped = [x for x in svc.lines() if x.get("message", "").startswith("stopping") and x.get("stage") == "host"]
        assert stopped and stopped[-1]["messages"] == N - COMMITTED, stopped
        assert not any("state restored" in m for m in msgs), msgs
        skipped = [m for m in msgs if "skipping the checkpoint" in m]
        assert any("found under" in m for m in skipped), msgs              # partition 1's, in 0's place
        if mode == "signed":
            assert any("unsigned checkpoint" in m for m in skipped), msgs
            assert any("no checkpoint, starting from the committed offset" in m for m in msgs), msgs
        else:
            assert any("INSECURE STATE" in m for m in msgs), msgs
            # Refused before any model state is read: with models the service's host stage writes
            # two-stage checkpoints (the fleet stage's model state is refused the same way:
            # tests/unit/test_fleetstage.py).
            assert any("checkpoint unusable" in m and ("pickled object" in m or "two-stage" in m) for m in msgs), msgs
    finally:
        if svc.alive():
            svc.kill9()
    assert not marker.exists()
