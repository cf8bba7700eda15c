"""Webhook presets for Slack and PagerDuty Events v2, and 429/5xx retried with ``Retry-After``
(seconds or an HTTP-date, bounded), against a loopback HTTP server."""

from __future__ import annotations

import email.utils
import json
import random
import time

import pytest

from pipeline.errors import ConfigError
from pipeline.remediation.actions import Context, retry_after
from pipeline.remediation.config import parse_config
from pipeline.remediation.presets import build_action
from tests.unit.remediation.factories import alert, config


def _action(spec: dict, tmp_path):
    cfg = parse_config({"actions": {"hook": spec}, "receivers": [{"name": "r", "actions": ["hook"]}],
                        "route": {"receiver": "r"}, "state_file": str(tmp_path / "s.sqlite")}, base_dir=tmp_path)
    return build_action("hook", cfg.actions["hook"])


def _run(act, a, sleeps):
    plan = act.plan(a)
    return act.execute(plan, Context(sleep=lambda d: (sleeps.append(d), time.sleep(d)), rng=random.Random(3)))


def test_retry_after_reads_seconds_and_http_dates():
    now = time.time()
    assert retry_after("7", now) == 7.0
    assert retry_after(" 0 ", now) == 0.0
    date = email.utils.formatdate(now + 30, usegmt=True)            # "Tue, 01 Dec 2026 21:00:00 GMT"
    assert 28.0 <= retry_after(date, now) <= 31.0
    assert retry_after(email.utils.formatdate(now - 100, usegmt=True), now) == 0.0   # in the past: now
    assert retry_after(None, now) is None and retry_after("soon", now) is None and retry_after("-5", now) is None
    assert retry_after("9" * 40, now) == float("inf")


def test_429_is_retried_after_its_retry_after_seconds(server, tmp_path):
    s = server([(429, {"Retry-After": "1"}), (200, {})])
    sleeps: list[float] = []
    out = _run(_action({"type": "webhook", "url": s.url + "/h", "backoff": "10ms"}, tmp_path), alert(), sleeps)
    assert out.ok and out.attempts == 2 and sleeps == [1.0]
    assert s.hits[1]["t"] - s.hits[0]["t"] >= 1.0


def test_503_with_an_http_date_retry_after_waits_until_then(server, tmp_path):
    s = server([(503, {"Retry-After": email.utils.formatdate(time.time() + 2, usegmt=True)}), (200, {})])
    sleeps: list[float] = []
    out = _run(_action({"type": "webhook", "url": s.url + "/h", "backoff": "10ms"}, tmp_path), alert(), sleeps)
    assert out.ok and out.attempts == 2 and 0.5 <= sleeps[0] <= 2.5


def test_429_without_retry_after_backs_off_and_gives_up_after_retries(server, tmp_path):
    s = server([(429, {})])
    sleeps: list[float] = []
    out = _run(_action({"type": "webhook", "url": s.url, "retries": 2, "backoff": "10ms"}, tmp_path), alert(), sleeps)
    assert not out.ok and out.attempts == 3 and len(s.hits) == 3 and "HTTP 429" in out.error
    assert all(0.005 <= d <= 0.04 for d in sleeps)


def test_a_retry_after_beyond_the_bound_is_not_waited_for(server, tmp_path):
    s = server([(429, {"Retry-After": "3600"}), (200, {})])
    sleeps: list[float] = []
    t0 = time.monotonic()
    out = _run(_action({"type": "webhook", "url": s.url, "max_retry_after": "30s"}, tmp_path), alert(), sleeps)
    assert not out.ok and len(s.hits) == 1 and sleeps == [] and time.monotonic() - t0 < 5
    assert "Retry-After 3600s" in out.error and "max_retry_after 30s" in out.error


def test_other_4xx_are_still_final(server, tmp_path):
    s = server([(403, {"Retry-After": "1"}), (200, {})])
    out = _run(_action({"type": "webhook", "url": s.url}, tmp_path), alert(), [])
    assert not out.ok and len(s.hits) == 1 and "not retried" in out.error


