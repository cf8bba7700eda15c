"""Per fault family: precision, recall, F1, detection latency, localisation, false alerts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from pipeline.schema import AlertEvent, fault_family
from pipeline.scoring import match_faults


@dataclass
class FamilyScore:
    family: str
    injected: int = 0
    detected: int = 0
    right_gpu: int = 0
    alerts: int = 0                 # firing alerts of this family
    false_alerts: int = 0           # of which matched no injected fault
    latencies: list[float] = field(default_factory=list)

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
    def localisation(self) -> float:
        return self.right_gpu / self.detected if self.detected else float("nan")


@dataclass
class Score:
    detector: str
    gpu_hours: float = 0.0
    families: dict[str, FamilyScore] = field(default_factory=dict)

    def family(self, name: str) -> FamilyScore:
        return self.families.setdefault(name, FamilyScore(name))

    @property
    def false_per_1000_gpu_h(self) -> float:
        n = sum(f.false_alerts for f in self.families.values())
        return 1000.0 * n / self.gpu_hours if self.gpu_hours else float("nan")


def score_run(score: Score, labels: Iterable[dict[str, Any]], alerts: list[AlertEvent], gpu_hours: float) -> None:
    """Add one run (one scenario, one seed) to ``score``."""
    labels = [lab for lab in labels if lab.get("fault")]
    matches, unmatched = match_faults(labels, alerts)
    score.gpu_hours += gpu_hours
    for m in matches:
        fam = score.family(fault_family(m.label["fault"]))
        fam.injected += 1
        if m.detected:
            fam.detected += 1
            fam.latencies.append(max(0.0, m.latency or 0.0))
            fam.right_gpu += bool(m.right_gpu)
    for a in alerts:
        if a.state == "firing":
            score.family(a.family).alerts += 1
    for a in unmatched:
        score.family(a.family).false_alerts += 1
