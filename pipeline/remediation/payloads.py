"""Webhook bodies shaped for the receivers teams already run: Slack incoming webhooks and
PagerDuty Events API v2 (docs/remediation.md#slack-and-pagerduty).

Alert values are telemetry anyone on the telemetry topic can write, so text placed in a Slack
message is escaped (``&``, ``<``, ``>``: Slack's control characters; unescaped, a summary could
hold ``<!channel>`` and page a whole workspace) and every text is cut to the receiver's limit.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from pipeline.remediation.safety import MissingValue, UnsafeValue
from pipeline.schema import AlertEvent, encode

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
PD_SEVERITIES = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}
SLACK_TEXT_LIMIT = 3000  # a section block's text
PD_SUMMARY_LIMIT = 1024  # PagerDuty truncates payload.summary there


# Years 1970..9999: RFC 3339 has four year digits, and strftime wrote 1e12 as year 33658, which
# Alertmanager cannot parse, failing the whole re-post of every firing alert with it.
MAX_TS = 253402300800.0  # 10000-01-01T00:00:00Z


def iso8601(ts: float) -> str:
    """``2025-11-29T08:00:00.000Z``: the timestamp form Alertmanager and PagerDuty read;
    ``UnsafeValue`` for a time outside years 1970..9999 (an alert's times are its producer's)."""
    if not 0.0 <= ts < MAX_TS:
        raise UnsafeValue(f"timestamp {ts!r} is outside the years 1970..9999")
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(round((ts % 1) * 1000)) % 1000:03d}Z"


def slack_escape(text: Any) -> str:
    """Text as Slack shows it literally (its mrkdwn treats ``<...>`` as links and mentions)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _where(alert: AlertEvent) -> str:
    where = alert.host or "the fleet"
    if alert.gpu is not None:
        where += f" GPU {alert.gpu}"
    return where


def slack_body(alert: AlertEvent) -> bytes:
    """An incoming-webhook message: ``text`` (the notification's fallback) and two blocks."""
    resolved = alert.state == "resolved"
    head = f"{'RESOLVED' if resolved else alert.severity.upper()}: {alert.fault} on {_where(alert)}"
    facts = [f"*rule* {alert.rule}", f"*alert* {alert.id}"]
    job = alert.job or alert.labels.get("job")
    if job:
        facts.append(f"*job* {job}")
    for k in ("namespace", "pod"):
        if k in alert.labels:
            facts.append(f"*{k}* {alert.labels[k]}")
    text = slack_escape(f"{head}: {alert.summary}" if alert.summary else head)[:SLACK_TEXT_LIMIT]
    body = {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": slack_escape(f)[:300]} for f in facts]},
        ],
    }
    return encode(body)


def pagerduty_body(routing_key_env: str) -> Callable[[AlertEvent], bytes]:
    """An Events API v2 event: ``trigger`` for firing, ``resolve`` for resolved, deduplicated on
    the alert id. The routing key is read from ``routing_key_env`` when an alert is sent (it is
    a secret: never in the config file, never audited)."""

    def body(alert: AlertEvent) -> bytes:
        key = os.environ.get(routing_key_env)
        if not key:
            raise MissingValue(f"environment variable {routing_key_env} (routing_key_env) is not set")
        if alert.state == "resolved":
            return encode({"routing_key": key, "event_action": "resolve", "dedup_key": alert.id})
        details: dict[str, Any] = {
            "alert_id": alert.id,
            "rule": alert.rule,
            "host": alert.host,
            "gpu": alert.gpu,
            "job": alert.job or alert.labels.get("job"),
            "evidence": alert.evidence,
            "labels": alert.labels,
            "started_at": iso8601(alert.started_at),
        }
        summary = f"{alert.fault} on {_where(alert)}" + (f": {alert.summary}" if alert.summary else "")
        return encode(
            {
                "routing_key": key,
                "event_action": "trigger",
                "dedup_key": alert.id,
                "payload": {
                    k: v
                    for k, v in {
                        "summary": summary[:PD_SUMMARY_LIMIT],
                        "source": alert.host or "gpuwarden",
                        "severity": PD_SEVERITIES.get(alert.severity, "warning"),
                        "timestamp": iso8601(alert.ts),
                        "component": f"gpu{alert.gpu}" if alert.gpu is not None else None,
                        "group": alert.family,
                        "class": alert.fault,
                        "custom_details": {k: v for k, v in details.items() if v not in (None, {}, "")},
                    }.items()
                    if v is not None
                },
                "client": "gpuwarden",
            }
        )

    return body
