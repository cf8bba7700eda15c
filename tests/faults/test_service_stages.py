"""Both stages against a real broker (docs/operations.md, Topology): a recording with cross-host
faults -- a straggler on a data-parallel communicator spanning every host, a host whose NCCL
bandwidth sags, cohort-model alerts -- replayed through Kafka into 1 and 4 replicas joining
mid-stream (rebalances of both stages), and into separate host- and fleet-stage processes with
one killed, gives exactly the alert set of `gpuwarden replay` of the file, models on."""

from __future__ import annotations

import json
import time

import pytest

from pipeline.bus import Topics
from tests.faults.conftest import ServiceProc, alerts_on_topic, ensure_topics, golden_alerts, wait_for, write_config
from tests.faults.test_service_faults import ids, no_conflicting_duplicates, published_in_background

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def cross_host(tmp_path_factory):
    import subprocess
    import sys

    from tests.faults.conftest import ROOT
    tmp = tmp_path_factory.mktemp("stages")
    rec = tmp / "rec.jsonl"
    subprocess.run([sys.executable, "-m", "pipeline", "sim", "--hosts", "8", "--duration", "600", "--seed", "3",
                    "--scenario", "mixed", "--out", str(rec)], check=True, cwd=ROOT, capture_output=True)
    golden = golden_alerts(rec, tmp)
    models = {json.loads(x)["labels"].get("detector") for x in (tmp / "golden.jsonl").read_text().splitlines()}
    assert {"nccl_straggler", "nccl_busbw", "counter_rate"} <= models, models
    return rec, golden


def _drain(procs, bootstrap, prefix, tmp, golden) -> list[dict]:
    wait_for(lambda: ids(alerts_on_topic(bootstrap, prefix)) >= golden, timeout=240, step=2,
             what="every golden alert on the alerts topic")
    time.sleep(3)
    for p in procs:
        if p.alive():
            assert p.term() == 0
    return alerts_on_topic(bootstrap, prefix)


# 1: the two stages in one process; 4: three joining one by one, each a rebalance of both
# groups (2 replicas proved nothing 4 does not).
@pytest.mark.parametrize("replicas", [1, 4])
def test_replicas_joining_mid_stream_give_the_alerts_of_one_replay(kafka_bootstrap, topic_prefix, tmp_path,
                                                                    cross_host, replicas):
    rec, golden = cross_host
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=30)   # ~20 s of publishing
    procs = [ServiceProc(cfg, tmp_path / "r0.log").start()]
    for i in range(1, replicas):
        time.sleep(4)          # each one joins mid-stream: both groups rebalance, state moves
        procs.append(ServiceProc(cfg, tmp_path / f"r{i}.log").start())
    pub.join(120)
    got = _drain(procs, kafka_bootstrap, topic_prefix, tmp_path, golden)
    assert ids(got) == golden
    no_conflicting_duplicates(got)
    if replicas > 1:
        assert any("state restored" in x.get("message", "") for p in procs[1:] for x in p.lines())


def test_separate_stage_processes_and_a_killed_fleet_replica(kafka_bootstrap, topic_prefix, tmp_path, cross_host):
    rec, golden = cross_host
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=30)
    host = ServiceProc(cfg, tmp_path / "host.log", "--stage", "host").start()
    fleet_a = ServiceProc(cfg, tmp_path / "fa.log", "--stage", "fleet").start()
    fleet_b = ServiceProc(cfg, tmp_path / "fb.log", "--stage", "fleet").start()
    wait_for(lambda: any("fleet partition" in x.get("message", "") for x in fleet_a.lines()), 60,
             what="the first fleet replica to get partitions")
    time.sleep(8)
    fleet_a.kill9()          # mid-stream: its partitions move to the other with their checkpoints
    pub.join(120)
    got = _drain([host, fleet_b], kafka_bootstrap, topic_prefix, tmp_path, golden)
    assert ids(got) == golden
    no_conflicting_duplicates(got)
    assert any(x.get("stages") == ["fleet"] for x in fleet_b.lines())
    assert any(x.get("stages") == ["host"] for x in host.lines())
