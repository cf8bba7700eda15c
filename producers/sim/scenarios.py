"""Scenarios: which faults and conditions happen when, plus fleet options.

A scenario is a ``Scenario`` dataclass, either built in (``SCENARIOS``) or read from a YAML file
(``yaml.safe_load`` only)::

    name: my-incident                 # optional
    description: NVLink going bad on host 2
    checkpoint_every: 600             # seconds between job checkpoints; 0 or null: none
    checkpoint_duration: [30, 90]     # seconds, drawn per checkpoint
    faults:
      - {type: nvlink_degradation, host: 2, gpu: 5, onset: 120, duration: 300, params: {rate_max: 500}}
      - {type: thermal_throttling, onset: "20%", duration: "50%"}   # host/gpu drawn, times relative
      - {type: power_cap, host: gpu-node-001, onset: 60, duration: 200, params: {limit_w: 450}}
    power_cap: {hosts: [0, 1], limit_w: 450, onset: "20%", duration: "50%"}   # or count / fraction
    afternoon_heat: {delta_c: 5, onset: "10%", duration: "80%"}
    ambient: {base_c: 24, diurnal_amplitude_c: 3, peak_hour: 15, utc_offset_h: 0}
    llama3: {acceleration: 12000}     # draw faults at the Llama 3 405B rate (llama3.py)
    random: {sbe_per_gpu_day: 1.7, driver_reloads_per_host_day: 0.05, aer_corrected_per_gpu_day: 4}
    data_quality: {blank_rate: 2.0e-5, missing_rate: 2.0e-5}
    nccl: {dp_coll: ReduceScatter, tp_bytes: 1073741824, dp_bytes: 67108864}
    gpu_models:                       # host blocks in this order; default: the Simulator's gpu_model
      - {model: NVIDIA H100 80GB HBM3, share: 0.5}                # pre-4.6 DCGM field names
      - {model: NVIDIA B200, share: 0.5, field_names: "4.6"}     # DCGM 4.6 names
    delivery:                         # when records are stamped and arrive (not physics)
      phase: true                     # each host samples at its own offset within the interval
      jitter_s: 0.3                   # sd of each sample's timestamp jitter (clipped to 3 sd)
      skew_s: {2: 2.5}                # host 2's clock runs 2.5 s ahead
      late_s: {3: [20, 40]}           # host 3's records arrive 20-40 s after they were stamped
      join_s: {5: 3600}               # host 5 sends nothing before 3600 s (or "33%" of the run)
    sources: [pcie_aer, nvswitch, nic]  # producers beside dcgm-exporter: their fields or records
                                      # (progress: the ranks' collective progress records)

Times (``onset``, ``duration``) are seconds from the run start or a percentage string of the run's
duration, so a built-in scenario fits any run length. ``duration`` omitted: until the run ends.
``host`` is an index or a host name; omitted, faults are spread over distinct hosts (faults that
share a ``host_group`` share a host when the fleet has fewer hosts than faults). ``gpu`` omitted:
a GPU not used by another fault on that host. Every error is a ``ValueError`` naming the key.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, overload

import yaml

from pipeline.errors import UsageError

from .faults import FAULT_TYPES, NVLINK_TYPES, SCHEDULABLE_CONDITIONS, TYPES
from .faults import NVLINKS_PER_GPU
from .fields import SOURCES
from .nccl import COLLS, NCCL_DEFAULTS
from .fleet import AMBIENT_DEFAULTS

Time = float | str  # seconds, or "25%" of the run


@dataclass(frozen=True)
class FaultSpec:
    """One scheduled fault or condition, before it is placed on the fleet."""

    type: str
    host: int | str | None = None
    gpu: int | None = None
    link: int | None = None
    onset: Time = 0.0
    duration: Time | None = None
    params: dict[str, Any] = field(default_factory=dict)
    host_group: str | None = None


@dataclass
class Scenario:
    """Everything that makes one simulated run differ from a plain healthy one."""

    name: str = "custom"
    description: str = ""
    faults: list[FaultSpec] = field(default_factory=list)
    checkpoint_every: float | None = 900.0
    checkpoint_duration: tuple[float, float] = (30.0, 90.0)
    power_cap: dict[str, Any] | None = None
    afternoon_heat: dict[str, Any] | None = None
    ambient: dict[str, float] = field(default_factory=dict)
    llama3: dict[str, Any] | None = None
    random: dict[str, float] = field(default_factory=dict)
    data_quality: dict[str, float] = field(default_factory=dict)
    nccl: dict[str, Any] = field(default_factory=dict)
    gpu_models: list[dict[str, Any]] = field(default_factory=list)
    delivery: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


DELIVERY_KEYS = {"phase", "jitter_s", "skew_s", "late_s", "join_s"}
GPU_MODEL_KEYS = {"model", "share", "field_names"}
RANDOM_DEFAULTS = {
    "sbe_per_gpu_day": 1.7,  # isolated corrected SBEs (benign background)
    "driver_reloads_per_host_day": 0.05,  # benign reloads, so only long runs see one
    "aer_corrected_per_gpu_day": 4.0,  # lone corrected PCIe errors (benign; sent with pcie_aer)
}
DATA_QUALITY_DEFAULTS = {
    "blank_rate": 2.0e-5,  # per DCGM record: one field replaced by DCGM's blank sentinel
    "missing_rate": 2.0e-5,  # per DCGM record: one field left out
}
LLAMA3_DEFAULTS = {"acceleration": 12000.0}
POWER_CAP_KEYS = {"hosts", "count", "fraction", "limit_w", "onset", "duration"}
HEAT_KEYS = {"delta_c", "ramp_s", "onset", "duration"}
SPEC_KEYS = {"type", "host", "gpu", "link", "onset", "duration", "params", "host_group"}
TOP_KEYS = {f.name for f in dataclasses.fields(Scenario)}


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


class ScenarioError(UsageError, ValueError):
    """A scenario that does not fit the fleet or the run asked for (a host index past ``--hosts``,
    an onset past ``--duration``): the user's options, told as a usage error, not a bug."""


