"""Alert events (JSONL, as ``gpuwarden replay --alerts-out`` writes them) -> one ``Incident`` per id.

An alert is a ``firing`` event followed, maybe, by a ``resolved`` one under the same ``id``; the
report shows the firing event's evidence (what the detector saw when it decided) and the
resolution time. Unreadable lines are counted, never fatal: a report of a half-broken incident
is still a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator


from pipeline.recordchecks import TS_MAX, TS_MIN
from pipeline.report.eventfiles import Counts, iter_events
from pipeline.schema import AlertEvent

SEVERITY_RANK = {"critical": 0, "error": 1, "warning": 2, "info": 3}


@dataclass
class Incident:
    """One alert from onset to resolution (``resolved_at`` None: still firing when the data ends)."""

    id: str
    event: AlertEvent  # the (first) firing event: its evidence is what fired the alert
    resolved_at: float | None = None
    number: int = 0  # position in the report (1-based), 0: not given a section

    @property
    def started_at(self) -> float:
        return self.event.started_at

    @property
    def fired_at(self) -> float:
        return self.event.ts

    @property
    def severity(self) -> str:
        return self.event.severity

    @property
    def is_model(self) -> bool:
        return self.event.labels.get("source") == "model"

    def end(self, data_end: float) -> float:
        """When the alert stopped (or the data did), never before it fired."""
        end = self.resolved_at if self.resolved_at is not None else data_end
        return max(end, self.fired_at)


@dataclass
class AlertLog:
    incidents: list[Incident]
    lines: int = 0
    bad_lines: int = 0
    orphan_resolutions: int = 0  # resolved events whose firing event is not in the file
    read: int = 0  # events read (firing and resolved)
    conflicts: int = 0  # ids whose firing events name different alerts (rule, fault, host, GPU)
    problems: list[str] = field(default_factory=list)  # ``file:line: why`` of the first lines skipped


def check_times(ts: float, since: float) -> str | None:
    """Why an event with these times cannot be drawn (None: it can): a time outside the
    recordings' range (TS_MIN..TS_MAX) is a broken writer, not an alert of year 2200."""
    for what, t in (("ts", ts), ("start", since)):
        if not TS_MIN <= t <= TS_MAX:
            return f"{what} {t!r} outside {TS_MIN:.0f}..{TS_MAX:.0f}"
    return None


def _identity(ev: AlertEvent) -> tuple[object, ...]:
    return (ev.rule, ev.fault, ev.host, ev.gpu, ev.link)


def group_events(events: Iterable[AlertEvent], conflicts: list[str] | None = None) -> tuple[list[Incident], int]:
    """Pair firing and resolved events by id; returns (incidents by onset, resolutions without a
    firing). ``conflicts``: given each id whose firing events name different alerts (rule, fault,
    host or GPU), of which only the earliest is shown."""
    by_id: dict[str, Incident] = {}
    resolved: dict[str, float] = {}
    clash: dict[str, None] = {}
    for ev in events:
        if ev.state == "firing":
            cur = by_id.get(ev.id)
            if cur is not None and _identity(cur.event) != _identity(ev):
                clash[ev.id] = None
            if cur is None or ev.ts < cur.event.ts:
                by_id[ev.id] = Incident(ev.id, ev)
        elif ev.state == "resolved":
            resolved[ev.id] = max(ev.ts, resolved.get(ev.id, ev.ts))
    orphans = 0
    for aid, ts in resolved.items():
        inc = by_id.get(aid)
        if inc is None:
            orphans += 1
        else:
            inc.resolved_at = ts
    incidents = sorted(by_id.values(), key=lambda i: (i.started_at, i.fired_at, i.id))
    if conflicts is not None:
        conflicts.extend(clash)
    return incidents, orphans


def load_alerts(paths: Iterable[str | Path]) -> AlertLog:
    """Read alert JSONL files (optionally .gz); a line may hold one event or an array of them."""
    problems: list[str] = []
    counts = Counts()
    read = 0

    def counted(events: Iterator[AlertEvent]) -> Iterator[AlertEvent]:
        nonlocal read
        for ev in events:
            read += 1
            yield ev

    events = iter_events(paths, AlertEvent, counts, check=lambda e: check_times(e.ts, e.started_at), problems=problems)
    clash: list[str] = []
    incidents, orphans = group_events(counted(events), clash)
    return AlertLog(incidents, counts.lines, counts.bad, orphans, read, len(clash), problems)


def most_important(incidents: list[Incident], limit: int) -> list[Incident]:
    """The ``limit`` incidents a reader should see first: most severe, then earliest."""
    ranked = sorted(incidents, key=lambda i: (SEVERITY_RANK.get(i.severity, 9), i.started_at, i.fired_at, i.id))
    return ranked[: max(0, limit)]
