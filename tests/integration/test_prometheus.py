"""Prometheus for real: Debian's ``prometheus`` (``make systools``) scrapes ``gpuwarden serve`` and a
long-running producer on loopback, and every query of docs/grafana-dashboard.json returns data.

The run makes happen what the panels show: a dcgm-exporter producer publishes every second (a
loopback exporter serving a real scrape), the simulator adds a GPU that falls off the bus
(firing alerts), and one malformed message is a dead letter, all after Prometheus' first scrape,
so rates and increases have two samples to work on.
"""

from __future__ import annotations

import http.server
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from tests.factories import SHARED_DATA
from tests.systools import free_port, http_get, require_tool, stop, wait_http

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
SCRAPE = SHARED_DATA / "dcgm_exporter_h100_8gpu_sampled.prom"


def dashboard_queries() -> tuple[list[tuple[str, str]], list[str]]:
    """(panel title, expr) of every target, and the template variables' label_values queries."""
    d = json.loads(DASHBOARD.read_text())
    targets = [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    variables = [v["query"] for v in d["templating"]["list"] if v.get("type") == "query"]
    return targets, variables


def grafana_to_promql(expr: str, variables: list[str]) -> str:
    """What Grafana sends with every multi-value variable at "All": a match-anything regex."""
    d = json.loads(DASHBOARD.read_text())
    for v in d["templating"]["list"]:
        expr = expr.replace(f"${v['name']}", ".*").replace(f"${{{v['name']}}}", ".*")
    return expr


class Exporter(http.server.ThreadingHTTPServer):
    """A dcgm-exporter on loopback serving a real saved scrape."""

    def __init__(self) -> None:
        body = SCRAPE.read_bytes()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        super().__init__(("127.0.0.1", 0), H)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def query(prom: str, expr: str) -> list[dict]:
    status, body = http_get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200, (expr, body[:500])
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def has_data(result: list[dict]) -> bool:
    return bool(result) and all(math.isfinite(float(r["value"][1])) for r in result)


def test_prometheus_scrapes_service_and_producer_and_every_dashboard_query_has_data(
        kafka_bootstrap, topic_prefix, tmp_path):
    prometheus = require_tool("prometheus", package="prometheus")
    p = topic_prefix
    ensure_topics(kafka_bootstrap, Topics(p), partitions=2)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], log: Path) -> subprocess.Popen:
        fh = open(log, "wb")
        proc = subprocess.Popen(argv, stdout=fh, stderr=fh, cwd=tmp_path, env=env)
        procs.append(proc)
        return proc

    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"kafka": {"bootstrap": kafka_bootstrap, "prefix": p, "group": f"{p}-svc",
                                         "partitions": 2},
                               "http": {"port": free_port()},
                               "service": {"flush_idle_s": 2, "models": "none"}}))
    svc_port = json.loads(cfg.read_text())["http"]["port"]
    exporter = Exporter()
    producer_port = free_port()
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    try:
        svc = start([sys.executable, "-m", "pipeline", "serve", "--config", str(cfg)], tmp_path / "serve.log")
        wait_http(f"http://127.0.0.1:{svc_port}/healthz", 60, svc, tmp_path / "serve.log")
        prod = start([sys.executable, "-m", "pipeline", "produce", "dcgm-exporter",
                      "--url", f"http://127.0.0.1:{exporter.server_address[1]}/metrics", "--interval", "1",
                      "--host", "prom-node-1", "--kafka", kafka_bootstrap, "--prefix", p,
                      "--metrics-port", str(producer_port), "--metrics-host", "127.0.0.1"], tmp_path / "producer.log")
        wait_http(f"http://127.0.0.1:{producer_port}/metrics", 30, prod, tmp_path / "producer.log")

        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: gpuwarden-serve\n    static_configs: [{{targets: ['127.0.0.1:{svc_port}']}}]\n"
            f"  - job_name: gpuwarden-producer\n    static_configs: [{{targets: ['127.0.0.1:{producer_port}']}}]\n")
        pr = start([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn"], tmp_path / "prometheus.log")
        wait_http(f"{prom}/-/ready", 60, pr, tmp_path / "prometheus.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            up = {r["metric"]["job"]: r["value"][1] for r in query(prom, "up")}
            if up == {"gpuwarden-serve": "1", "gpuwarden-producer": "1"}:
                break
            time.sleep(0.5)
        assert up == {"gpuwarden-serve": "1", "gpuwarden-producer": "1"}, up

        # After the first scrapes: alerts (a GPU falls off the bus) and a dead letter.
        done = subprocess.run([sys.executable, "-m", "pipeline", "sim", "--kafka", kafka_bootstrap, "--prefix", p,
                               "--scenario", "gpu_lost", "--hosts", "2", "--duration", "300", "--seed", "1"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        bad = KafkaBusProducer(kafka_bootstrap)
        bad.send(Topics(p).telemetry, b"{not json", b"prom-node-1")
        bad.flush()
        bad.close()

        targets, variables = dashboard_queries()
        assert targets and len(variables) == 2
        pending = {(title, grafana_to_promql(expr, variables)) for title, expr in targets}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            pending = {(t, e) for t, e in pending if not has_data(query(prom, e))}
            if pending:
                time.sleep(1)
        assert not pending, f"dashboard queries without data: {sorted(pending)}"

        # What the run made happen is in it, not only zeros. The series exist from zero (so a
        # dashboard's increase() sees the first alert): wait for the scrape that holds the counts.
        def counted() -> tuple[list, list]:
            firing = query(prom, 'sum by (family) (gpuwarden_alerts_total{state="firing"})')
            dead = query(prom, "sum by (reason) (gpuwarden_dead_letters_total)")
            return firing, dead
        deadline = time.monotonic() + 60
        while True:
            firing, dead = counted()
            gpu = any(r["metric"].get("family") == "gpu" and float(r["value"][1]) > 0 for r in firing)
            malformed = any(r["metric"].get("reason") == "malformed_json" and float(r["value"][1]) > 0 for r in dead)
            if (gpu and malformed) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert gpu, firing
        assert malformed, dead
        sent = query(prom, "sum(rate(gpuwarden_producer_records_sent_total[1m]))")
        assert float(sent[0]["value"][1]) > 0, sent
        for q in variables:   # label_values(METRIC, instance): the variables' values exist
            metric = q.removeprefix("label_values(").split(",")[0].strip()
            status, body = http_get(f"{prom}/api/v1/label/instance/values?" + urllib.parse.urlencode({"match[]": metric}))
            assert status == 200 and json.loads(body)["data"], (q, body)
    finally:
        for proc in reversed(procs):
            stop(proc)
        exporter.shutdown()
