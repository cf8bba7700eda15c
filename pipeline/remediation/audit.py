"""One audit record per decision, to ``<prefix>.audit`` and/or a JSONL file.

Decisions: ``acted``, ``dry_run``, ``skipped`` (``reason`` says why), ``blocked`` (the circuit
breaker), ``failed`` (``error``), ``queued`` (waiting for its group's ``group_wait``). Each names
the alert id and the exact argv or URL (a URL with its password and query values masked: put
secrets in ``headers_env``). ``flush`` returns only when every record is stored — the service
commits its input offsets after that, never before.

The text log line of a record shows alert values through ``printable``: a host name or alert id
carrying a newline would otherwise forge a second, plausible log line (the JSON records are
safe: JSON escapes control characters).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from pipeline.schema import SCHEMA_VERSION

log = logging.getLogger("gpuwarden.remediation.audit")

DECISIONS = ("acted", "dry_run", "skipped", "blocked", "failed", "queued")


class AuditRecord(msgspec.Struct, tag="audit", tag_field="kind", kw_only=True, omit_defaults=True):
    v: int = SCHEMA_VERSION
    ts: float
    decision: str
    alert_id: str | None = None
    alert_state: str | None = None
    fault: str | None = None
    severity: str | None = None
    host: str | None = None
    gpu: int | None = None
    route: str | None = None
    receiver: str | None = None
    action: str | None = None
    action_type: str | None = None
    argv: list[str] | None = None
    url: str | None = None
    reason: str | None = None
    error: str | None = None
    detail: str | None = None
    attempts: int | None = None
    forced: bool = False
    origin: str | None = None
    # source: incidents (docs/remediation.md#incident-mode): the incident decided on, its event's
    # state, its recommended action, and for an escalation the policy and the reason.
    incident: str | None = None
    incident_state: str | None = None
    incident_action: str | None = None
    policy: str | None = None
    escalation: str | None = None


_enc = msgspec.json.Encoder()


def printable(value: Any) -> str:
    """``value`` as text for a log line: control and other non-printable characters (newlines,
    escape sequences, Unicode line separators and bidi controls) written as ``\\n``, ``\\x1b``,
    ``\\u2028``, so one record is always one line and reads as what it is."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def reason_code(reason: str | None) -> str | None:
    """``unknown_host`` for ``"unknown_host: n9 is not ..."``: the counters' key."""
    if not reason:
        return None
    code, sep, _ = reason.partition(":")
    return code if sep and code.replace("_", "").replace(" ", "").isalnum() and len(code) <= 40 else None


class AuditLog:
    """Collects records and writes them to Kafka (``producer`` + ``topic``) and/or ``file``."""

    def __init__(
        self, *, producer: Any = None, topic: str | None = None, file: str | Path | None = None, clock=time.time
    ) -> None:
        self.producer, self.topic = producer, topic
        self.file = Path(file) if file else None
        self.clock = clock
        self.records: list[AuditRecord] = []  # since the last flush
        self.total: dict[str, int] = {d: 0 for d in DECISIONS}
        self.reasons: dict[str, int] = {}  # skipped/blocked records by reason code
        if self.file is not None:
            self.file.parent.mkdir(parents=True, exist_ok=True)

    def record(self, decision: str, **fields: Any) -> AuditRecord:
        assert decision in DECISIONS, decision
        rec = AuditRecord(ts=self.clock(), decision=decision, **fields)
        self.records.append(rec)
        self.total[decision] += 1
        code = reason_code(rec.reason)
        if code:
            self.reasons[code] = self.reasons.get(code, 0) + 1
        if self.producer is not None and self.topic:
            self.producer.send(self.topic, _enc.encode(rec), (rec.host or "").encode() or None)
        # An alert for a host outside the inventory, or with a value refused for a command, may be
        # a forged one: worth a warning, not just an info line.
        loud = decision in ("failed", "blocked") or code in ("unknown_host", "unsafe_value")
        why = rec.reason or rec.error
        log.log(
            logging.WARNING if loud else logging.INFO,
            "%s %s alert=%s host=%s %s%s",
            decision,
            printable(rec.action or "-"),
            printable(rec.alert_id),
            printable(rec.host),
            printable(rec.argv or rec.url or ""),
            f" ({printable(why)})" if why else "",
        )
        return rec

    def flush(self) -> int:
        """Store every record since the last flush; raises (DeliveryError, OSError) if any was not."""
        pending, n = self.records, len(self.records)
        if self.file is not None and pending:
            with open(self.file, "ab") as fh:
                for rec in pending:
                    fh.write(_enc.encode(rec) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
        if self.producer is not None and self.topic:
            self.producer.flush()
        self.records = []
        return n
