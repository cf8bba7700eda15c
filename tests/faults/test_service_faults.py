"""The service survives kill -9, SIGTERM, a broker restart, poison input and a second replica,
and in every case ends with exactly the alerts of a single uninterrupted replay, and (kill -9,
SIGTERM, a rebalance, a restart between repeats of an XID 79) exactly its incident events."""

from __future__ import annotations

import json
import random
import time

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import ensure_topics
from pipeline.recording import publish
from tests.faults.factories import (
    ServiceProc,
    alerts_on_topic,
    committed,
    golden_alerts,
    golden_incidents,
    incident_events,
    ids,
    incidents_on_topic,
    no_conflicting_duplicates,
    published_in_background,
    wait_for,
    wait_for_incidents,
    write_config,
)

pytestmark = pytest.mark.kafka


def test_kill9_at_random_points_and_restart_loses_no_alert(kafka_bootstrap, topic_prefix, tmp_path, sim_recording):
    rec = sim_recording(hosts=6, duration=900, seed=4)
    golden = golden_alerts(rec, tmp_path)
    golden_inc = golden_incidents(rec, tmp_path)
    assert len(golden_inc) >= 5
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)
    # ~45 s of publishing: about what the five kill/restart rounds take (each waits out the dead
    # member's session), so every kill lands while records are still arriving.
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=20)
    rng = random.Random(7)
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()

    def assignments() -> int:
        return sum(1 for x in svc.lines() if x.get("message", "").startswith("partition "))

    for _ in range(5):
        # Kill only once this run owns partitions and has had a moment to process and
        # checkpoint: a kill during start-up would test nothing.
        seen = assignments()
        wait_for(lambda: assignments() > seen, 90, what="the (re)started service to get partitions")
        time.sleep(rng.uniform(1.0, 4.0))
        svc.kill9()
        svc.start()
    pub.join(120)
    wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) >= golden,
             timeout=150, step=1, what="every golden alert on the alerts topic")
    wait_for_incidents(kafka_bootstrap, topic_prefix, golden_inc)
    svc.term()
    got = alerts_on_topic(kafka_bootstrap, topic_prefix)
    assert ids(got) == golden                      # nothing lost, nothing extra
    no_conflicting_duplicates(got)                 # a repeat after a crash is the same alert
    # Incident events too: none lost, none extra, a repeat after a crash the same event.
    assert incident_events(incidents_on_topic(kafka_bootstrap, topic_prefix)) == golden_inc
    restored = [x for x in svc.lines() if "state restored" in x.get("message", "")]
    assert restored, "no run restored its partitions' state from a checkpoint"


def test_sigterm_finishes_the_batch_and_restart_repeats_at_most_one(kafka_bootstrap, topic_prefix, tmp_path,
                                                                     sim_recording):
    rec = sim_recording(hosts=4, duration=600, seed=5)
    golden_inc = golden_incidents(rec, tmp_path)
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    sent = publish([str(rec)], kafka_bootstrap, Topics(topic_prefix).telemetry)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)
    first = ServiceProc(cfg, tmp_path / "a.log").start()
    wait_for(lambda: any(x.get("message", "").startswith("partition ") for x in first.lines()), 60,
             what="partitions assigned")
    time.sleep(2.5)                                 # mid-way through the backlog
    assert first.term() == 0
    second = ServiceProc(cfg, tmp_path / "b.log").start()
    wait_for(lambda: any("state restored" in x.get("message", "") for x in second.lines()), 60,
             what="the restart restoring state")
    wait_for(lambda: committed(kafka_bootstrap, f"{topic_prefix}-svc", Topics(topic_prefix).telemetry) == sent,
             60, what="the restart to drain the topic and commit past every message")
    wait_for_incidents(kafka_bootstrap, topic_prefix, golden_inc)
    assert second.term() == 0
    assert incident_events(incidents_on_topic(kafka_bootstrap, topic_prefix)) == golden_inc
    done = [x["messages"] for s in (first, second) for x in s.lines()
            if x.get("message", "").startswith("stopping") and x.get("stage") == "host"]
    assert len(done) == 2
    assert sent <= sum(done) <= sent + 200          # at most one batch (max_poll_records) seen twice
    assert done[0] > 0


