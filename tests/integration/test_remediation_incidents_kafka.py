"""`remediate` with `source: incidents` against the real broker: incident events of the incident
stage on `<prefix>.incidents` -> one drain request per incident to a real webhook server on
127.0.0.1 -> decisions naming the incident on `<prefix>.audit`, offsets committed."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusConsumer, KafkaBusProducer, ensure_topics
from pipeline.incidents import IncidentStage, default_config
from pipeline.remediation.config import load_config
from pipeline.remediation.incidents import incidents_topic
from pipeline.remediation.service import RemediationService
from pipeline.schema import encode
from tests.unit.incidents.factories import alert
from tests.unit.remediation.factories import ScriptedServer

pytestmark = pytest.mark.kafka


def _config(tmp_path, bootstrap: str, prefix: str, url: str):
    doc = {
        "kafka": {"bootstrap": bootstrap, "prefix": prefix, "group": f"{prefix}-remediate"},
        "source": "incidents",
        "state_file": "state.sqlite",
        "audit": {"kafka": True},
        "guardrails": {"dry_run": False},
        "inventory": {"source": "list", "hosts": ["n1", "n2"]},
        "actions": {
            "drain": {"type": "webhook", "url": url + "/drain/{host}", "disruptive": True, "retries": 0},
            "inspect": {"type": "webhook", "url": url + "/inspect/{host}", "retries": 0},
            "log": {"type": "log"},
        },
        "receivers": [{"name": "log", "actions": ["log"]}, {"name": "drain", "actions": ["drain"]},
                      {"name": "drain-and-inspect", "actions": ["drain", "inspect"]}],
        "route": {"receiver": "log", "routes": [
            {"matchers": ['action="drain_and_inspect"'], "receiver": "drain-and-inspect"},
            {"matchers": ['action="drain_node"'], "receiver": "drain"}]},
    }
    p = tmp_path / "remediate.yaml"
    p.write_text(json.dumps(doc))   # JSON is YAML
    return load_config(p)


def test_incidents_from_kafka_drain_once_and_the_audit_names_them(kafka_bootstrap, topic_prefix, tmp_path,
                                                                  kafka_report):
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=2)  # <prefix>.incidents among them
    assert incidents_topic(topic_prefix) == topics.incidents
    srv = ScriptedServer([200])

    stage = IncidentStage(default_config())
    events = stage.process([
        alert("nvlink_xid74", 0, "n1", 0, xid=74), alert("nvlink_crc_errors", 10), alert("nvlink_replays", 20),
        alert("nvlink_recoveries", 30), alert("nvlink_error_rate", 40),
        alert("nvlink_recoveries", 50, id="f2"), alert("nvlink_recoveries", 60, id="f3"),   # flaps: escalates
        alert("nvlink_xid74", 70, "n1", 1, xid=74),                                        # the drained host
    ])
    first = events[0].incident
    assert sum(e.state == "opened" for e in events) == 2
    prod = KafkaBusProducer(kafka_bootstrap)
    for e in [*events, events[0]]:                                   # the opened event, delivered twice
        prod.send(incidents_topic(topic_prefix), encode(e), (e.host or "").encode())
    prod.send(incidents_topic(topic_prefix), b'{"kind":"incident","incident":', b"n1")
    prod.flush()
    prod.close()

    audit = KafkaBusConsumer(kafka_bootstrap, topics.audit, group=f"{topic_prefix}-audit-reader")
    svc = RemediationService(_config(tmp_path, kafka_bootstrap, topic_prefix, srv.url))
    stop = threading.Event()
    th = threading.Thread(target=svc.run, args=(stop,), kwargs={"poll_timeout": 0.2}, daemon=True)
    t0 = time.perf_counter()
    th.start()
    recs: list[dict] = []
    try:
        deadline = time.monotonic() + 90
        while len(recs) < 12 and time.monotonic() < deadline:
            recs += [json.loads(m.value) for m in audit.poll(timeout=0.5)]
        end = time.monotonic() + 2.0          # anything beyond would be a repeat
        while time.monotonic() < end:
            recs += [json.loads(m.value) for m in audit.poll(timeout=0.3)]
    finally:
        stop.set()
        th.join(30)
        audit.close()
        srv.close()
    seconds = time.perf_counter() - t0
    assert not th.is_alive()

    assert [h["path"] for h in srv.hits] == ["/drain/n1", "/inspect/n1"]
    assert len(recs) == 12, recs
    acted = [r for r in recs if r["decision"] == "acted"]
    assert [(r["incident"], r["action"], r["incident_state"]) for r in acted] == [
        (first, "drain", "opened"), (first, "inspect", "updated")]
    assert acted[1]["policy"] == "nvlink_flaps" and "nvlink_recoveries alerts 3 times" in acted[1]["escalation"]
    reasons = sorted(r["reason"].partition(":")[0] for r in recs if r["decision"] == "skipped")
    assert reasons == ["covered", "covered", "duplicate", "incident_update", "incident_update", "incident_update",
                       "incident_update", "incident_update", "incident_update", "malformed_incident"]
    malformed = next(r for r in recs if r.get("reason", "").startswith("malformed_incident"))
    assert malformed["origin"].startswith(f"{incidents_topic(topic_prefix)}[")

    c = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"{topic_prefix}-remediate",
                      enable_auto_commit=False)
    try:
        parts = [TopicPartition(incidents_topic(topic_prefix), p) for p in range(2)]
        ends = c.end_offsets(parts)
        assert all((c.committed(tp) or 0) == ends[tp] for tp in parts)
    finally:
        c.close()
    kafka_report.append(f"remediation (incidents): {len(events) + 2} incident messages -> {len(recs)} audit "
                        f"records, 1 drain, in {seconds:.1f}s (incl. group join)")
