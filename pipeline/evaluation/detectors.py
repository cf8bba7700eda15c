"""The detectors evaluation compares: this project's packs and two baselines written as our rules.

(a) ``community``: dcgm-exporter's default field list at a 30 s scrape with the usual community
alerts (`rules/baselines/prometheus_community.yaml`); (b) ``dcgm-health``: DCGM's own health-watch
thresholds on every sample (`rules/baselines/dcgm_health.yaml`). Neither has absence detection.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from pipeline.engine import Engine
from pipeline.rules import load_rules

ROOT = Path(__file__).resolve().parents[2]


def default_exporter_fields() -> set[str]:
    """The fields dcgm-exporter sends with its shipped default-counters.csv."""
    with (resources.files("pipeline") / "data" / "dcgm_exporter_default-counters.csv").open() as fh:
        return {row[0].strip() for row in csv.reader(fh) if row and not row[0].startswith("#") and row[0].strip()}


@dataclass
class Detector:
    name: str
    rules: list[Path]
    absence_checks: bool = True
    scrape_s: float | None = None           # downsample to this scrape interval
    fields: set[str] | None = None          # keep only these DCGM fields

    def engine(self) -> Engine:
        rs, diags = load_rules(self.rules)
        if rs is None:
            raise ValueError("; ".join(str(d) for d in diags if d.is_error))
        if self.absence_checks:
            return Engine(rules=rs)
        return Engine(row_checks=[], tick_checks=[], rules=rs)

    def transform(self, batches: Iterable[list[dict[str, Any]]]) -> Iterable[list[dict[str, Any]]]:
        """What this detector would have seen of the fleet's telemetry (one batch per second)."""
        start = None
        for batch in batches:
            if not batch:
                continue
            if self.scrape_s is not None:
                start = batch[0]["ts"] if start is None else start
                if round(batch[0]["ts"] - start) % round(self.scrape_s) != 0:
                    continue
            if self.fields is None:
                yield batch
                continue
            yield [{**r, "fields": {k: v for k, v in r["fields"].items() if k in self.fields}}
                   if r.get("kind") == "dcgm" else r for r in batch]


def detectors() -> list[Detector]:
    return [
        Detector("gpuwarden", [ROOT / "rules"]),
        Detector("community", [ROOT / "rules" / "baselines" / "prometheus_community.yaml"], absence_checks=False,
                 scrape_s=30.0, fields=default_exporter_fields()),
        Detector("dcgm-health", [ROOT / "rules" / "baselines" / "dcgm_health.yaml"], absence_checks=False),
    ]