@pytest.mark.timeout(420)  # above the wait below, so a miss reports what is missing
def test_broker_restart_during_load_service_recovers_by_itself(tmp_path, sim_recording, private_broker):
    bootstrap = private_broker.bootstrap
    rec = sim_recording(hosts=4, duration=600, seed=8)     # the poison case's: one golden replay for both
    golden = golden_alerts(rec, tmp_path)
    lines = rec.read_text().splitlines()
    half = len(lines) // 2
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("\n".join(lines[:half]) + "\n")
    second.write_text("\n".join(lines[half:]) + "\n")
    prefix = "brk"
    ensure_topics(bootstrap, Topics(prefix), partitions=4)
    publish([str(first)], bootstrap, Topics(prefix).telemetry)
    # Idle after 10 s, not 3: no partition idles before the outage, and after it the publisher
    # has room to start on a loaded machine (a partition idle while its records are still to
    # come makes them late, by design; the idle time counts from the broker's return).
    cfg = write_config(tmp_path / "svc.json", bootstrap, prefix, flush_idle_s=10)
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()
    try:
        wait_for(lambda: any(x.get("message", "").startswith("partition ") for x in svc.lines()), 60,
                 what="partitions assigned")
        time.sleep(3)
        private_broker.stop()
        time.sleep(5)                                   # the service polls a dead broker meanwhile
        private_broker.start(keep_data=True)
        publish([str(second)], bootstrap, Topics(prefix).telemetry)

        def differ() -> str:
            got = ids(alerts_on_topic(bootstrap, prefix))
            return f"missing {sorted(golden - got)}, not in the replay {sorted(got - golden)}"
        # A ceiling, not a speed check: the wait ends when the last alert lands (the whole test
        # takes ~70 s alone; a loaded 2-core machine has taken over 150 s for this wait).
        wait_for(lambda: ids(alerts_on_topic(bootstrap, prefix)) >= golden,
                 timeout=300, step=1, what="every golden alert after the broker came back", explain=differ)
        assert svc.alive(), "the service died instead of riding out the outage"
        svc.term()
        got = alerts_on_topic(bootstrap, prefix)
        assert ids(got) == golden
        no_conflicting_duplicates(got)
    finally:
        if svc.alive():
            svc.kill9()


def _poison(ts: int) -> list[str]:
    host = "poison-host"
    return [
        '{"v":1,"kind":"dcgm","ts":17644',
        '{"v":1,"kind":"dcgm","ts":NaN,"host":"%s","gpu":0}' % host,
        '{"v":1,"kind":"smartctl","ts":%d,"host":"%s"}' % (ts, host),
        '{"v":1,"kind":"dcgm","ts":%d,"gpu":0}' % ts,
        '{"v":1,"kind":"dcgm","ts":"noon","host":"%s","gpu":0}' % host,
        '{"v":1,"kind":"dcgm","ts":%d000,"host":"%s","gpu":0}' % (ts, host),
        '{"v":1,"kind":"dcgm","ts":%d,"host":"%s","gpu":0,"fields":{"DCGM_FI_DEV_GPU_TEMP":"<<<blank>>>"}}' % (ts, host),
        '{"v":1,"kind":"dcgm","ts":%d,"host":"%s","gpu":0,"fields":{"DCGM_FI_DEV_GPU_TEMP":Infinity}}' % (ts, host),
    ]


POISON_REASONS = ["malformed_json", "nan_value", "unknown_kind", "missing_key", "wrong_type", "ts_out_of_range",
                  "blank_sentinel", "nan_field"]


def test_one_percent_poison_all_dead_lettered_service_keeps_running(kafka_bootstrap, topic_prefix, tmp_path,
                                                                      sim_recording):
    rec = sim_recording(hosts=4, duration=600, seed=8)
    golden = golden_alerts(rec, tmp_path)
    lines = rec.read_text().splitlines()
    mixed, injected = [], 0
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 800 == 799:                              # 8 poison lines per 800: 1 %
            ts = int(json.loads(line)["ts"])
            mixed += _poison(ts)
            injected += 1
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_text("\n".join(mixed) + "\n")
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    publish([str(dirty)], kafka_bootstrap, Topics(topic_prefix).telemetry)
    svc = ServiceProc(write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix), tmp_path / "s.log").start()
    wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix),
                         "poison-host") >= golden, timeout=120, step=1, what="the golden alerts")
    assert svc.alive()
    svc.term()
    assert ids(alerts_on_topic(kafka_bootstrap, topic_prefix), "poison-host") == golden
    from pipeline.recording import record
    dlq = tmp_path / "dlq.jsonl"
    record(kafka_bootstrap, Topics(topic_prefix).dlq, str(dlq), idle_timeout=2)
    letters = [json.loads(x) for x in dlq.read_text().splitlines()]
    poison = [d for d in letters if d.get("host") in (None, "poison-host")]
    by_reason = {r: sum(d["reason"] == r for d in poison) for r in POISON_REASONS}
    assert by_reason == {r: injected for r in POISON_REASONS}
    assert all(d["origin"].startswith(f"{Topics(topic_prefix).telemetry}[") for d in poison)
    logged = [x for x in svc.lines() if x.get("message", "").startswith("dead letter")]
    assert len(logged) >= len(poison) and all("]@" in x["origin"] for x in logged)


