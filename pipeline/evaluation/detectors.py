"""The detectors evaluation compares: this project's packs and two baselines written as our rules.

``gpuwarden``: what ``gpuwarden replay``/``serve`` run by default -- ``rules/*.yaml``, the
engine's absence checks and the online models of ``rules/models.yaml`` (``build_detector``: the two stages of pipeline/topology.py).
(a) ``community``: dcgm-exporter's default field list at a 30 s scrape with the usual community
alerts (`rules/baselines/prometheus_community.yaml`); (b) ``dcgm-health``: DCGM's own health-watch
thresholds on every sample (`rules/baselines/dcgm_health.yaml`) and, beside them, NVSentinel's NIC
port thresholds (`rules/baselines/fabric/ports.yaml`). Neither has absence detection.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from pipeline.detection import build_detector
from pipeline.engine import Engine
from pipeline import protocols
from pipeline.resources import rules_dir
from pipeline.rules import load_rules
from pipeline.rules.portconfig import load_port_config
from pipeline.rules.ports import PortStage

PACKS = rules_dir()  # the shipped packs and baselines, installed or in a checkout


def default_exporter_fields() -> set[str]:
    """The fields dcgm-exporter sends with its shipped default-counters.csv (either spelling)."""
    from pipeline.catalog import FIELDS

    with (resources.files("pipeline") / "data" / "dcgm_exporter_default-counters.csv").open() as fh:
        names = {row[0].strip() for row in csv.reader(fh) if row and not row[0].startswith("#") and row[0].strip()}
    # The same fields under their DCGM 4.6 names, as a 4.6 exporter's default list names them.
    return names | {n for x in names if (f := FIELDS.by_name(x)) is not None for n in f.names}


@dataclass
class Detector:
    name: str
    rules: list[Path]
    absence_checks: bool = True
    scrape_s: float | None = None  # downsample to this scrape interval
    fields: set[str] | None = None  # keep only these DCGM fields
    models: str | None = None  # models.yaml, "auto" (beside the rules) or None: rules only
    ports: Path | None = None  # NIC port checks (a ports.yaml) for a detector without models

    def engine(self) -> protocols.Detector:
        """A fresh engine for one run (models start cold, so every run is deterministic per seed)."""
        if self.models is not None:
            engine, diags = build_detector([str(r) for r in self.rules], self.models)
            if engine is None:
                raise ValueError("; ".join(str(d) for d in diags if d.is_error))
            return engine
        paths: list[str | Path] = [*self.rules]
        rs, diags = load_rules(paths)
        if rs is None:
            raise ValueError("; ".join(str(d) for d in diags if d.is_error))
        stages: list[PortStage] = []
        if self.ports is not None:
            pconfig, pdiags = load_port_config(self.ports)
            if pconfig is None:
                raise ValueError("; ".join(str(d) for d in pdiags if d.is_error))
            stages.append(PortStage(pconfig))
        if self.absence_checks:
            return Engine(rules=rs, stages=stages)
        return Engine(row_checks=[], tick_checks=[], rules=rs, stages=stages)

    def view(self, batch: list[dict[str, Any]], step: int, interval: float = 1.0) -> list[dict[str, Any]] | None:
        """What this detector sees of the ``step``-th batch (one sampling interval of the fleet's
        telemetry, ``interval`` seconds): None between scrapes, else the batch with only its fields."""
        if not batch:
            return None
        if self.scrape_s is not None and step % max(1, round(self.scrape_s / interval)) != 0:
            return None
        if self.fields is None:
            return batch
        return [
            {**r, "fields": {k: v for k, v in r["fields"].items() if k in self.fields}}
            if r.get("kind") == "dcgm"
            else r
            for r in batch
        ]

    def transform(
        self, batches: Iterable[list[dict[str, Any]]], interval: float = 1.0
    ) -> Iterable[list[dict[str, Any]]]:
        """What this detector would have seen of the fleet's telemetry (one batch per interval)."""
        for step, batch in enumerate(batches):
            seen = self.view(batch, step, interval)
            if seen is not None:
                yield seen


def detectors() -> list[Detector]:
    return [
        Detector("gpuwarden", [PACKS], models="auto"),
        Detector(
            "community",
            [PACKS / "baselines" / "prometheus_community.yaml"],
            absence_checks=False,
            scrape_s=30.0,
            fields=default_exporter_fields(),
        ),
        Detector(
            "dcgm-health",
            [PACKS / "baselines" / "dcgm_health.yaml"],
            absence_checks=False,
            ports=PACKS / "baselines" / "fabric" / "ports.yaml",
        ),
    ]
