"""The detectors a ``models.yaml`` can name, and what the engine needs to know about each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pipeline.models.detectors.counters import CounterRateSurprise
from pipeline.models.detectors.hst import CohortHalfSpaceTrees
from pipeline.models.detectors.nccl import CommBusbw, RankStraggler
from pipeline.models.detectors.thermal import ThermalResidual

DCGM, NCCL = "dcgm", "nccl"


@dataclass(frozen=True)
class DetectorInfo:
    factory: Callable[..., Any]
    source: str  # dcgm: fed DCGM rows each tick; nccl: fed NCCL records
    level: str = "gpu"  # entity its alerts are about
    feature_param: str | None = None  # the parameter ``features:`` sets, if the features are configurable
    example: dict[str, Any] = field(default_factory=dict)  # parameters the conformance suite uses


REGISTRY: dict[str, DetectorInfo] = {
    "thermal_residual": DetectorInfo(ThermalResidual, DCGM, example={"warmup": 50}),
    "counter_rate": DetectorInfo(
        CounterRateSurprise, DCGM, feature_param="counters", example={"counters": ["ecc_sbe_volatile"], "warmup": 50}
    ),
    "cohort_hst": DetectorInfo(CohortHalfSpaceTrees, DCGM, example={"warmup": 50, "period": 1}),
    "nccl_straggler": DetectorInfo(RankStraggler, NCCL),
    "nccl_busbw": DetectorInfo(CommBusbw, NCCL, level="host"),
}


def build(detector: str, params: dict[str, Any]) -> Any:
    """A fresh detector by registry name (names and parameters are validated by ``config``)."""
    return REGISTRY[detector].factory(**params)
