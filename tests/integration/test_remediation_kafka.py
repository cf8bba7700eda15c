"""`gpuwarden remediate` against the real broker: alerts in, decisions to <prefix>.audit, a kafka
action to another topic, offsets committed so a restart neither repeats nor loses a decision.

Fake scontrol on PATH records what would have drained a node.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusConsumer, KafkaBusProducer, ensure_topics
from pipeline.remediation.config import load_config
from pipeline.remediation.service import RemediationService
from pipeline.schema import encode
from tests.unit.remediation.factories import Fakes, alert

pytestmark = pytest.mark.kafka


def _config(tmp_path, bootstrap, prefix):
    doc = {
        "kafka": {"bootstrap": bootstrap, "prefix": prefix, "group": f"{prefix}-remediate"},
        "state_file": "state.sqlite",
        "audit": {"kafka": True, "file": "audit.jsonl"},
        "guardrails": {"dry_run": False, "breaker": {"max_nodes": 10, "window": "10m"}},
        # Live node actions act only on an inventory's hosts (docs/remediation.md, "Host inventory").
        "inventory": {"source": "list", "hosts": [f"gpu-node-{i}" for i in range(10)]},
        "actions": {"drain": {"type": "slurm_drain"}, "forward": {"type": "kafka", "topic": f"{prefix}.pages"}},
        "receivers": [{"name": "drain", "actions": ["drain", "forward"]}, {"name": "fwd", "actions": ["forward"]}],
        "route": {"receiver": "fwd", "routes": [{"matchers": ['severity="critical"'], "receiver": "drain"}]},
    }
    p = tmp_path / "remediate.yaml"
    p.write_text(json.dumps(doc))   # JSON is YAML
    return load_config(p)


def _run_until(svc: RemediationService, audit: KafkaBusConsumer, want: int, timeout: float = 90.0) -> list[dict]:
    """Run the service in a thread until ``want`` audit records arrived; return them."""
    stop = threading.Event()
    th = threading.Thread(target=svc.run, args=(stop,), kwargs={"poll_timeout": 0.2}, daemon=True)
    th.start()
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            got += [json.loads(m.value) for m in audit.poll(timeout=0.5)]
        # anything beyond `want` would be a repeat: give it a moment to show up
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            got += [json.loads(m.value) for m in audit.poll(timeout=0.3)]
    finally:
        stop.set()
        th.join(30)
    assert not th.is_alive()
    return got


def test_alerts_from_kafka_are_decided_audited_and_committed(kafka_bootstrap, topic_prefix, tmp_path, monkeypatch,
                                                             kafka_report):
    fakes = Fakes(tmp_path)
    monkeypatch.setenv("PATH", f"{fakes.dir}:/usr/bin:/bin")
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=4)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(f"{topic_prefix}.pages", 1, 1)])
    finally:
        admin.close()

    prod = KafkaBusProducer(kafka_bootstrap)
    sent = []
    for i in range(3):
        sent.append(alert(f"gpu-node-{i}", gpu=i, id=f"crit-{i}"))
    dup = alert("gpu-node-9", gpu=1, id="dup")
    sent += [dup, dup, dup]
    sent.append(alert("n1;id", id="inject"))
    sent.append(alert("gpu-node-5", fault="thermal_throttling", severity="warning", id="warn-5"))
    for a in sent:
        prod.send(topics.alerts, encode(a), (a.host or "").encode())
    prod.send(topics.alerts, b'{"kind":"alert","id":"broken"', b"junk")
    prod.flush()

    audit = KafkaBusConsumer(kafka_bootstrap, topics.audit, group=f"{topic_prefix}-audit-reader")
    cfg = _config(tmp_path, kafka_bootstrap, topic_prefix)
    t0 = time.perf_counter()
    recs = _run_until(RemediationService(cfg), audit, want=14)
    seconds = time.perf_counter() - t0

    by = {}
    for r in recs:
        by.setdefault((r.get("alert_id"), r.get("action")), []).append(r["decision"])
    for i in range(3):
        assert by[(f"crit-{i}", "drain")] == ["acted"] and by[(f"crit-{i}", "forward")] == ["acted"]
    assert sorted(by[("dup", "drain")]) == ["acted"] and sorted(by[("dup", None)]) == ["skipped", "skipped"]
    assert by[("inject", "drain")] == ["skipped"]
    assert by[("warn-5", "forward")] == ["acted"]
    malformed = [r for r in recs if r.get("reason", "").startswith("malformed_alert")]
    assert len(malformed) == 1 and malformed[0]["origin"].startswith(f"{topics.alerts}[")
    assert by[("inject", "forward")] == ["skipped"]     # a refused value stops the receiver's chain
    assert len(recs) == 14
    drained = sorted(c[1] for c in fakes.updates())
    assert drained == ["nodename=gpu-node-0", "nodename=gpu-node-1", "nodename=gpu-node-2", "nodename=gpu-node-9"]
    assert all("n1;id" not in " ".join(c) for c in fakes.calls())

    # the kafka action forwarded the alerts to another topic
    fwd = KafkaBusConsumer(kafka_bootstrap, f"{topic_prefix}.pages", group=f"{topic_prefix}-pages-reader")
    pages = []
    deadline = time.monotonic() + 30
    while len(pages) < 5 and time.monotonic() < deadline:
        pages += [json.loads(m.value)["id"] for m in fwd.poll(timeout=0.5)]
    fwd.close()
    assert sorted(pages) == ["crit-0", "crit-1", "crit-2", "dup", "warn-5"]

    # every alert message's offset is committed
    c = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"{topic_prefix}-remediate",
                      enable_auto_commit=False)
    try:
        parts = [TopicPartition(topics.alerts, p) for p in range(4)]
        ends = c.end_offsets(parts)
        assert all((c.committed(tp) or 0) == ends[tp] for tp in parts)
    finally:
        c.close()

    # restart: one new alert and the duplicate again; the old messages are not read again
    prod.send(topics.alerts, encode(dup), b"gpu-node-9")
    prod.send(topics.alerts, encode(alert("gpu-node-7", id="crit-7")), b"gpu-node-7")
    prod.flush()
    prod.close()
    recs2 = _run_until(RemediationService(_config(tmp_path, kafka_bootstrap, topic_prefix)), audit, want=3)
    audit.close()
    assert sorted((r["alert_id"], r["decision"]) for r in recs2) == [
        ("crit-7", "acted"), ("crit-7", "acted"), ("dup", "skipped")]
    assert len(fakes.updates()) == 5
    kafka_report.append(f"remediation: {len(sent) + 1} alerts -> {len(recs)} audit records in {seconds:.1f}s "
                        f"(incl. group join); restart re-read nothing")


def test_cli_service_runs_until_sigterm(kafka_bootstrap, topic_prefix, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    fakes = Fakes(tmp_path)
    topics = Topics(topic_prefix)
    ensure_topics(kafka_bootstrap, topics, partitions=2)
    cfg = tmp_path / "r.yaml"
    cfg.write_text(json.dumps({
        "kafka": {"bootstrap": kafka_bootstrap, "prefix": topic_prefix, "group": f"{topic_prefix}-rem"},
        "state_file": "s.sqlite", "guardrails": {"dry_run": True},
        "actions": {"drain": {"type": "slurm_drain"}}, "receivers": [{"name": "d", "actions": ["drain"]}],
        "route": {"receiver": "d"}}))
    env = {**os.environ, "PATH": f"{fakes.dir}:/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "remediate", "--config", str(cfg)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        prod = KafkaBusProducer(kafka_bootstrap)
        prod.send(topics.alerts, encode(alert("gpu-node-1", id="cli-1")), b"gpu-node-1")
        prod.flush()
        prod.close()
        audit = KafkaBusConsumer(kafka_bootstrap, topics.audit, group=f"{topic_prefix}-audit")
        got = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got = [json.loads(m.value) for m in audit.poll(timeout=0.5)]
        audit.close()
        assert [(r["alert_id"], r["decision"]) for r in got] == [("cli-1", "dry_run")]
        assert fakes.calls() == []
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "disruptive actions dry-run" in err and "1 alerts handled" in err
