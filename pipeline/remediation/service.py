"""``gpuwarden remediate``: consume ``<prefix>.alerts`` (or, with ``source: incidents``,
``<prefix>.incidents``) in its own group, decide, audit, commit.

Detection never waits for remediation: the detection service only produces alerts; this
service is a separate consumer of that topic. Offsets are committed after the batch's audit
records are stored (``AuditLog.flush`` raised nothing), so a crash repeats at most a batch —
and the once-per-alert-id claims turn those repeats into ``skipped: duplicate`` records instead
of second drains. One instance runs at a time (a lock next to the state file): the breaker and
the cooldowns are fleet-wide.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from pipeline.bus import Topics
from pipeline.errors import ConfigError, DeliveryError
from pipeline.remediation.actions import Context
from pipeline.remediation.audit import AuditLog
from pipeline.remediation.config import Config
from pipeline.remediation.guardrails import StateStore
from pipeline.remediation.incidents import ACTION_LABEL, INCIDENT_LABEL, POLICY_LABEL, SOURCES, incidents_topic
from pipeline.remediation.remediator import Remediator

log = logging.getLogger("gpuwarden.remediation.service")

INCIDENT_LABELS = frozenset({ACTION_LABEL, INCIDENT_LABEL, POLICY_LABEL})  # what only an incident event carries


@dataclass
class ServiceStats:
    messages: int = 0
    batches: int = 0
    commits: int = 0


class RemediationService:
    """Wires a consumer, the remediator and the audit log; ``run`` loops until ``stop`` is set."""

    def __init__(
        self,
        config: Config,
        *,
        bootstrap: str | None = None,
        prefix: str | None = None,
        group: str | None = None,
        source: str | None = None,
        consumer: Any = None,
        producer: Any = None,
        security: dict[str, Any] | None = None,
        ctx: Context | None = None,
        clock=time.time,
    ) -> None:
        k = config.raw.kafka
        self.bootstrap = bootstrap or k.bootstrap
        self.topics = Topics(prefix or k.prefix)
        self.group = group or k.group
        self.source = source or config.raw.source
        if self.source not in SOURCES:
            raise ConfigError("--source", f"{self.source!r}: one of {', '.join(SOURCES)}")
        self.topic = incidents_topic(self.topics.prefix) if self.source == "incidents" else self.topics.alerts
        self._own: list[Any] = []
        if producer is None:
            from pipeline.bus.kafka import KafkaBusProducer

            producer = KafkaBusProducer(self.bootstrap, security=security, client_id="gpuwarden-remediate")
            self._own.append(producer)
        if consumer is None:
            from pipeline.bus.kafka import KafkaBusConsumer

            consumer = KafkaBusConsumer(
                self.bootstrap,
                self.topic,
                self.group,
                security=security,
                client_id="gpuwarden-remediate",
                max_poll_records=500,
            )
            self._own.append(consumer)
        self.consumer, self.producer = consumer, producer
        self.store = StateStore(config.state_file)
        self.audit = AuditLog(
            producer=producer if config.raw.audit.kafka else None,
            topic=self.topics.audit,
            file=config.audit_file,
            clock=clock,
        )
        ctx = ctx or Context()
        if ctx.producer is None:
            ctx.producer = producer
        self.remediator = Remediator(config, self.store, self.audit, ctx=ctx, clock=clock)
        if self.source == "incidents" and not INCIDENT_LABELS & self.remediator.tree.matched_labels():
            # An alert-mode tree (the shipped routes.yaml) routes an incident by its root alert's
            # fault and severity: its recommended drain or reset would never run.
            log.warning(
                "source: incidents, but no route matches on %s: each incident is routed by its root "
                "alert's fault and severity, not by the action it recommends (docs/remediation.md#incident-mode)",
                ", ".join(sorted(INCIDENT_LABELS)),
            )
        self._handle = (
            self.remediator.handle_incident_message if self.source == "incidents" else self.remediator.handle_message
        )
        self.stats = ServiceStats()

    def step(self, poll_timeout: float = 1.0, max_records: int = 200) -> int:
        """One poll -> decisions -> audit stored -> offsets committed. Returns messages handled."""
        msgs = self.consumer.poll(timeout=poll_timeout, max_records=max_records)
        for m in msgs:
            self._handle(m)
        self.remediator.tick()
        if msgs or self.audit.records:
            self._flush_audit()
        if msgs:
            self.consumer.commit()
            self.stats.commits += 1
            self.stats.batches += 1
            self.stats.messages += len(msgs)
        return len(msgs)

    def _flush_audit(self, tries: int = 5) -> None:
        for i in range(tries):
            try:
                self.audit.flush()
                return
            except (DeliveryError, OSError) as e:
                if i == tries - 1:
                    raise
                log.warning("audit not stored (%s); retrying before committing anything", e)
                time.sleep(min(10.0, 0.5 * 2**i))

    def run(
        self, stop: threading.Event | None = None, *, idle_exit_s: float | None = None, poll_timeout: float = 1.0
    ) -> ServiceStats:
        """Loop until ``stop`` is set (SIGTERM) or, when given, ``idle_exit_s`` pass without a message."""
        stop = stop or threading.Event()
        self.store.lock()
        last = time.monotonic()
        try:
            while not stop.is_set():
                if self.step(poll_timeout):
                    last = time.monotonic()
                elif idle_exit_s is not None and time.monotonic() - last >= idle_exit_s:
                    break
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        self.remediator.close()
        for c in self._own:
            try:
                c.close()
            except Exception as e:  # noqa: BLE001 - closing is best effort
                log.warning("close: %s", e)
        self._own = []
        self.store.close()
