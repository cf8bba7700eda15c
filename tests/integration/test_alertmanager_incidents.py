"""The real Alertmanager (Debian's prometheus-alertmanager on loopback) loaded with the
configuration `gpuwarden rules alertmanager-config` prints: incidents posted by `remediate` are
one notification group each, however many alerts and escalations they had; and in alert mode the
generated inhibit rules mute an explained alert while the alert explaining it fires."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.incidents import IncidentStage, default_config
from tests.systools import require_tool, run_alertmanager
from tests.unit.incidents.factories import alert, resolved
from tests.unit.remediation.factories import Harness, config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The configuration the CLI prints for the shipped incidents.yaml, checked by amtool when present."""
    d = tmp_path_factory.mktemp("amcfg")
    out = subprocess.run([sys.executable, "-m", "pipeline", "rules", "alertmanager-config"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    text = out.stdout.replace("group_by:\n  - host", "group_wait: 1s\n  group_interval: 1s\n  group_by:\n  - host", 1)
    assert "group_wait: 1s" in text
    p = d / "am.yml"
    p.write_text(text)
    try:
        amtool = require_tool("amtool", package="prometheus-alertmanager")
    except pytest.skip.Exception:
        return p
    check = subprocess.run([amtool, "check-config", str(p)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    return p


@pytest.fixture(scope="module")
def alertmanager(generated, tmp_path_factory):
    d = tmp_path_factory.mktemp("am")
    with run_alertmanager(generated, d) as url:
        yield url


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _until(fn, timeout: float = 15.0):
    """``fn()`` once it is truthy, else its last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    got = fn()
    while not got and time.monotonic() < deadline:
        time.sleep(0.2)
        got = fn()
    return got


def _am_config(tmp_path, url: str, source: str):
    return config(tmp_path, source=source, actions={"am": {"type": "alertmanager"}},
                  receivers=[{"name": "am", "actions": ["am"], "on_resolved": ["am"]}], route={"receiver": "am"},
                  alertmanager={"url": url, "silences": False})


def test_each_incident_is_one_notification_group(alertmanager, tmp_path):
    stage = IncidentStage(default_config())
    fault = [alert("nvlink_xid74", 0, "am-n1", 0, xid=74), alert("nvlink_crc_errors", 10, "am-n1"),
             alert("nvlink_replays", 20, "am-n1"), alert("nvlink_recoveries", 30, "am-n1"),
             alert("nvlink_error_rate", 40, "am-n1"), alert("nvlink_recoveries", 50, "am-n1", id="f2"),
             alert("nvlink_recoveries", 60, "am-n1", id="f3")]
    others = [alert("nvlink_xid74", 70, "am-n1", 1, xid=74), alert("hbm_ecc_xid", 80, "am-n2", 2, xid=48)]
    events = stage.process([*fault, *others])
    assert len(events) == 10 and [e.action for e in events if "action_escalated" in e.changes] == ["drain_and_inspect"]
    incidents = list(dict.fromkeys(e.incident for e in events))
    assert len(incidents) == 3
    h = Harness(_am_config(tmp_path, alertmanager, "incidents"))
    try:
        for e in events:
            h.handle_incident(e)
        assert [r.incident_state for r in h.decisions("acted")] == ["opened", "updated", "opened", "opened"]

        def ours():
            return [g for g in _get(alertmanager + "/api/v2/alerts/groups")
                    if g["labels"].get("incident") in incidents]

        groups = _until(lambda: len(ours()) == 3 and ours())
        assert sorted(g["labels"]["incident"] for g in groups) == sorted(incidents)
        for g in groups:
            assert g["labels"] == {"incident": g["labels"]["incident"]}
            [a] = g["alerts"]          # escalated or not, an incident is one alert
            assert a["labels"]["incident"] == g["labels"]["incident"] and "action" not in a["labels"]
            assert a["labels"]["source"] == "gpuwarden" and a["labels"]["host"] in ("am-n1", "am-n2")
        first = next(g for g in groups if g["labels"]["incident"] == incidents[0])["alerts"][0]
        assert '"action":"drain_and_inspect"' in first["annotations"]["evidence"]   # the escalation, re-posted

        # The fault's alerts resolve; after `quiet` its incident resolves, and so does its alert.
        done = stage.process([resolved(a, 100) for a in fault] + [alert("pcie_replay_rate", 1000, "am-n9", 0)])
        for e in done:
            h.handle_incident(e)
        assert _until(lambda: [g["labels"]["incident"] for g in ours()] == incidents[1:] or None)
    finally:
        h.close()


def test_generated_inhibit_rules_mute_an_explained_alert_while_its_cause_fires(alertmanager, tmp_path):
    h = Harness(_am_config(tmp_path, alertmanager, "alerts"))
    try:
        link = alert("nvlink_xid74", 0, "inh-1", 0, xid=74)
        busbw = alert("nccl_comm_busbw", 5, "inh-1", None)          # its host's bandwidth: explained
        elsewhere = alert("nccl_comm_busbw", 5, "inh-2", None)      # another host's: not
        lost = alert("gpu_fallen_off_bus", 0, "inh-3", 1)
        same_gpu = alert("gpu_xid_warning", 5, "inh-3", 1, xid=13)   # explained on its GPU ...
        other_gpu = alert("gpu_xid_warning", 5, "inh-3", 2, xid=13)  # ... not on another GPU
        for a in (link, busbw, elsewhere, lost, same_gpu, other_gpu):
            assert [r.decision for r in h.handle(a)] == ["acted"]

        def inhibited() -> dict[tuple[str, str, str], bool]:
            return {(a["labels"]["alertname"], a["labels"]["host"], a["labels"].get("gpu", "")):
                    bool(a["status"]["inhibitedBy"])
                    for a in _get(alertmanager + "/api/v2/alerts") if a["labels"]["host"].startswith("inh-")}

        want = {("nvlink_xid74", "inh-1", "0"): False, ("nccl_comm_busbw", "inh-1", ""): True,
                ("nccl_comm_busbw", "inh-2", ""): False, ("gpu_fallen_off_bus", "inh-3", "1"): False,
                ("gpu_xid_warning", "inh-3", "1"): True, ("gpu_xid_warning", "inh-3", "2"): False}
        assert _until(lambda: inhibited() == want or None), inhibited()

        # The link's alert resolves: its host's bandwidth alert is no longer muted.
        h.handle(resolved(link, 60))
        assert _until(lambda: inhibited().get(("nccl_comm_busbw", "inh-1", "")) is False or None), inhibited()
    finally:
        h.close()
