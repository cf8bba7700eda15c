"""Per fault family: precision, recall, F1, detection latency, localisation, false alerts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
from scipy.stats import chi2

from pipeline.incidents.events import IncidentEvent
from pipeline.incidents.scoring import match_incidents
from pipeline.schema import AlertEvent, fault_family
from pipeline.scoring import knock_on, match_faults


@dataclass
class FamilyScore:
    family: str
    injected: int = 0
    detected: int = 0
    right_gpu: int = 0
    alerts: int = 0  # firing alerts of this family
    false_alerts: int = 0  # of which matched no injected fault and sat on no faulty GPU/host
    latencies: list[float] = field(default_factory=list)
    knock_on: int = 0  # of which matched no fault of their family but sat on another fault's culprit
    # fault key (run/fault/host/gpu/onset) -> latency, so two detectors compare on the same faults
    detections: dict[str, float] = field(default_factory=dict)

    @property
    def recall(self) -> float:
        return self.detected / self.injected if self.injected else float("nan")

    @property
    def precision(self) -> float:
        return (self.alerts - self.false_alerts) / self.alerts if self.alerts else float("nan")

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p == p and r == r and p + r > 0 else float("nan")

    def latency(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")

    @property
    def mean_latency(self) -> float:
        return float(np.mean(self.latencies)) if self.latencies else float("nan")

    @property
    def localisation(self) -> float:
        return self.right_gpu / self.detected if self.detected else float("nan")


@dataclass
class Score:
    detector: str
    gpu_hours: float = 0.0
    families: dict[str, FamilyScore] = field(default_factory=dict)
    refires: int = 0  # an alert firing again (new id) before it resolved: see refires()
    # The incident stage on the same alerts (score_incidents): what a fault costs in incidents.
    incident_faults: int = 0  # faults scored for incidents
    incidents: int = 0
    faults_in_incident: int = 0  # faults in an incident on their host
    faults_with_own_incident: int = 0  # faults whose family opened an incident on their host
    stray_incidents: int = 0  # incidents that match no fault

    def family(self, name: str) -> FamilyScore:
        return self.families.setdefault(name, FamilyScore(name))

    @property
    def firing_alerts(self) -> int:
        return sum(f.alerts for f in self.families.values())

    @property
    def false_alerts(self) -> int:
        return sum(f.false_alerts for f in self.families.values())

    @property
    def knock_on_alerts(self) -> int:
        return sum(f.knock_on for f in self.families.values())

    @property
    def false_per_1000_gpu_h(self) -> float:
        return 1000.0 * self.false_alerts / self.gpu_hours if self.gpu_hours else float("nan")

    def false_per_1000_gpu_h_upper(self, confidence: float = 0.95) -> float:
        """One-sided upper confidence bound of the false-alert rate (exact Poisson): what the run
        can rule out. With no false alert in G GPU-hours it is -ln(0.05)/G, about 3/G."""
        if not self.gpu_hours:
            return float("nan")
        return 1000.0 * float(chi2.ppf(confidence, 2 * (self.false_alerts + 1))) / 2.0 / self.gpu_hours


def fault_key(run: str, label: dict[str, Any]) -> str:
    return f"{run}/{label['fault']}/{label.get('host')}/{label.get('gpu')}/{float(label['onset']):.3f}"


def refires(alerts: Iterable[AlertEvent]) -> int:
    """How often a rule fired again on the same host/GPU while its previous alert there had not
    resolved: the lifecycle re-raising one condition under new ids (each a fresh page)."""
    open_: dict[tuple, str] = {}
    n = 0
    for a in sorted(alerts, key=lambda a: a.ts):
        key = (a.rule, a.host, a.gpu)
        if a.state == "firing":
            if key in open_ and open_[key] != a.id:
                n += 1
            open_[key] = a.id
        elif a.state == "resolved" and open_.get(key) == a.id:
            del open_[key]
    return n


def score_run(
    score: Score, labels: Iterable[dict[str, Any]], alerts: list[AlertEvent], gpu_hours: float, run: str = ""
) -> None:
    """Add one run (one scenario, one seed, named ``run``) to ``score``.

    A firing alert that matches no fault of its own family is a *knock-on* alert when it sits on
    another injected fault's culprit while that fault lasts (a throttled GPU is also an NCCL
    straggler): true, and no extra cost, since that GPU is being dealt with anyway. The rest are
    false alerts.
    """
    labels = [lab for lab in labels if lab.get("fault")]
    matches, unmatched = match_faults(labels, alerts)
    score.gpu_hours += gpu_hours
    score.refires += refires(alerts)
    for m in matches:
        fam = score.family(fault_family(m.label["fault"]))
        fam.injected += 1
        if m.detected:
            lat = max(0.0, m.latency or 0.0)
            fam.detected += 1
            fam.latencies.append(lat)
            fam.detections[fault_key(run, m.label)] = lat
            fam.right_gpu += bool(m.right_gpu)
    for a in alerts:
        if a.state == "firing":
            score.family(a.family).alerts += 1
    for a in unmatched:
        if knock_on(a, labels):
            score.family(a.family).knock_on += 1
        else:
            score.family(a.family).false_alerts += 1


def score_incidents(score: Score, labels: Iterable[dict[str, Any]], events: Iterable[IncidentEvent]) -> None:
    """Add one run's incidents (the stage's events on the alerts ``score_run`` scored) to ``score``:
    faults in an incident on their host, incidents in all, incidents that match no fault."""
    m = match_incidents(labels, events)
    score.incident_faults += len(m.faults)
    score.incidents += len(m.incidents)
    score.faults_in_incident += m.found
    score.faults_with_own_incident += m.opened
    score.stray_incidents += len(m.stray)


@dataclass
class Comparison:
    """Whether ``ours`` beats ``other``: per family, recall no lower and, on the faults both found,
    latency p50 and p95 no higher; false alerts per 1,000 GPU-hours no higher; and better on
    recall or latency somewhere. ``reasons`` says where it is not."""

    ours: str
    other: str
    reasons: list[str] = field(default_factory=list)
    better: list[str] = field(default_factory=list)

    @property
    def beats(self) -> bool:
        return not self.reasons and bool(self.better)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def compare(ours: Score, other: Score) -> Comparison:
    """Compare two detectors scored on the same runs (see ``Comparison``)."""
    c = Comparison(ours.detector, other.detector)
    fams = sorted({f for s in (ours, other) for f, fs in s.families.items() if fs.injected})
    for fam in fams:
        a, b = ours.family(fam), other.family(fam)
        if a.injected != b.injected:
            raise ValueError(f"{fam}: {ours.detector} and {other.detector} were not scored on the same runs")
        if a.recall < b.recall:
            c.reasons.append(f"{fam}: recall {a.recall:.0%} < {b.recall:.0%}")
        elif a.recall > b.recall:
            c.better.append(f"{fam}: recall {a.recall:.0%} > {b.recall:.0%}")
        both = sorted(set(a.detections) & set(b.detections))
        if not both:
            continue
        la, lb = [a.detections[k] for k in both], [b.detections[k] for k in both]
        for q in (50, 95):
            qa, qb = _pct(la, q), _pct(lb, q)
            if qa > qb:
                c.reasons.append(f"{fam}: latency p{q} {qa:.0f}s > {qb:.0f}s on the {len(both)} fault(s) both found")
            elif qa < qb:
                c.better.append(f"{fam}: latency p{q} {qa:.0f}s < {qb:.0f}s")
    fa, fb = ours.false_per_1000_gpu_h, other.false_per_1000_gpu_h
    if not (math.isnan(fa) or math.isnan(fb)) and fa > fb:
        c.reasons.append(f"false alerts {fa:.2f} > {fb:.2f} per 1,000 GPU-hours")
    return c
