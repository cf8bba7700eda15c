"""The service's operations surface on a real broker: /healthz, /metrics, /incidents, SIGHUP rule
reload."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from tests.factories import T0
from tests.faults.factories import RULES, ServiceProc, wait_for, write_config
from tests.integration.http_factories import get, metric

pytestmark = pytest.mark.kafka


def test_health_metrics_and_sighup_reload(kafka_bootstrap, topic_prefix, tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(RULES, rules, ignore=shutil.ignore_patterns("tests", "models.yaml", "routes.yaml"))
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=2)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix, rules=[str(rules)], reload_check_s=3600)
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()
    try:
        wait_for(lambda: any("http_port" in x for x in svc.lines()), 60, what="the service to start")
        port = next(x["http_port"] for x in svc.lines() if "http_port" in x)
        wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 30, what="healthy")
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert json.loads(body)["status"] == "ok"

        p = KafkaBusProducer(kafka_bootstrap)
        recs = [{"v": 1, "kind": "dcgm", "ts": T0 + t, "host": "n1", "gpu": 0,
                 "fields": {"DCGM_FI_DEV_XID_ERRORS": 0 if t < 40 else 79}} for t in range(120)]
        for r in recs:
            p.send(Topics(topic_prefix).telemetry, json.dumps([r]).encode(), b"n1")
        p.send(Topics(topic_prefix).telemetry, b"{not json", b"n1")
        p.flush()
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: metric(get(url)[1], "gpuwarden_records_total") == 120, 60, what="every record counted")
        text = get(url)[1]
        assert 'gpuwarden_dead_letters_total{reason="malformed_json"} 1.0' in text
        assert 'gpuwarden_alerts_total{family="gpu",state="firing"}' in text
        assert "gpuwarden_batch_processing_seconds_bucket" in text
        logged = [x for x in svc.lines() if x.get("reason") == "malformed_json"]
        assert logged and logged[0]["origin"].startswith(f"{Topics(topic_prefix).telemetry}[")
        assert 'gpuwarden_incidents_total{state="opened"}' in text
        # The open-incidents page beside /metrics: rules only, the fleet stage runs for the incident
        # stage alone (service.incidents, on by default) once its partitions are assigned here.
        incidents = f"http://127.0.0.1:{port}/incidents.json"
        wait_for(lambda: json.loads(get(incidents)[1])["enabled"], 30, what="the fleet stage's incident stages")
        status, page = get(f"http://127.0.0.1:{port}/incidents")
        assert status == 200 and "Incidents are off" not in page and "<script" not in page

        (rules / "gpu.yaml").write_text("rules:\n  - name: broken\n    fault: gpu_x\n    severity: info\n"
                                        "    condition: gpu_tmp > 1\n")
        svc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: metric(get(url)[1], "gpuwarden_rule_reload_failures_total") == 1, 30,
                 what="the broken reload refused")
        assert svc.alive() and get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert any("E102" in x.get("message", "") for x in svc.lines())
        shutil.copy(RULES / "gpu.yaml", rules / "gpu.yaml")
        svc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: any("reloaded" in x.get("message", "") for x in svc.lines()), 30, what="a good reload")
        assert svc.term() == 0
    finally:
        if svc.alive():
            svc.kill9()
