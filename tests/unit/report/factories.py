"""Factories for report tests: alert events and telemetry files built from a few parameters,
incident events made by the incident stage, and the figures of a page."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from PIL import Image

from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents.events import IncidentEvent
from pipeline.schema import AlertEvent, encode
from tests.factories import T0
from tests.unit.incidents.factories import run, two_open_incidents


def alert(t: float, *, state: str = "firing", id: str = "a1", rule: str = "gpu_thermal_throttling",
          fault: str = "thermal_throttling", severity: str = "critical", host: str = "n0", gpu: int | None = 1,
          started: float | None = None, summary: str = "GPU hot", evidence: dict[str, Any] | None = None,
          **kw: Any) -> AlertEvent:
    """An alert event at T0 + t (onset ``started`` seconds after T0, default t)."""
    return AlertEvent(id=id, state=state, fault=fault, severity=severity, rule=rule, host=host, gpu=gpu,
                      ts=T0 + t, started_at=T0 + (t if started is None else started), summary=summary,
                      evidence=evidence if evidence is not None else {"gpu_temp": 90.0}, **kw)


def write_jsonl(path: Path, items: Iterable[Any]) -> Path:
    path.write_bytes(b"".join(encode(x) + b"\n" for x in items))
    return path


def hot_gpu(t: float, host: str, gpu: int) -> dict[str, float]:
    """n0 GPU 1 heats up and throttles from t = 60 s; every other GPU stays healthy."""
    if host == "n0" and gpu == 1 and t >= 60:
        return {"gpu_temp": 90, "sm_clock": 1005, "clocks_event_reasons": 0x40 | 0x20 | 0x8}
    return {}


def images(page: str) -> list[Image.Image]:
    """The page's embedded PNG figures, in page order."""
    return [Image.open(io.BytesIO(base64.b64decode(b)))
            for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def colour_pixels(img: Image.Image, hex_colour: str, tol: int = 10) -> int:
    rgb = np.asarray(img.convert("RGB")).astype(int)
    target = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - target).max(axis=2) <= tol).sum())


def incident_event_files(d: Path, host: str = "n1") -> tuple[Path, Path, Path, list[IncidentEvent]]:
    """An empty recording, the alerts of ``two_open_incidents`` (five XID 79 incidents on
    ``host`` GPU 0, the last one escalated; an SBE burst and a PCIe alert on n2) and the incident
    events the stage made of them: (telemetry, alerts, incident events, the events)."""
    alerts = two_open_incidents(host=host)
    events = run(alerts, stage=IncidentStage(default_config()))
    return (write_jsonl(d / "t.jsonl", []), write_jsonl(d / "a.jsonl", alerts),
            write_jsonl(d / "i.jsonl", events), events)
