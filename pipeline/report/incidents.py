"""Incident events (JSONL, as ``gpuwarden replay --incidents-out`` writes them) -> one
``IncidentSpan`` per incident: from opened to resolved, how its severity climbed, its member
alerts and its escalations (docs/report.md, "Incidents").

Unreadable lines are counted, never fatal, as the alert file's are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable


from pipeline.report.eventfiles import read_events
from pipeline.incidents.events import ESCALATED, OPENED, RESOLVED, IncidentEvent, IncidentRoot
from pipeline.report.alerts import SEVERITY_RANK, check_times


@dataclass
class Escalation:
    """An ``updated`` event whose action climbed: when, to what, and why (a policy's reason)."""

    ts: float
    action: str
    reason: str = ""
    policy: str | None = None


@dataclass
class IncidentSpan:
    """One incident from opened to resolved (``resolved_at`` None: open when the data ends)."""

    id: str
    opened_at: float
    host: str | None
    gpu: int | None
    root: IncidentRoot
    severity: str  # the latest event's: the highest of its alerts
    action: str
    members: list[str] = field(default_factory=list)
    more_members: int = 0
    resolved_at: float | None = None
    # (ts, severity) where the severity changed, the first at opened_at: the bar's colours.
    severities: list[tuple[float, str]] = field(default_factory=list)
    escalations: list[Escalation] = field(default_factory=list)
    job: str | None = None
    pod: str | None = None
    mig_instance: str | None = None
    last_ts: float = 0.0

    def end(self, data_end: float) -> float:
        """When the incident resolved (or the data ended), never before it opened."""
        return max(self.resolved_at if self.resolved_at is not None else data_end, self.opened_at)

    @property
    def n_members(self) -> int:
        return len(self.members) + self.more_members

    @property
    def rank(self) -> int:
        return SEVERITY_RANK.get(self.severity, 9)


@dataclass
class IncidentLog:
    incidents: list[IncidentSpan]  # by opened_at, then id
    lines: int = 0
    bad_lines: int = 0
    orphans: int = 0  # events of an incident whose ``opened`` event is not in the files
    read: int = 0  # events read
    problems: list[str] = field(default_factory=list)  # ``file:line: why`` of the first lines skipped


def group_incident_events(events: Iterable[IncidentEvent]) -> tuple[list[IncidentSpan], int]:
    """Fold each incident's events (in file order) into a span; returns (spans by opening, events
    of incidents never opened in the input).

    >>> root = IncidentRoot(alert="a1", rule="hbm_sbe_burst", fault="hbm_ecc_burst")
    >>> def ev(state, ts, severity, action, changes=(), members=("a1",)):
    ...     return IncidentEvent(incident="inc-1", state=state, ts=ts, opened_at=10.0, host="n1", gpu=0, root=root,
    ...                          severity=severity, action=action, changes=list(changes), members=list(members))
    >>> [s] = group_incident_events([ev("opened", 10.0, "warning", "watch"),
    ...     ev("updated", 40.0, "critical", "reset_gpu", ["alert_joined", "severity_rose", "action_escalated"],
    ...        ["a1", "a2"]), ev("resolved", 900.0, "critical", "reset_gpu", members=["a1", "a2"])])[0]
    >>> s.severities, [(e.ts, e.action) for e in s.escalations], s.members, s.resolved_at
    ([(10.0, 'warning'), (40.0, 'critical')], [(40.0, 'reset_gpu')], ['a1', 'a2'], 900.0)
    """
    spans: dict[str, IncidentSpan] = {}
    orphans = 0
    for e in events:
        s = spans.get(e.incident)
        if s is None:
            if e.state != OPENED:
                orphans += 1
                continue
            s = spans[e.incident] = IncidentSpan(
                id=e.incident,
                opened_at=e.opened_at,
                host=e.host,
                gpu=e.gpu,
                root=e.root,
                severity=e.severity,
                action=e.action,
                severities=[(e.opened_at, e.severity)],
            )
        elif s.resolved_at is not None:
            continue  # an incident's events end with its resolution; a repeat changes nothing
        if e.severity != s.severities[-1][1]:
            s.severities.append((e.ts, e.severity))
        if ESCALATED in e.changes:
            s.escalations.append(Escalation(e.ts, e.action, e.reason, e.policy))
        s.severity, s.action, s.members, s.more_members = e.severity, e.action, list(e.members), e.more_members
        s.job, s.pod, s.mig_instance = e.job, e.pod, e.mig_instance
        s.last_ts = max(s.last_ts, e.ts)
        if e.state == RESOLVED:
            s.resolved_at = e.ts
    return sorted(spans.values(), key=lambda s: (s.opened_at, s.id)), orphans


def load_incidents(paths: Iterable[str | Path]) -> IncidentLog:
    """Read incident-event JSONL files (optionally .gz); a line may hold one event or an array."""
    problems: list[str] = []
    events, lines, bad = read_events(
        paths, IncidentEvent, check=lambda e: check_times(e.ts, e.opened_at), problems=problems
    )
    spans, orphans = group_incident_events(events)
    return IncidentLog(spans, lines, bad, orphans, len(events), problems)


def most_severe(spans: list[IncidentSpan], limit: int) -> list[IncidentSpan]:
    """The ``limit`` incidents a reader should see first (most severe, then earliest), in the
    order they opened."""
    ranked = sorted(spans, key=lambda s: (s.rank, s.opened_at, s.id))[: max(0, limit)]
    return sorted(ranked, key=lambda s: (s.opened_at, s.id))
