"""Factories for report tests: alert events and telemetry files built from a few parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from pipeline.schema import AlertEvent, encode
from tests.factories import T0


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