def test_slack_preset_posts_an_incoming_webhook_message_with_escaped_text(server, tmp_path, monkeypatch):
    s = server([(200, {})])
    monkeypatch.setenv("SLACK_URL", s.url + "/services/T000/B000/sekrit")
    act = _action({"type": "webhook", "format": "slack", "url_env": "SLACK_URL"}, tmp_path)
    a = alert("gpu-node-7", 3, job="train-42", labels={"namespace": "research", "pod": "trainer-0"})
    a.summary = "hot <!channel> & <https://evil.example|click>"
    plan = act.plan(a)
    assert "sekrit" not in plan.url and plan.url.startswith("http://127.0.0.1:")     # what the audit shows
    out = act.execute(plan, Context())
    assert out.ok and s.hits[0]["path"] == "/services/T000/B000/sekrit"
    msg = json.loads(s.hits[0]["body"])
    assert msg["text"].startswith("CRITICAL: hbm_uncorrectable_error on gpu-node-7 GPU 3: hot ")
    assert "<!channel>" not in s.hits[0]["body"].decode() and "&lt;!channel&gt; &amp; &lt;https" in msg["text"]
    assert msg["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": msg["text"]}}
    facts = [e["text"] for e in msg["blocks"][1]["elements"]]
    assert "*job* train-42" in facts and "*namespace* research" in facts and "*pod* trainer-0" in facts


def test_slack_url_never_reaches_the_audit(server, tmp_path, monkeypatch, harness):
    s = server([(200, {})])
    monkeypatch.setenv("SLACK_URL", s.url + "/services/T000/B000/sekrit")
    cfg = config(tmp_path, actions={"slack": {"type": "webhook", "format": "slack", "url_env": "SLACK_URL"}},
                 receivers=[{"name": "r", "actions": ["slack"]}], route={"receiver": "r"})
    h = harness(cfg)
    recs = h.handle(alert())
    assert recs[0].decision == "acted" and "sekrit" not in recs[0].url and "$SLACK_URL" in recs[0].url


def test_pagerduty_preset_triggers_and_resolves_on_the_alert_id(server, tmp_path, monkeypatch):
    s = server([(202, {})])
    monkeypatch.setenv("PD_KEY", "R0UTINGKEY")
    act = _action({"type": "webhook", "format": "pagerduty", "url": s.url + "/v2/enqueue",
                   "routing_key_env": "PD_KEY"}, tmp_path)
    a = alert("gpu-node-7", 3, id="alert-123", job="train-42", severity="critical")
    a.evidence = {"xid": 79.0}
    assert act.execute(act.plan(a), Context()).ok
    ev = json.loads(s.hits[0]["body"])
    assert ev["routing_key"] == "R0UTINGKEY" and ev["event_action"] == "trigger" and ev["dedup_key"] == "alert-123"
    p = ev["payload"]
    assert p["severity"] == "critical" and p["source"] == "gpu-node-7" and p["class"] == "hbm_uncorrectable_error"
    assert p["group"] == "hbm" and p["component"] == "gpu3" and p["timestamp"].endswith("Z")
    assert p["summary"].startswith("hbm_uncorrectable_error on gpu-node-7 GPU 3")
    assert p["custom_details"]["job"] == "train-42" and p["custom_details"]["evidence"] == {"xid": 79.0}
    r = alert("gpu-node-7", 3, id="alert-123", state="resolved")
    assert act.execute(act.plan(r), Context()).ok
    assert json.loads(s.hits[1]["body"]) == {"routing_key": "R0UTINGKEY", "event_action": "resolve",
                                             "dedup_key": "alert-123"}


def test_pagerduty_defaults_to_the_events_api_and_needs_its_key(tmp_path, monkeypatch, harness):
    monkeypatch.delenv("PD_KEY", raising=False)
    act = _action({"type": "webhook", "format": "pagerduty", "routing_key_env": "PD_KEY"}, tmp_path)
    assert act.url == "https://events.pagerduty.com/v2/enqueue"
    with pytest.raises(ConfigError, match="routing_key_env"):
        _action({"type": "webhook", "format": "pagerduty"}, tmp_path)
    # The key missing from the environment at alert time: audited, nothing sent.
    cfg = config(tmp_path, actions={"pd": {"type": "webhook", "format": "pagerduty", "routing_key_env": "PD_KEY"}},
                 receivers=[{"name": "r", "actions": ["pd"]}], route={"receiver": "r"})
    recs = harness(cfg).handle(alert())
    assert recs[0].decision == "skipped" and "PD_KEY" in recs[0].reason


@pytest.mark.parametrize("spec, key", [
    ({"type": "webhook", "format": "teams", "url": "http://x/"}, "actions.hook.format"),
    ({"type": "webhook", "url_env": "NOPE_NOT_SET"}, "actions.hook.url_env"),
    ({"type": "webhook"}, "actions.hook.url"),
])
def test_preset_config_errors_name_their_key(tmp_path, spec, key, monkeypatch):
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    with pytest.raises(ConfigError) as e:
        _action(spec, tmp_path)
    assert key in str(e.value)
