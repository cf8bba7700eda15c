"""Incidents against labelled injected faults: is every fault in an incident on its host, does
every incident match a fault, how many incidents a fault costs (docs/evaluation.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from pipeline.incidents.events import JOINED, OPENED, IncidentEvent
from pipeline.schema import fault_family
from pipeline.scoring import GRACE_S


@dataclass
class IncidentSpan:
    """One incident as its events tell it: where, and from its first to its last alert joining."""

    incident: str
    host: str | None
    gpu: int | None
    root_rule: str
    first: float
    last: float
    root_fault: str = ""


@dataclass
class IncidentMatch:
    """Faults (labels with ``fault`` set) and incidents, matched by host and time."""

    faults: list[dict[str, Any]]
    incidents: list[IncidentSpan]
    covered: list[bool] = field(default_factory=list)  # per fault: in an incident on its host
    stray: list[IncidentSpan] = field(default_factory=list)  # incidents that match no fault
    # per fault: an incident on its host rooted at an alert of its family opened in its window, so
    # that its page names it (not only a fault before it whose incident it joined)
    own: list[bool] = field(default_factory=list)

    @property
    def per_fault(self) -> float:
        return len(self.incidents) / len(self.faults) if self.faults else float("nan")

    @property
    def found(self) -> int:
        return sum(self.covered)

    @property
    def opened(self) -> int:
        return sum(self.own)


def spans(events: Iterable[IncidentEvent]) -> list[IncidentSpan]:
    """One span per incident, in the order they opened."""
    out: dict[str, IncidentSpan] = {}
    for e in events:
        s = out.get(e.incident)
        if s is None and e.state == OPENED:
            out[e.incident] = IncidentSpan(e.incident, e.host, e.gpu, e.root.rule, e.ts, e.ts, e.root.fault)
        elif s is not None and JOINED in e.changes:
            s.last = max(s.last, e.ts)
    return list(out.values())


def _window(lab: dict[str, Any]) -> tuple[float, float]:
    """A fault's window: its onset to its end plus the alerts' grace."""
    return float(lab["onset"]), float(lab.get("end") or lab["onset"]) + GRACE_S


def _overlaps(s: IncidentSpan, lab: dict[str, Any]) -> bool:
    lo, hi = _window(lab)
    return s.host == lab.get("host") and s.first <= hi and s.last >= lo


def _opens(s: IncidentSpan, lab: dict[str, Any]) -> bool:
    lo, hi = _window(lab)
    return (
        s.host == lab.get("host") and lo <= s.first <= hi and fault_family(s.root_fault) == fault_family(lab["fault"])
    )


def match_incidents(labels: Iterable[dict[str, Any]], events: Iterable[IncidentEvent]) -> IncidentMatch:
    """Pair faults and incidents: a fault is covered by an incident on its host whose alerts span
    overlaps the fault's window (onset to end plus the alerts' grace, ``pipeline.scoring``); an
    incident that covers no fault is stray. A fault has an incident of its own (``own``) when one
    on its host, rooted at an alert of the fault's family, opened in that window: covered alone, a
    second fault whose alerts joined the first's incident would pass unpaged."""
    faults = [lab for lab in labels if lab.get("fault")]
    incs = spans(events)
    m = IncidentMatch(faults, incs)
    m.covered = [any(_overlaps(s, lab) for s in incs) for lab in faults]
    m.stray = [s for s in incs if not any(_overlaps(s, lab) for lab in faults)]
    m.own = [any(_opens(s, lab) for s in incs) for lab in faults]
    return m
