"""Telemetry strings in every field of a notification stay text: no Slack mention or link from a
host, a job or a label; PagerDuty's limits kept; Alertmanager label names valid whatever the
alert's labels say (docs/remediation.md, Slack and PagerDuty, Alertmanager)."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.remediation.alertmanager import am_alert, am_labels
from pipeline.remediation.payloads import PD_SUMMARY_LIMIT, SLACK_TEXT_LIMIT, pagerduty_body, slack_body
from pipeline.schema import AlertEvent
from tests.factories import T0

# Slack's control sequences: a mention of everyone, a user group, a user, a disguised link.
SLACK_CONTROLS = ["<!channel>", "<!here|here>", "<!subteam^S0123|oncall>", "<@U0123>", "<https://evil.example|docs>"]


def hostile_alert(**kw) -> AlertEvent:
    args = dict(
        id="a1",
        state="firing",
        fault="hbm_uncorrectable_error",
        severity="critical",
        rule="<!channel>",
        host="<!here>",
        gpu=0,
        job="<https://evil.example|job>",
        ts=T0,
        started_at=T0 - 30,
        summary=" ".join(SLACK_CONTROLS) + " &amp; \n\x1b[2J",
        labels={
            "namespace": "<!everyone>",
            "pod": "<@U0123>",
            "bad-name": "x",
            "é": "x",
            "a\n": "x",
            "host": "<!channel>",
            "__meta": "<x>",
            "team": "a\nb\x00c",
        },
        evidence={"</script>": "<!channel>", "n": float("nan")},
    )
    return AlertEvent(**{**args, **kw})


def _texts(body: dict) -> list[str]:
    return [body["text"], body["blocks"][0]["text"]["text"], *[e["text"] for e in body["blocks"][1]["elements"]]]


def test_no_slack_field_holds_a_control_sequence_from_the_alert():
    body = json.loads(slack_body(hostile_alert()))
    texts = _texts(body)
    assert len(texts) == 2 + 5  # rule, alert, job, namespace, pod
    for t in texts:
        assert "<" not in t and ">" not in t, t  # no mention, link or date in any field
        assert not re.search(r"&(?!(amp|lt|gt);)", t), t  # every & an entity: none reads as one
    assert "RESOLVED" not in body["text"] and "&lt;!here&gt; GPU 0" in body["text"]
    assert "&amp;amp;" in body["text"]  # an entity in the data is shown, not read
    assert "*job* &lt;https://evil.example|job&gt;" in texts and "*namespace* &lt;!everyone&gt;" in texts


def test_slack_text_is_cut_to_its_limits_after_escaping():
    body = json.loads(slack_body(hostile_alert(summary="<" * 10_000, job="&" * 1000)))
    texts = _texts(body)
    assert len(body["text"]) == SLACK_TEXT_LIMIT and all(len(t) <= 300 for t in texts[2:])
    assert all("<" not in t for t in texts)


def test_pagerduty_keeps_its_limits_and_carries_the_values_as_json_strings(monkeypatch):
    monkeypatch.setenv("PD_KEY", "k")
    ev = json.loads(pagerduty_body("PD_KEY")(hostile_alert(summary="x" * 5000)))
    p = ev["payload"]
    assert len(p["summary"]) == PD_SUMMARY_LIMIT and p["source"] == "<!here>" and ev["dedup_key"] == "a1"
    d = p["custom_details"]
    assert d["labels"]["team"] == "a\nb\x00c" and d["evidence"] == {"</script>": "<!channel>", "n": None}
    assert p["severity"] in ("critical", "error", "warning", "info")
    assert (
        json.loads(pagerduty_body("PD_KEY")(hostile_alert(severity="<!channel>")))["payload"]["severity"] == "warning"
    )


@pytest.mark.parametrize("state", ["firing", "resolved"])
def test_alertmanager_label_names_are_prometheus_names_and_fixed_labels_win(state):
    a = hostile_alert(state=state)
    labels = am_labels(a)
    assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k) for k in labels), sorted(labels)
    assert labels["host"] == "<!here>" and labels["alertname"] == "<!channel>" and labels["team"] == "a\nb\x00c"
    doc = am_alert(a, now=T0, resend_interval=60)
    assert json.loads(json.dumps(doc))["labels"] == labels and len(doc["annotations"]["evidence"]) <= 4096
