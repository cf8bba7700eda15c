"""The check protocol the engine drives, and the built-in checks.

A *row check* turns a chunk of samples into one boolean per sample (is the condition true for
this GPU at this time?); a *tick check* judges every entity at a point of the event-time grid
(absence: a lost GPU, a silent host). Deciding when a true condition becomes an alert (``for:``,
``keep_firing_for:``) is the lifecycle's job, not the check's. YAML rules compile to row checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.config import EngineConfig
from pipeline.engine.entities import Entities
from pipeline.engine.state import GpuState, View
from pipeline.numeric import grow

GPU, HOST = "gpu", "host"


@dataclass(frozen=True)
class CheckMeta:
    name: str
    fault: str
    severity: str
    level: str = GPU
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)


class RowCheck(Protocol):
    meta: CheckMeta
    fields: tuple[str, ...]  # catalog aliases the check reads (only those are decoded)

    def evaluate(self, view: View) -> np.ndarray: ...

    def evidence(self, view: View, row: int) -> dict[str, Any]: ...

    def summary(self, host: str, gpu: int | None, evidence: dict[str, Any]) -> str: ...


class TickCheck(Protocol):
    meta: CheckMeta

    def evaluate_tick(self, t: float, state: GpuState, entities: Entities, config: EngineConfig) -> np.ndarray: ...

    def summary(self, host: str, gpu: int | None, evidence: dict[str, Any]) -> str: ...

    # Optional: ``changes(state, entities, config) -> np.ndarray``, the event times at which the
    # condition can flip while the state stays as it is (NaN: never). With it the engine jumps
    # over ticks where nothing can change (docs/architecture.md §4); a tick check without it is
    # walked tick by tick until ``gpu_absent_after``/``host_silent_after`` after the newest sample.


def _when(ts: Any) -> str:
    return "?" if ts is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(float(ts)))


def _num(x: float) -> float | None:
    return None if x != x else round(float(x), 3)


class HwThermalSlowdown:
    """HW thermal slowdown bit set while the GPU is under load: the clock is being cut for heat."""

    fields: tuple[str, ...] = ("gpu_temp", "sm_clock", "gpu_util", "clocks_event_reasons")
    # keep_firing_for: the bit flickers as the clock recovers and drops again; one alert, not ten.
    meta = CheckMeta(
        "builtin_hw_thermal_slowdown", "thermal_throttling", "critical", GPU, for_s=10.0, keep_firing_for_s=30.0
    )
    _mask = FIELDS.bits["HW_THERMAL"].mask

    def evaluate(self, view: View) -> np.ndarray:
        util = view.value("gpu_util")
        with np.errstate(invalid="ignore"):
            loaded = util >= 50
        return view.has_bits("clocks_event_reasons", self._mask) & loaded

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        return {a: _num(view.value(a)[row]) for a in ("gpu_temp", "sm_clock", "gpu_util", "clocks_event_reasons")}

    def summary(self, host: str, gpu: int | None, ev: dict[str, Any]) -> str:
        return (
            f"GPU {gpu} on {host} is thermally throttled (HW_THERMAL): SM clock {ev.get('sm_clock')} MHz "
            f"at {ev.get('gpu_temp')} °C under {ev.get('gpu_util')}% load"
        )


class NvlinkReplayIncrease:
    """Any NVLink replay increase is a failure in DCGM's own health watch; counter resets are not."""

    fields: tuple[str, ...] = ("nvlink_replay_errors",)
    meta = CheckMeta("builtin_nvlink_replay", "nvlink_replay_errors", "warning", GPU, keep_firing_for_s=60.0)

    def evaluate(self, view: View) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return view.inc("nvlink_replay_errors") > 0

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        return {
            "replay_increase": _num(view.inc("nvlink_replay_errors")[row]),
            "replay_total": _num(view.value("nvlink_replay_errors")[row]),
        }

    def summary(self, host: str, gpu: int | None, ev: dict[str, Any]) -> str:
        return f"NVLink replays on GPU {gpu} of {host}: +{ev.get('replay_increase')} (total {ev.get('replay_total')})"


def absent_after(base: float, state: GpuState, n_hosts: int) -> np.ndarray:
    """Silence that makes a finding, per host: ``base``, or two and a half sampling steps of a
    host sampled more slowly (at 30 s sampling a GPU that misses one sample is 60 s quiet, and
    a GPU reset does that without being lost)."""
    step = grow(state.host_step, n_hosts, np.nan)[:n_hosts]
    with np.errstate(invalid="ignore"):
        return np.fmax(base, 2.5 * step)


class GpuLost:
    """A GPU stops reporting while its host keeps reporting (fallen off the bus, XID 79)."""

    meta = CheckMeta("builtin_gpu_lost", "gpu_lost", "critical", GPU)

    def evaluate_tick(self, t: float, state: GpuState, entities: Entities, config: EngineConfig) -> np.ndarray:
        n = entities.n_gpus
        gpu_last = state.last_ts[:n]
        host_last = state.host_last_ts[entities.gpu_host]
        # A host back from a silence (a reboot, a paused recording) gives its GPUs the same time
        # to report again before one counts as lost: they come up one by one.
        host_back = state.host_back[entities.gpu_host]
        after = absent_after(config.gpu_absent_after, state, entities.n_hosts)[entities.gpu_host]
        with np.errstate(invalid="ignore"):
            return (t - gpu_last > after) & (t - host_last <= after) & ~(t - host_back <= after)

    def changes(self, state: GpuState, entities: Entities, config: EngineConfig) -> np.ndarray:
        """Where the condition can flip: each of its three terms' deadline."""
        gh = entities.gpu_host
        after = absent_after(config.gpu_absent_after, state, entities.n_hosts)[gh]
        return np.concatenate(
            [state.last_ts[: entities.n_gpus] + after, state.host_last_ts[gh] + after, state.host_back[gh] + after]
        )

    def summary(self, host: str, gpu: int | None, ev: dict[str, Any]) -> str:
        return f"GPU {gpu} on {host} stopped reporting at {_when(ev.get('last_seen'))} while its host still reports"


class TelemetryGap:
    """A host that reported goes silent: the exporter, the node or the network is down."""

    meta = CheckMeta("builtin_telemetry_gap", "telemetry_gap", "warning", HOST)

    def evaluate_tick(self, t: float, state: GpuState, entities: Entities, config: EngineConfig) -> np.ndarray:
        after = absent_after(config.host_silent_after, state, entities.n_hosts)
        with np.errstate(invalid="ignore"):
            return t - state.host_last_ts[: entities.n_hosts] > after

    def changes(self, state: GpuState, entities: Entities, config: EngineConfig) -> np.ndarray:
        """Where the condition can flip: each host's silence deadline."""
        return state.host_last_ts[: entities.n_hosts] + absent_after(config.host_silent_after, state, entities.n_hosts)

    def summary(self, host: str, gpu: int | None, ev: dict[str, Any]) -> str:
        return f"{host} has sent no telemetry since {_when(ev.get('last_seen'))}"


def builtin_checks() -> tuple[list[RowCheck], list[TickCheck]]:
    return [HwThermalSlowdown(), NvlinkReplayIncrease()], [GpuLost(), TelemetryGap()]
