"""Match alerts to labelled injected faults: detected or not, how fast, on the right GPU?

The demo's summary table uses this; the evaluation (precision, recall, latency per family)
builds on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from pipeline.schema import AlertEvent, fault_family

GRACE_S = 120.0  # an alert this long after a fault ended still counts as finding it


@dataclass
class Match:
    label: dict[str, Any]
    alert: AlertEvent | None

    @property
    def detected(self) -> bool:
        return self.alert is not None

    @property
    def latency(self) -> float | None:
        return None if self.alert is None else self.alert.ts - float(self.label["onset"])

    @property
    def right_gpu(self) -> bool | None:
        if self.alert is None:
            return None
        if self.label.get("gpu") is None or self.alert.gpu is None:
            return self.alert.host == self.label.get("host")
        return self.alert.host == self.label.get("host") and self.alert.gpu == self.label["gpu"]


def match_faults(
    labels: Iterable[dict[str, Any]], alerts: Iterable[AlertEvent]
) -> tuple[list[Match], list[AlertEvent]]:
    """Pair each injected fault with the first firing alert of its family on its host within its window.

    Returns the matches (in label order) and the firing alerts that matched no fault.
    """
    firing = sorted((a for a in alerts if a.state == "firing"), key=lambda a: a.ts)
    used: set[str] = set()
    matches: list[Match] = []
    for lab in labels:
        if not lab.get("fault"):
            continue
        fam = fault_family(lab["fault"])
        lo, hi = float(lab["onset"]), float(lab.get("end") or lab["onset"]) + GRACE_S
        best = None
        for a in firing:
            if a.family == fam and a.host == lab.get("host") and lo <= a.ts <= hi:
                best = a
                break
        if best is not None:
            # Every alert of that family on that host in the window belongs to this fault.
            for a in firing:
                if a.family == fam and a.host == lab.get("host") and lo <= a.ts <= hi:
                    used.add(a.id)
        matches.append(Match(lab, best))
    unmatched = [a for a in firing if a.id not in used]
    return matches, unmatched


def knock_on(alert: AlertEvent, labels: Iterable[dict[str, Any]]) -> bool:
    """Whether an alert of another family sits on an injected fault's culprit while it lasts: a
    throttled GPU is also a straggler, a broken link also drags its host's NCCL busbw down."""
    for lab in labels:
        if not lab.get("fault") or lab.get("host") != alert.host:
            continue
        if lab.get("gpu") is not None and alert.gpu is not None and lab["gpu"] != alert.gpu:
            continue
        if float(lab["onset"]) <= alert.ts <= float(lab.get("end") or lab["onset"]) + GRACE_S:
            return True
    return False
