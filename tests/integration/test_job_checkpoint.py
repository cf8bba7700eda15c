"""End to end, the way an operator runs it: `gpuwarden sim` records a fleet with an HBM fault,
`gpuwarden replay` turns it into alerts, and `gpuwarden remediate act` (dry-run off, an inventory
of the simulator's hosts) routes a real one by its job into the checkpoint action, which calls the
trainer's checkpoint hook (a loopback HTTP server here) with the job in the request."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

GPUWARDEN = [sys.executable, "-m", "pipeline"]


class Hook:
    """The trainer's checkpoint endpoint: records each POST, answers 200."""

    def __init__(self) -> None:
        self.hits: list[dict] = []
        hook = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.hits.append({"path": self.path, "body": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def _gw(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    p = subprocess.run([*GPUWARDEN, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), f"gpuwarden {' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}"
    return p


def test_a_replayed_alert_reaches_the_checkpoint_hook_with_its_job(tmp_path, hook):
    _gw("sim", "--hosts", "2", "--duration", "300", "--scenario", "hbm", "--seed", "3", "--out", "rec.jsonl", "-q",
        cwd=tmp_path)
    _gw("replay", "rec.jsonl", "--alerts-out", "alerts.jsonl", "-q", cwd=tmp_path)
    alerts = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert alerts and all(a["job"] == "pretrain" for a in alerts)     # the simulator's job label
    firing = next(a for a in alerts if a["state"] == "firing" and a["severity"] == "critical")
    (tmp_path / "alert.json").write_text(json.dumps(firing))

    (tmp_path / "remediate.yaml").write_text(f"""
state_file: state.sqlite
audit: {{kafka: false, file: audit.jsonl}}
guardrails: {{dry_run: false}}
inventory: {{source: list, hosts: [gpu-node-000, gpu-node-001]}}
actions:
  log: {{type: log}}
  checkpoint:
    type: checkpoint
    mode: http
    url: "http://127.0.0.1:{hook.port}/checkpoint/{{job}}?host={{host}}&gpu={{gpu}}"
    retries: 0
receivers:
  - name: log-only
    actions: [log]
  - name: checkpoint-job
    actions: [checkpoint, log]
route:
  receiver: log-only
  routes:
    - name: pretrain-critical          # a job-level route: it matches on the alert's job
      matchers: ['job="pretrain"', 'severity="critical"']
      receiver: checkpoint-job
""")
    p = _gw("remediate", "act", "--config", "remediate.yaml", "--alert", "alert.json", cwd=tmp_path)
    recs = [json.loads(x) for x in p.stdout.splitlines()]
    assert [(r["action"], r["decision"]) for r in recs] == [("checkpoint", "acted"), ("log", "acted")], recs
    assert recs[0]["route"] == "root > pretrain-critical" and recs[0]["receiver"] == "checkpoint-job"
    assert len(hook.hits) == 1
    hit = hook.hits[0]
    assert hit["path"] == f"/checkpoint/pretrain?host={firing['host']}&gpu={firing['gpu']}"
    assert hit["body"]["job"] == "pretrain" and hit["body"]["id"] == firing["id"]

    # The same alert for a job no route names goes to the root's receiver: no checkpoint.
    other = {**firing, "id": firing["id"] + "-x", "job": "eval"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    p = _gw("remediate", "act", "--config", "remediate.yaml", "--alert", "other.json", cwd=tmp_path)
    assert [json.loads(x)["receiver"] for x in p.stdout.splitlines()] == ["log-only"]
    assert len(hook.hits) == 1