def _err(where: str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}")


def _number(v: Any, where: str, lo: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(where, f"expected a number, got {v!r}")
    if v != v or v in (float("inf"), float("-inf")):
        raise _err(where, f"expected a finite number, got {v!r}")
    if lo is not None and v < lo:
        raise _err(where, f"must be >= {lo}, got {v!r}")
    return float(v)


@overload
def _time(v: Any, where: str, allow_none: Literal[False] = False) -> Time: ...
@overload
def _time(v: Any, where: str, allow_none: bool) -> Time | None: ...


def _time(v: Any, where: str, allow_none: bool = False) -> Time | None:
    """A time: seconds >= 0 or a percentage string like ``"25%"``."""
    if v is None and allow_none:
        return None
    if isinstance(v, str):
        s = v.strip()
        if s.endswith("%"):
            try:
                pct = float(s[:-1])
            except ValueError:
                raise _err(where, f"bad percentage {v!r}") from None
            if not 0.0 <= pct <= 100.0:
                raise _err(where, f"percentage must be within 0-100 %, got {v!r}")
            return s
        raise _err(where, f"expected seconds or a percentage like '25%', got {v!r}")
    return _number(v, where, lo=0.0)


@overload
def resolve_time(v: Time, duration: float) -> float: ...
@overload
def resolve_time(v: Time | None, duration: float) -> float | None: ...


def resolve_time(v: Time | None, duration: float) -> float | None:
    """Seconds for a ``Time`` in a run of ``duration`` seconds."""
    if v is None:
        return None
    if isinstance(v, str):
        return float(v.strip()[:-1]) / 100.0 * duration
    return float(v)


def _mapping(v: Any, where: str, int_keys: bool = False) -> dict:
    """A mapping with string keys (``int_keys``: host indices or names)."""
    if not isinstance(v, dict):
        raise _err(where, f"expected a mapping, got {type(v).__name__}")
    for k in v:
        if int_keys and isinstance(k, int) and not isinstance(k, bool) and k >= 0:
            continue
        if not isinstance(k, str):
            raise _err(where, f"keys must be strings, got {k!r}")
    return v


def _known(d: dict, allowed: set[str] | dict, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise _err(f"{where}.{k}" if where else k, f"unknown key (known: {', '.join(sorted(allowed))})")


def _check_params(ftype: str, params: Any, where: str) -> dict:
    params = _mapping(params if params is not None else {}, where)
    allowed = TYPES[ftype].PARAMS
    for k, v in params.items():
        if k not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise _err(f"{where}.{k}", f"unknown parameter for {ftype} (known: {known})")
        default = allowed[k]
        if isinstance(default, bool) or k in ("escalate", "contained", "xid92", "remap_failure"):
            if not isinstance(v, bool):
                raise _err(f"{where}.{k}", f"expected true/false, got {v!r}")
        elif isinstance(default, str) or k in ("memory", "mode"):
            if not isinstance(v, str):
                raise _err(f"{where}.{k}", f"expected a string, got {v!r}")
        else:
            _number(v, f"{where}.{k}", lo=0.0)
    return dict(params)


def check_spec(spec: FaultSpec, where: str) -> FaultSpec:
    """Validate one fault/condition entry; returns it normalised."""
    if not isinstance(spec.type, str):
        raise _err(f"{where}.type", f"expected a string, got {spec.type!r}")
    schedulable = FAULT_TYPES + SCHEDULABLE_CONDITIONS
    if spec.type not in schedulable:
        raise _err(f"{where}.type", f"unknown type {spec.type!r} (known: {', '.join(schedulable)})")
    kind = TYPES[spec.type]
    host = spec.host
    if host is not None and (isinstance(host, bool) or not isinstance(host, (int, str))):
        raise _err(f"{where}.host", f"expected a host index or name, got {host!r}")
    if isinstance(host, int) and host < 0:
        raise _err(f"{where}.host", f"must be >= 0, got {host!r}")
    gpu = spec.gpu
    if gpu is not None:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise _err(f"{where}.gpu", f"expected a GPU index >= 0, got {gpu!r}")
        if kind.scope in ("host", "fleet", "job") and spec.type != "driver_reload":
            raise _err(f"{where}.gpu", f"{spec.type} applies to a whole host; remove 'gpu'")
    link = spec.link
    if link is not None:
        if spec.type not in NVLINK_TYPES:
            raise _err(f"{where}.link", f"only NVLink faults take a link, not {spec.type}")
        if isinstance(link, bool) or not isinstance(link, int) or not 0 <= link < NVLINKS_PER_GPU:
            raise _err(f"{where}.link", f"expected a link index 0-{NVLINKS_PER_GPU - 1}, got {link!r}")
    if TYPES[spec.type].scope == "fleet" and host is not None:
        raise _err(f"{where}.host", f"{spec.type} is fleet-wide; remove 'host'")
    onset = _time(spec.onset, f"{where}.onset")
    duration = _time(spec.duration, f"{where}.duration", allow_none=True)
    if spec.host_group is not None and not isinstance(spec.host_group, str):
        raise _err(f"{where}.host_group", f"expected a string, got {spec.host_group!r}")
    params = _check_params(spec.type, spec.params, f"{where}.params")
    return dataclasses.replace(spec, onset=onset, duration=duration, params=params)


def _spec_from_mapping(d: Any, where: str) -> FaultSpec:
    d = _mapping(d, where)
    _known(d, SPEC_KEYS, where)
    if "type" not in d:
        raise _err(f"{where}.type", "missing")
    return check_spec(
        FaultSpec(
            type=d["type"],
            host=d.get("host"),
            gpu=d.get("gpu"),
            link=d.get("link"),
            onset=d.get("onset", 0.0),
            duration=d.get("duration"),
            params=d.get("params") or {},
            host_group=d.get("host_group"),
        ),
        where,
    )


def _check_options(sc: Scenario) -> None:
    """Validate the fleet options of a scenario (shared by YAML and programmatic ones)."""
    if sc.checkpoint_every is not None:
        _number(sc.checkpoint_every, "checkpoint_every", lo=0.0)
    cd = sc.checkpoint_duration
    if not isinstance(cd, (list, tuple)) or len(cd) != 2:
        raise _err("checkpoint_duration", f"expected [min, max] seconds, got {cd!r}")
    lo = _number(cd[0], "checkpoint_duration[0]", lo=0.0)
    hi = _number(cd[1], "checkpoint_duration[1]", lo=0.0)
    if hi < lo:
        raise _err("checkpoint_duration", f"max < min in {cd!r}")
    if sc.power_cap is not None:
        pc = _mapping(sc.power_cap, "power_cap")
        _known(pc, POWER_CAP_KEYS, "power_cap")
        if "hosts" in pc:
            hs = pc["hosts"]
            if not isinstance(hs, list) or not hs:
                raise _err("power_cap.hosts", f"expected a non-empty list, got {hs!r}")
            for j, h in enumerate(hs):
                if isinstance(h, bool) or not isinstance(h, (int, str)) or (isinstance(h, int) and h < 0):
                    raise _err(f"power_cap.hosts[{j}]", f"expected a host index or name, got {h!r}")
        if "count" in pc:
            c = pc["count"]
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise _err("power_cap.count", f"expected an integer >= 1, got {c!r}")
        if "fraction" in pc:
            f = _number(pc["fraction"], "power_cap.fraction", lo=0.0)
            if f > 1.0:
                raise _err("power_cap.fraction", f"must be <= 1, got {f!r}")
        if "limit_w" in pc:
            _number(pc["limit_w"], "power_cap.limit_w", lo=100.0)
        _time(pc.get("onset", 0.0), "power_cap.onset")
        _time(pc.get("duration"), "power_cap.duration", allow_none=True)
    if sc.afternoon_heat is not None:
        ah = _mapping(sc.afternoon_heat, "afternoon_heat")
        _known(ah, HEAT_KEYS, "afternoon_heat")
        for k in ("delta_c", "ramp_s"):
            if k in ah:
                _number(ah[k], f"afternoon_heat.{k}", lo=0.0)
        _time(ah.get("onset", 0.0), "afternoon_heat.onset")
        _time(ah.get("duration"), "afternoon_heat.duration", allow_none=True)
    amb = _mapping(sc.ambient, "ambient")
    _known(amb, AMBIENT_DEFAULTS, "ambient")
    for k, v in amb.items():
        _number(v, f"ambient.{k}")
    if sc.llama3 is not None:
        ll = _mapping(sc.llama3, "llama3")
        _known(ll, LLAMA3_DEFAULTS, "llama3")
        if "acceleration" in ll:
            _number(ll["acceleration"], "llama3.acceleration", lo=0.0)
    rnd = _mapping(sc.random, "random")
    _known(rnd, RANDOM_DEFAULTS, "random")
    for k, v in rnd.items():
        _number(v, f"random.{k}", lo=0.0)
    dq = _mapping(sc.data_quality, "data_quality")
    _known(dq, DATA_QUALITY_DEFAULTS, "data_quality")
    for k, v in dq.items():
        if _number(v, f"data_quality.{k}", lo=0.0) > 0.5:
            raise _err(f"data_quality.{k}", f"must be <= 0.5, got {v!r}")
    if not isinstance(sc.gpu_models, list):
        raise _err("gpu_models", f"expected a list, got {type(sc.gpu_models).__name__}")
    for j, gm in enumerate(sc.gpu_models):
        gm = _mapping(gm, f"gpu_models[{j}]")
        _known(gm, GPU_MODEL_KEYS, f"gpu_models[{j}]")
        if not isinstance(gm.get("model"), str) or not gm["model"]:
            raise _err(f"gpu_models[{j}].model", f"expected a GPU model name, got {gm.get('model')!r}")
        _number(gm.get("share", 1.0), f"gpu_models[{j}].share", lo=0.0)
        if gm.get("field_names", "pre-4.6") not in ("pre-4.6", "4.6"):
            raise _err(f"gpu_models[{j}].field_names", f"expected 'pre-4.6' or '4.6', got {gm['field_names']!r}")
    dl = _mapping(sc.delivery, "delivery")
    _known(dl, DELIVERY_KEYS, "delivery")
    if not isinstance(dl.get("phase", False), bool):
        raise _err("delivery.phase", f"expected true/false, got {dl['phase']!r}")
    _number(dl.get("jitter_s", 0.0), "delivery.jitter_s", lo=0.0)
    for k in ("skew_s", "late_s", "join_s"):
        for h, v in _mapping(dl.get(k) or {}, f"delivery.{k}", int_keys=True).items():
            if k == "late_s":
                if not isinstance(v, (list, tuple)) or len(v) != 2:
                    raise _err(f"delivery.late_s.{h}", f"expected [min, max] seconds, got {v!r}")
                lo = _number(v[0], f"delivery.late_s.{h}[0]", lo=0.0)
                if _number(v[1], f"delivery.late_s.{h}[1]", lo=0.0) < lo:
                    raise _err(f"delivery.late_s.{h}", f"max < min in {v!r}")
            elif k == "join_s":
                _time(v, f"delivery.join_s.{h}")
            else:
                _number(v, f"delivery.skew_s.{h}")
    nc = _mapping(sc.nccl, "nccl")
    _known(nc, NCCL_DEFAULTS, "nccl")
    for k, v in nc.items():
        if k == "dp_coll":
            if v not in COLLS:
                raise _err("nccl.dp_coll", f"expected one of {', '.join(COLLS)}, got {v!r}")
        elif k == "dp_busbw_gbs":
            if not isinstance(v, (list, tuple)) or len(v) != 2:
                raise _err("nccl.dp_busbw_gbs", f"expected [min, max], got {v!r}")
            for j, x in enumerate(v):
                _number(x, f"nccl.dp_busbw_gbs[{j}]", lo=0.1)
        elif k in ("tp_bytes", "dp_bytes"):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _err(f"nccl.{k}", f"expected a positive integer, got {v!r}")
        else:
            _number(v, f"nccl.{k}", lo=0.0)


def validate(sc: Scenario) -> Scenario:
    """Check a programmatically built ``Scenario``; returns a normalised copy."""
    if not isinstance(sc.faults, (list, tuple)):
        raise _err("faults", f"expected a list, got {type(sc.faults).__name__}")
    faults = []
    for j, f in enumerate(sc.faults):
        if isinstance(f, dict):
            faults.append(_spec_from_mapping(f, f"faults[{j}]"))
        elif isinstance(f, FaultSpec):
            faults.append(check_spec(f, f"faults[{j}]"))
        else:
            raise _err(f"faults[{j}]", f"expected a mapping, got {type(f).__name__}")
    out = copy.deepcopy(dataclasses.replace(sc, faults=faults))
    # Any length here: _check_options, next, rejects all but [min, max].
    out.checkpoint_duration = (
        cast("tuple[float, float]", tuple(float(x) for x in out.checkpoint_duration))
        if isinstance(out.checkpoint_duration, (list, tuple))
        else out.checkpoint_duration
    )
    _check_options(out)
    if not isinstance(out.sources, (list, tuple)) or any(src not in SOURCES for src in out.sources):
        raise _err("sources", f"expected a list of {', '.join(SOURCES)}, got {out.sources!r}")
    out.sources = list(dict.fromkeys(out.sources))
    for j, f in enumerate(out.faults):
        need = TYPES[f.type].source
        if need is not None and need not in out.sources:
            raise _err(f"faults[{j}].type", f"{f.type} shows only in the {need} source's fields: add sources: [{need}]")
    if out.checkpoint_every == 0:
        out.checkpoint_every = None
    return out


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    """Build and validate a ``Scenario`` from a parsed YAML/JSON mapping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    for k in data:
        if k not in TOP_KEYS:
            raise ValueError(f"{source}: {k}: unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    faults = data.get("faults") or []
    if not isinstance(faults, list):
        raise ValueError(f"{source}: faults: expected a list, got {type(faults).__name__}")
    kw: dict[str, Any] = {k: v for k, v in data.items() if k != "faults"}
    for k in ("name", "description"):
        if k in kw and not isinstance(kw[k], str):
            raise ValueError(f"{source}: {k}: expected a string, got {kw[k]!r}")
    for k in ("ambient", "random", "data_quality", "nccl", "delivery"):
        if k in kw and kw[k] is None:
            kw[k] = {}
    for k in ("gpu_models", "sources"):
        if k in kw and kw[k] is None:
            kw[k] = []
    try:
        specs = [_spec_from_mapping(f, f"faults[{j}]") for j, f in enumerate(faults)]
        return validate(Scenario(**{**kw, "faults": specs}))
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


# --------------------------------------------------------------------------------------------
# built-in scenarios
# --------------------------------------------------------------------------------------------


def _single(
    name: str, desc: str, ftype: str, onset: str = "15%", duration: str | None = "60%", **params: Any
) -> Scenario:
    return Scenario(
        name=name, description=desc, faults=[FaultSpec(type=ftype, onset=onset, duration=duration, params=params)]
    )


def _mixed() -> Scenario:
    # One of every fault type, staggered in time. Slots A-D are four hosts (all distinct with
    # >= 8 hosts); faults sharing a slot are placed so their signatures do not overlap in time
    # (e.g. both NVLink faults on different hosts, the straggler away from NVLink trouble).
    F = FaultSpec
    return Scenario(
        name="mixed",
        description="one of every fault type, spaced out over different hosts and GPUs",
        faults=[
            F("nvlink_degradation", onset="5%", duration="50%", host_group="B"),
            F("thermal_throttling", onset="8%", duration="40%", host_group="A"),
            F("thermal_hbm_throttling", onset="10%", duration="35%", host_group="C"),
            F("hbm_ecc_burst", onset="12%", duration="45%", host_group="D", params={"escalate": True}),
            F("nvlink_link_down", onset="55%", duration="30%", host_group="C"),
            F("nccl_straggler", onset="62%", duration="30%", host_group="D"),
            F("telemetry_gap", onset="68%", duration="12%", host_group="B"),
            F("gpu_lost", onset="84%", duration=None, host_group="A"),
        ],
    )


def _mixed_fleet() -> Scenario:
    # The fleet of issue 20's recording, on 6+ hosts: hosts 0-2 H100 with pre-4.6 DCGM names,
    # 3-5 B200 with the 4.6 names; 10 s sampling is the caller's (eval runs it at 10 s).
    F = FaultSpec
    return Scenario(
        name="mixed_fleet",
        description="H100 + B200 hosts, per-host sampling phase and jitter, a skewed, a late and a "
        "joining host, a job restart, a hot rack, a GPU reset, a fleet-wide power cap, "
        "isolated SBEs, and seven faults (needs >= 6 hosts)",
        gpu_models=[
            {"model": "NVIDIA H100 80GB HBM3", "share": 0.5},
            {"model": "NVIDIA B200", "share": 0.5, "field_names": "4.6"},
        ],
        delivery={
            "phase": True,
            "jitter_s": 0.3,
            "skew_s": {1: 2.5},
            "late_s": {4: [20.0, 40.0]},
            "join_s": {2: "33%"},
        },
        random={"sbe_per_gpu_day": 50.0},
        faults=[
            F("thermal_throttling", host=5, gpu=2, onset="8%", duration="20%"),
            F(
                "hbm_ecc_burst",
                host=0,
                gpu=1,
                onset="10%",
                duration="55%",
                params={"sbe_per_min": 3, "escalate": False, "xid92": False, "remap_at": 1.0},
            ),
            F(
                "nvlink_degradation",
                host=3,
                gpu=6,
                onset="20%",
                duration="30%",
                params={"crc_ratio": 0.0, "data_ratio": 0.0, "rate_max": 20.0, "replay_ratio": 0.05},
            ),
            F("hot_rack", host=2, onset="40%", duration="30%", params={"delta_c": 6.0}),
            F("nccl_straggler", host=1, gpu=4, onset="44%", duration="12%"),
            F("job_restart", onset="58%", duration=90),
            F("gpu_reset", host=3, gpu=1, onset="62%", duration=15),
            F("gpu_lost", host=0, gpu=5, onset="80%", duration=None),
        ],
        power_cap={"fraction": 1.0, "limit_w": 625.0, "onset": "66%", "duration": "30%"},
    )


def _builtins() -> dict[str, Scenario]:
    s = {
        "healthy": Scenario(name="healthy", description="a healthy training job: no faults"),
        "mixed": _mixed(),
        "mixed_fleet": _mixed_fleet(),
        "llama3": Scenario(
            name="llama3",
            description="faults drawn at Meta's Llama 3 405B interruption rate and mix (accelerated)",
            llama3=dict(LLAMA3_DEFAULTS),
            sources=["pcie_aer", "nvswitch", "nic", "progress"],
        ),
        "thermal": _single("thermal", "a GPU's cooling fails: thermal throttling", "thermal_throttling"),
        "thermal_hbm": _single("thermal_hbm", "HBM overheats while the core looks normal", "thermal_hbm_throttling"),
        "hbm": _single("hbm", "HBM ECC burst, row remap, then a DBE", "hbm_ecc_burst", escalate=True),
        "nvlink": _single("nvlink", "an NVLink degrades gradually", "nvlink_degradation", onset="10%", duration="75%"),
        "nvlink_down": _single("nvlink_down", "an NVLink goes down abruptly", "nvlink_link_down"),
        "straggler": _single("straggler", "one slow GPU holds its communicators back", "nccl_straggler"),
        "gpu_lost": _single("gpu_lost", "a GPU falls off the bus", "gpu_lost", onset="40%", duration=None),
        "pcie": dataclasses.replace(
            _single("pcie", "a fatal PCIe error on a GPU's link, then corrected errors", "pcie_aer_fatal"),
            sources=["pcie_aer"],
        ),
        "nvswitch": dataclasses.replace(
            _single("nvswitch", "a fatal NVSwitch error cuts a host's NVLink fabric", "nvswitch_fatal"),
            sources=["nvswitch"],
        ),
        "hang": dataclasses.replace(
            _single("hang", "one rank hangs in a collective until the watchdog times out", "hang_collective"),
            sources=["progress"],
        ),
        "network": dataclasses.replace(
            _single("network", "an InfiniBand cable flaps: its port goes down and up again", "network_link_flap"),
            sources=["nic"],
        ),
        "congestion": Scenario(
            name="congestion",
            description="a congested InfiniBand fabric: ports wait, DP collectives slow (benign, must not alert)",
            faults=[FaultSpec(type="network_congestion", onset="20%", duration="60%")],
            sources=["nic"],
        ),
        "telemetry_gap": _single(
            "telemetry_gap", "a host stops reporting, then resumes", "telemetry_gap", onset="30%", duration="20%"
        ),
        "power_cap": Scenario(
            name="power_cap",
            description="facility power capping on a quarter of the hosts (benign, must not alert)",
            power_cap={"fraction": 0.25, "limit_w": 450.0, "onset": "15%", "duration": "60%"},
        ),
        "afternoon_heat": Scenario(
            name="afternoon_heat",
            description="fleet-wide inlet temperature rise without throttling (benign, must not alert)",
            afternoon_heat={"delta_c": 5.0, "onset": "10%", "duration": "80%"},
        ),
        "driver_reload": Scenario(
            name="driver_reload",
            description="a host's driver is reloaded: volatile counters reset (benign)",
            faults=[FaultSpec(type="driver_reload", onset="50%")],
        ),
    }
    return {k: validate(v) for k, v in s.items()}


SCENARIOS: dict[str, Scenario] = _builtins()


def load_scenario(name_or_path: str | os.PathLike | Scenario | None) -> Scenario:
    """A built-in scenario by name, or one read from a YAML file; ``None`` means ``healthy``.

    Returns a fresh copy (mutating it does not change ``SCENARIOS``). Raises ``ValueError``
    naming the offending key for a bad file, and for an unknown name.
    """
    if name_or_path is None:
        return copy.deepcopy(SCENARIOS["healthy"])
    if isinstance(name_or_path, Scenario):
        return validate(name_or_path)
    key = os.fspath(name_or_path)
    if key in SCENARIOS:
        return copy.deepcopy(SCENARIOS[key])
    path = Path(key)
    if not path.is_file():
        raise ValueError(f"unknown scenario {key!r}: not a built-in ({', '.join(SCENARIOS)}) and no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    sc = scenario_from_dict(data, str(path))
    if sc.name == "custom":
        sc.name = path.stem
    return sc