def test_two_replicas_split_partitions_and_a_rebalance_moves_state(kafka_bootstrap, topic_prefix, tmp_path,
                                                                   sim_recording):
    rec = sim_recording(hosts=6, duration=900, seed=4)     # the kill -9 case's: one golden replay for both
    golden = golden_alerts(rec, tmp_path)
    golden_inc = golden_incidents(rec, tmp_path)
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=40)
    a = ServiceProc(cfg, tmp_path / "a.log").start()
    time.sleep(8)
    b = ServiceProc(cfg, tmp_path / "b.log").start()    # joins: the group rebalances, state moves
    pub.join(120)
    wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) >= golden,
             timeout=150, step=1, what="every golden alert from the two replicas")
    wait_for_incidents(kafka_bootstrap, topic_prefix, golden_inc)
    assert a.alive() and b.alive()
    a.term(), b.term()
    got = alerts_on_topic(kafka_bootstrap, topic_prefix)
    assert ids(got) == golden
    no_conflicting_duplicates(got)
    assert incident_events(incidents_on_topic(kafka_bootstrap, topic_prefix)) == golden_inc
    assert any("state restored" in x.get("message", "") for x in b.lines()), "B took over no partition's state"
    assert any("revoked" in x.get("message", "") for x in a.lines())
    done = [x["messages"] for s in (a, b) for x in s.lines()
            if x.get("message", "").startswith("stopping") and x.get("stage") == "host"]
    assert len(done) == 2 and all(n > 0 for n in done)


def xid79_recording(path, hours: int = 20, step: int = 30):
    """One host, two GPUs sampled every ``step`` s for ``hours``; GPU 0 falls off the bus (XID 79)
    at 10 minutes and every 4 hours after: five times in 16 h 10 min."""
    from pipeline.schema import encode
    from tests.factories import sample

    xids = [600 + i * 4 * 3600 for i in range(5)]
    with open(path, "wb") as f:
        for t in range(0, hours * 3600, step):
            for g in range(2):
                x = 79 if g == 0 and any(x <= t < x + 60 for x in xids) else 0
                f.write(encode(sample(t, "n0", g, xid=x)) + b"\n")
    return path


def test_xid79_five_times_escalates_once_with_a_restart_between_the_third_and_fourth(kafka_bootstrap, topic_prefix,
                                                                                     tmp_path):
    # Issue #33: the repeat-offender history is checkpointed with the fleet stage that runs the
    # incident stage, so the count of XID 79s on the GPU survives a restart of `serve`.
    rec = xid79_recording(tmp_path / "xid79.jsonl")
    golden_inc = golden_incidents(rec, tmp_path)
    lines = rec.read_bytes().splitlines(keepends=True)
    cut = len(lines) // 2            # 10 h: after the third XID 79 (8 h 10 min), before the fourth
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_bytes(b"".join(lines[:cut]))
    second.write_bytes(b"".join(lines[cut:]))
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)

    def opened() -> list[dict]:
        return [e for e in incidents_on_topic(kafka_bootstrap, topic_prefix)
                if e["state"] == "opened" and e["root"]["rule"] == "gpu_fallen_off_bus"]

    publish([str(first)], kafka_bootstrap, topics.telemetry)
    a = ServiceProc(cfg, tmp_path / "a.log").start()
    wait_for(lambda: len(opened()) == 3, 90, step=1, what="three XID 79 incidents before the restart")
    assert a.term() == 0
    assert not [e for e in incidents_on_topic(kafka_bootstrap, topic_prefix) if e.get("policy") == "xid79_repeat"]
    publish([str(second)], kafka_bootstrap, topics.telemetry)
    b = ServiceProc(cfg, tmp_path / "b.log").start()
    wait_for(lambda: len(opened()) == 5, 90, step=1, what="five XID 79 incidents after the restart")
    wait_for_incidents(kafka_bootstrap, topic_prefix, {e for e in golden_inc if '"xid79_repeat"' in e}, timeout=60)
    assert b.term() == 0
    got = incidents_on_topic(kafka_bootstrap, topic_prefix)
    escalations = {json.dumps(e, sort_keys=True) for e in got if e.get("policy") == "xid79_repeat"}
    assert len(escalations) == 1
    (esc,) = map(json.loads, escalations)
    assert esc["action"] == "drain_and_inspect" and esc["reason"].startswith("policy xid79_repeat: XID 79 5 times")
    assert any("fleet partition" in x.get("message", "") and "state restored" in x.get("message", "")
               for x in b.lines())
    assert incident_events(got) == golden_inc
