"""Per-GPU-model limits (``data/gpu_models.csv``): power, clocks and temperature limits.

Telemetry wins: DCGM reports each GPU's own temperature limits (fields 151, 152, 158, 159) and
its enforced power limit (164), and rules read those. The table is what is known when a GPU does
not report a limit, what the simulator's GPU models are built from, and what the explain-away
context compares enforced power limits with (docs/models.md#gpu-models lists the sources).

>>> lookup("NVIDIA B200").tdp_w
1000.0
>>> lookup("NVIDIA H100 80GB HBM3").gpu_max_op_c
87.0
>>> lookup("some future GPU") is None
True
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class GpuModel:
    key: str
    match: tuple[str, ...]
    tdp_w: float
    max_sm_clock_mhz: float
    mem_clock_mhz: float
    gpu_max_op_c: float
    slowdown_c: float
    shutdown_c: float
    mem_max_op_c: float
    source: str


def _rows() -> list[GpuModel]:
    text = (resources.files("pipeline") / "data" / "gpu_models.csv").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    out = []
    for row in csv.DictReader(lines):
        nums = {
            k: float(row[k])
            for k in (
                "tdp_w",
                "max_sm_clock_mhz",
                "mem_clock_mhz",
                "gpu_max_op_c",
                "slowdown_c",
                "shutdown_c",
                "mem_max_op_c",
            )
        }
        out.append(
            GpuModel(
                key=row["key"],
                match=tuple(m.strip().upper() for m in row["match"].split("|")),
                source=row["source"],
                **nums,
            )
        )
    return out


MODELS: tuple[GpuModel, ...] = tuple(_rows())


@lru_cache(maxsize=256)
def lookup(name: str | None) -> GpuModel | None:
    """The table row for a DCGM model name (first row whose ``match`` is a substring), or None."""
    if not name:
        return None
    up = name.upper()
    for m in MODELS:
        if any(s in up for s in m.match):
            return m
    return None
