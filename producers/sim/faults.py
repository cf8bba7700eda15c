"""Fault and condition types: their parameters and what each does to the fleet while active.

A *fault* is something the pipeline must find (it gets a ground-truth label with ``fault`` and
``family``); a *condition* is something benign that changes the telemetry and must NOT be alerted
on as a fault (power capping, driver reloads, heat waves, checkpoints, isolated SBEs); it is
labelled with ``fault: null`` and a ``condition`` name so evaluation can tell the two apart.

Each type is a small class with ``PARAMS`` (name -> default; ``None`` means "drawn per event" or
"derived from the window", see ``resolve``) and ``apply``, called once per step while the event
is active (``onset <= t < end``; instant events once, at the first step at or after onset).
Effects write into the step's ``Mods`` (multipliers, masks) or bump the fleet's counters directly
-- counters change through faults, never through the physics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .fields import (
    XID_CONTAINED,
    XID_DBE,
    XID_FELL_OFF_BUS,
    XID_NVLINK,
    XID_REMAP,
    XID_REMAP_FAILED,
    XID_SBE_RATE,
    XID_UNCONTAINED,
)
from .fleet import FleetState, Mods
from .nic import PORTS_PER_HOST as NIC_PORTS

NVLINKS_PER_GPU = 18  # H100/H200 SXM: 18 NVLink4 links


@dataclass
class Event:
    """One resolved fault or condition: where, when (seconds from the run start) and how."""

    id: str
    type: str
    host: int | None  # host index; None for fleet/job-wide events
    gpu: int | None  # local GPU index; None for host-wide events
    link: int | None
    t0: float
    t1: float  # == t0 for instant events
    params: dict[str, Any]

    @property
    def kind(self) -> "EffectType":
        return TYPES[self.type]


@dataclass
class Runtime:
    """Per-run scratch state of one event (``batches()`` may be called more than once)."""

    event: Event
    rng: np.random.Generator
    gi: int | None  # global GPU index
    state: dict[str, Any] = field(default_factory=dict)
    done: bool = False  # instant events fire once


class EffectType:
    """Base class of a fault/condition type."""

    name: ClassVar[str] = ""
    fault: ClassVar[bool] = True  # False: benign condition
    scope: ClassVar[str] = "gpu"  # gpu | host | fleet | job
    instant: ClassVar[bool] = False
    PARAMS: ClassVar[dict[str, Any]] = {}
    # Event length drawn by random scenarios (llama3), seconds; None = until the end of the run.
    RANDOM_DURATION: ClassVar[tuple[float, float] | None] = (300.0, 900.0)
    # The producer beside dcgm-exporter whose fields show the fault (fields.SOURCE_FIELDS); a
    # scenario that schedules it must run that source, or the fault would be invisible.
    source: ClassVar[str | None] = None

    @property
    def family(self) -> str | None:
        return self.name.split("_", 1)[0] if self.fault else None

    def resolve(self, params: dict[str, Any], rng: np.random.Generator, window: float) -> dict[str, Any]:
        """Fill defaults (drawing the random ones) for an event lasting ``window`` seconds."""
        out = dict(self.PARAMS)
        out.update(params)
        return out

    def apply(self, rt: Runtime, t: float, dt: float, fleet: FleetState, mods: Mods) -> None:
        """Impose the effect for the step at ``t`` (seconds from the run start)."""


def _ramp(t: float, t0: float, ramp: float) -> float:
    return 1.0 if ramp <= 0 else min(1.0, max(0.0, (t - t0) / ramp))


# ---------------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------------


class ThermalThrottling(EffectType):
    """Cooling failure on one GPU (fan, cold plate, pump, thermal paste): its thermal resistance
    grows to ``severity`` x normal over ``ramp_s``. The temperature climbs past max operating
    temperature, the governor sets SW_THERMAL and pulls the clock, the core reaches the slowdown
    temperature and the hardware cuts the clock >= 2x (HW_THERMAL + HW_SLOWDOWN) -- the clock
    settles around 900-1300 MHz while utilisation stays high. Repair at the end: it cools back."""

    name = "thermal_throttling"
    PARAMS = {"severity": 4.0, "ramp_s": None}
    target = "cool_mult"  # the core's thermal resistance

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if p["ramp_s"] is None:
            p["ramp_s"] = round(min(180.0, 0.4 * window), 3)
        return p

    def apply(self, rt, t, dt, fleet, mods):
        p = rt.event.params
        getattr(mods, self.target)[rt.gi] *= 1.0 + (p["severity"] - 1.0) * _ramp(t, rt.event.t0, p["ramp_s"])


class ThermalHbmThrottling(ThermalThrottling):
    """HBM cooling degraded (memory-side cold plate contact): HBM temperature climbs to its max
    operating temperature (95 C) and stays there under SW_THERMAL while the core temperature is
    unremarkable; the governor trims the SM clock moderately (~1400-1700 MHz)."""

    name = "thermal_hbm_throttling"
    PARAMS = {"severity": 2.2, "ramp_s": None}
    target = "hbm_mult"  # the same ramp, on the memory side


class HbmEccBurst(EffectType):
    """A failing HBM (or SRAM) region. Phases, as fractions of the window:

    * from onset: single-bit errors at up to ``sbe_per_min`` (ramping in over the first 30 %),
      volatile and aggregate SBE counters rising together; XID 92 (excessive SBE rate) once
      ``xid92_after`` SBEs were seen, if ``xid92``;
    * at ``remap_at`` (HBM only): the driver schedules a row remap -- XID 63,
      ROW_REMAP_PENDING=1, the correctable-remapped-rows count rising (``rows_per_min``);
      ``remap_failure`` instead fails it: XID 64 and ROW_REMAP_FAILURE=1;
    * at ``dbe_at`` if ``escalate``: an uncorrectable error -- DBE counters +1, XID 48, then on
      the next sample XID 94 (``contained``) or 95 (uncontained); HBM also remaps the row
      (uncorrectable-remapped-rows +1).

    Counters stay where they got after the window; the pending remap clears on a driver reload."""

    name = "hbm_ecc_burst"
    RANDOM_DURATION = (180.0, 600.0)
    PARAMS = {
        "sbe_per_min": None,  # drawn 40-300
        "memory": "hbm",  # hbm | sram
        "escalate": None,  # drawn: half of the events escalate to a DBE
        "contained": None,  # drawn: XID 94 (contained) or 95
        "xid92": None,  # default: sbe_per_min >= 100
        "xid92_after": 30,
        "remap_at": 0.35,
        "rows_per_min": 1.5,
        "remap_failure": False,
        "dbe_at": 0.7,
    }

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if p["memory"] not in ("hbm", "sram"):
            raise ValueError(f"params.memory: must be 'hbm' or 'sram', got {p['memory']!r}")
        if p["sbe_per_min"] is None:
            p["sbe_per_min"] = int(rng.integers(40, 301))
        if p["escalate"] is None:
            p["escalate"] = bool(p["memory"] == "sram" or rng.random() < 0.5)
        if p["contained"] is None:
            p["contained"] = bool(rng.random() < 0.5)
        if p["xid92"] is None:
            p["xid92"] = bool(p["sbe_per_min"] >= 100)
        return p

    def apply(self, rt, t, dt, fleet, mods):
        ev, p, st, i = rt.event, rt.event.params, rt.state, rt.gi
        frac = (t - ev.t0) / max(ev.t1 - ev.t0, 1e-9)
        rate = p["sbe_per_min"] / 60.0 * (0.3 + 0.7 * min(1.0, frac / 0.3))
        n = int(rt.rng.poisson(rate * dt))
        fleet.sbe_vol[i] += n
        fleet.sbe_agg[i] += n
        st["sbe"] = st.get("sbe", 0) + n
        if p["xid92"] and not st.get("x92") and st["sbe"] >= p["xid92_after"]:
            st["x92"] = True
            fleet.xid[i] = XID_SBE_RATE
        if p["memory"] == "hbm" and frac >= p["remap_at"]:
            if not st.get("remap"):
                st["remap"] = True
                if p["remap_failure"]:
                    fleet.remap_failure[i] = 1
                    fleet.xid[i] = XID_REMAP_FAILED
                else:
                    fleet.remap_pending[i] = 1
                    fleet.rows_corr[i] += 1
                    fleet.xid[i] = XID_REMAP
            elif not p["remap_failure"]:
                fleet.rows_corr[i] += int(rt.rng.poisson(p["rows_per_min"] / 60.0 * dt))
        if p["escalate"]:
            if not st.get("dbe") and frac >= p["dbe_at"]:
                st["dbe"] = t
                fleet.dbe_vol[i] += 1
                fleet.dbe_agg[i] += 1
                fleet.xid[i] = XID_DBE
                if p["memory"] == "hbm":
                    fleet.rows_unc[i] += 1
                    fleet.remap_pending[i] = 1
            elif st.get("dbe") is not None and not st.get("after") and t > st["dbe"]:
                st["after"] = True
                fleet.xid[i] = XID_CONTAINED if p["contained"] else XID_UNCONTAINED


class NvlinkDegradation(EffectType):
    """A degrading NVLink (connector, cable cartridge, retimer): the CRC flit error rate grows
    exponentially from ``rate0`` to ``rate_max`` per second over ``ramp_s`` (times ``crc_ratio``;
    data CRC and replays in proportion to the rate, a rare recovery once the rate is high); the host's TP collectives and the
    GPUs' NVLink throughput sag by up to ``max_sag`` (quadratic in the ramp, so it shows late)."""

    name = "nvlink_degradation"
    RANDOM_DURATION = (600.0, 1800.0)
    PARAMS = {
        "rate0": 0.1,
        "rate_max": 300.0,
        "ramp_s": None,  # default 85 % of the window
        "max_sag": 0.35,
        "data_ratio": 0.3,
        "replay_ratio": 0.05,
        "crc_ratio": 1.0,  # 0: replays without CRC errors (a link that retrains cleanly)
    }

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if p["ramp_s"] is None:
            p["ramp_s"] = round(0.85 * window, 3)
        return p

    def apply(self, rt, t, dt, fleet, mods):
        ev, p, i = rt.event, rt.event.params, rt.gi
        x = _ramp(t, ev.t0, p["ramp_s"])
        # Errors come with traffic: a link idling through a checkpoint sees few.
        r = p["rate0"] * (p["rate_max"] / p["rate0"]) ** x * (0.05 if mods.paused else 1.0)
        rng = rt.rng
        fleet.crc_flit[i] += int(rng.poisson(r * p["crc_ratio"] * dt))
        fleet.crc_data[i] += int(rng.poisson(r * p["data_ratio"] * dt))
        fleet.replay[i] += int(rng.poisson(r * p["replay_ratio"] * dt))
        if r > 100.0:
            fleet.recovery[i] += int(rng.poisson(0.002 * dt))
        sag = p["max_sag"] * x * x
        mods.tp_h[ev.host] *= 1.0 - sag
        mods.nv_gpu[i] *= 1.0 - 0.5 * sag


class NvlinkLinkDown(EffectType):
    """A link drops abruptly: XID 74 at onset, ``recoveries`` recovery attempts over the first
    steps, a CRC burst (``crc_burst`` errors decaying with ``burst_tau_s``), and the host's TP
    bandwidth collapsed by ``bw_drop`` until the end (the link is fixed by a reset then)."""

    name = "nvlink_link_down"
    RANDOM_DURATION = (120.0, 600.0)
    PARAMS = {"bw_drop": 0.5, "crc_burst": 2000.0, "burst_tau_s": 15.0, "recoveries": 3}

    def apply(self, rt, t, dt, fleet, mods):
        ev, p, st, i, rng = rt.event, rt.event.params, rt.state, rt.gi, rt.rng
        if not st.get("xid"):
            st["xid"] = True
            fleet.xid[i] = XID_NVLINK
        if st.get("rec", 0) < p["recoveries"]:
            st["rec"] = st.get("rec", 0) + 1
            fleet.recovery[i] += 1
        tau = max(p["burst_tau_s"], 1e-3)
        lam = p["crc_burst"] / tau * math.exp(-(t - ev.t0) / tau) * dt * (0.05 if mods.paused else 1.0)
        n = int(rng.poisson(lam))
        fleet.crc_flit[i] += n
        fleet.crc_data[i] += int(rng.poisson(0.3 * lam))
        fleet.replay[i] += int(rng.poisson(0.2 * lam))
        mods.tp_h[ev.host] *= 1.0 - p["bw_drop"]
        mods.nv_gpu[i] *= (NVLINKS_PER_GPU - 1) / NVLINKS_PER_GPU


class NcclStraggler(EffectType):
    """One slow GPU. ``mode: stall`` (default): it waits on its input pipeline for ``slowdown`` of
    the time (SM activity, utilisation and power drop); ``mode: clock``: its clock is held at
    ``1 - slowdown`` of boost without a throttle reason (power drops, activity does not). Either
    way its communicators' other ranks wait for it (``nccl.py``), and its host peers lose a little
    SM activity to that waiting."""

    name = "nccl_straggler"
    RANDOM_DURATION = (300.0, 1200.0)
    PARAMS = {"slowdown": 0.3, "mode": "stall"}

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if p["mode"] not in ("stall", "clock"):
            raise ValueError(f"params.mode: must be 'stall' or 'clock', got {p['mode']!r}")
        if not 0.0 < float(p["slowdown"]) < 0.95:
            raise ValueError(f"params.slowdown: must be in (0, 0.95), got {p['slowdown']!r}")
        return p

    def apply(self, rt, t, dt, fleet, mods):
        p, i = rt.event.params, rt.gi
        if p["mode"] == "stall":
            mods.stall[i] = max(mods.stall[i], p["slowdown"])
        else:
            mods.clock_cap[i] = min(mods.clock_cap[i], 1.0 - p["slowdown"])
        hs = fleet.host_slice(rt.event.host)
        mods.peer_wait[hs] = np.maximum(mods.peer_wait[hs], 0.1 * p["slowdown"])
        mods.peer_wait[i] = 0.0


class GpuLost(EffectType):
    """The GPU falls off the bus: XID ``xid`` (79; 119 for a GSP failure) shows for
    ``xid_samples`` samples with the GPU idle, then the GPU is gone from the exporter's output
    while its host keeps reporting the others; its NCCL ranks stop at onset. If the event ends
    inside the run the GPU comes back reset: the planner adds a GPU-level ``driver_reload``
    condition at the end (volatile counters and XID back to 0)."""

    name = "gpu_lost"
    RANDOM_DURATION = None
    PARAMS = {"xid": XID_FELL_OFF_BUS, "xid_samples": None}

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if p["xid_samples"] is None:
            p["xid_samples"] = int(rng.integers(1, 3))
        return p

    def apply(self, rt, t, dt, fleet, mods):
        st, i = rt.state, rt.gi
        k = st.get("k", 0)
        st["k"] = k + 1
        mods.dead[i] = True
        if k < rt.event.params["xid_samples"]:
            fleet.xid[i] = int(rt.event.params["xid"])
            mods.force_idle[i] = True
        else:
            mods.gpu_hidden[i] = True


class PcieAerFatal(EffectType):
    """A fatal error on the GPU's PCIe link (a Surprise Down or completion timeout seen at the
    switch port above it): the bridge counts ``fatal`` fatal errors at onset, the GPU a few
    non-fatal ones, and corrected errors burst (``corrected_per_s``) while the link retrains
    and stays marginal until the fault is fixed. The GPU stays on the bus (one the link drops
    for good is ``gpu_lost``)."""

    name = "pcie_aer_fatal"
    source = "pcie_aer"
    RANDOM_DURATION = (300.0, 900.0)
    PARAMS = {"fatal": 1, "nonfatal": 2, "corrected_per_s": 0.5}

    def apply(self, rt, t, dt, fleet, mods):
        p, i = rt.event.params, rt.gi
        if not rt.state.get("hit"):
            rt.state["hit"] = True
            fleet.aer_up_fatal[i] += int(p["fatal"])
            fleet.aer_nonfatal[i] += int(p["nonfatal"])
        fleet.aer_cor[i] += int(rt.rng.poisson(float(p["corrected_per_s"]) * dt))
        fleet.pcie_replay[i] += int(rt.rng.poisson(float(p["corrected_per_s"]) * dt))


class NvswitchFatal(EffectType):
    """A fatal NVSwitch error on a host (SXid ``sxid``, 20034 an LTSSM fault on a link): the
    kernel log's SXid shows on every GPU of the host, and the host's NVLink fabric runs at
    ``1 - bw_drop`` of its bandwidth (its collectives slow) until the switches and GPUs are
    reset at the end."""

    name = "nvswitch_fatal"
    scope = "host"
    source = "nvswitch"
    RANDOM_DURATION = (300.0, 900.0)
    PARAMS = {"sxid": 20034, "bw_drop": 0.6}

    def apply(self, rt, t, dt, fleet, mods):
        ev, p = rt.event, rt.event.params
        hs = fleet.host_slice(ev.host)
        fleet.sxid_fatal[hs] = int(p["sxid"])
        mods.tp_h[ev.host] *= 1.0 - float(p["bw_drop"])
        mods.nv_gpu[hs] *= 1.0 - float(p["bw_drop"])


class HangCollective(EffectType):
    """One rank stops completing collectives (a hung GPU kernel behind its share of a collective,
    or a blocked process): its progress stalls one operation behind its peers, which wait in the
    next collective and complete nothing more either. The job makes no progress: its GPUs idle
    in the NCCL wait and its NCCL records stop. RAS shows the rank behind (``progress.py``); after
    ``timeout_ms`` (PyTorch's ``Timeout(ms)``, 600,000 by default; shorter here so an hour's run
    sees it) every rank of its communicators reports a watchdog timeout naming the sequence number
    it waited on. The hang clears at the end (the job restarted from its checkpoint)."""

    name = "hang_collective"
    source = "progress"
    RANDOM_DURATION = (300.0, 900.0)
    PARAMS = {"timeout_ms": 120_000}

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        v = p["timeout_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1_000 <= v <= 86_400_000:
            raise ValueError(f"params.timeout_ms: must be 1000..86400000 (ms), got {v!r}")
        return p

    def apply(self, rt, t, dt, fleet, mods):
        mods.paused = True
        mods.hung[rt.gi] = True
        mods.hang_timeout_s[rt.gi] = float(rt.event.params["timeout_ms"]) / 1000.0


class NetworkLinkFlap(EffectType):
    """A flapping cable or transceiver on the InfiniBand port of the GPU's rail (``mlx5_<gpu>``):
    the link falls to DOWN/Polling for ``down_s`` seconds and comes back ACTIVE, ``flaps``
    times spread over the window (``link_downed`` and ``carrier_changes`` rise at each fall).
    While it is down the GPU's data-parallel traffic detours through another rail's NIC, so its
    DP communicator runs at ``1 - bw_drop`` of its bandwidth."""

    name = "network_link_flap"
    source = "nic"
    RANDOM_DURATION = (300.0, 900.0)
    PARAMS = {"flaps": 4, "down_s": 20.0, "bw_drop": 0.5}

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if int(p["flaps"]) < 1 or float(p["down_s"]) <= 0:
            raise ValueError(f"params: flaps must be >= 1 and down_s > 0, got {p['flaps']!r}, {p['down_s']!r}")
        return p

    def apply(self, rt, t, dt, fleet, mods):
        ev, p = rt.event, rt.event.params
        # Falls at even spacing from onset, each followed by at least as long up again.
        period = max(2.0 * float(p["down_s"]), (ev.t1 - ev.t0) / int(p["flaps"]))
        k, into = divmod(t - ev.t0, period)
        if k < int(p["flaps"]) and into < float(p["down_s"]):
            port = ev.gpu % NIC_PORTS
            mods.nic_polling[ev.host, port] = True
            mods.dp_bw[rt.gi] *= 1.0 - float(p["bw_drop"])


class NetworkNicDown(EffectType):
    """The GPU's rail NIC (or its port) goes down for the rest of the window: DOWN, physical state
    Disabled (``link_downed`` +1 at the fall), and the GPU's DP traffic detours through another
    rail at ``1 - bw_drop`` of its bandwidth. Back ACTIVE when the NIC is replaced at the end."""

    name = "network_nic_down"
    source = "nic"
    RANDOM_DURATION = (600.0, 1800.0)
    PARAMS = {"bw_drop": 0.5}

    def apply(self, rt, t, dt, fleet, mods):
        ev = rt.event
        mods.nic_down[ev.host, ev.gpu % NIC_PORTS] = True
        mods.dp_bw[rt.gi] *= 1.0 - float(ev.params["bw_drop"])


class NetworkSymbolDrift(EffectType):
    """A degrading cable on the GPU's rail port: its symbol errors drift up from ``rate0_per_h``
    to ``rate_max_per_h`` an hour (exponentially over ``ramp_s``), past the IBTA bound of 120 an
    hour, while the link stays ACTIVE and FEC keeps its traffic whole."""

    name = "network_symbol_drift"
    source = "nic"
    RANDOM_DURATION = (600.0, 1800.0)
    PARAMS = {"rate0_per_h": 100.0, "rate_max_per_h": 3000.0, "ramp_s": None}

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if not 0 < float(p["rate0_per_h"]) <= float(p["rate_max_per_h"]):
            raise ValueError(f"params: need 0 < rate0_per_h <= rate_max_per_h, got {p['rate0_per_h']!r}, "
                             f"{p['rate_max_per_h']!r}")  # fmt: skip
        if p["ramp_s"] is None:
            p["ramp_s"] = round(min(300.0, 0.4 * window), 3)
        return p

    def apply(self, rt, t, dt, fleet, mods):
        ev, p = rt.event, rt.event.params
        x = _ramp(t, ev.t0, float(p["ramp_s"]))
        r0, r1 = float(p["rate0_per_h"]), float(p["rate_max_per_h"])
        mods.nic_sym_per_s[ev.host, ev.gpu % NIC_PORTS] += r0 * (r1 / r0) ** x / 3600.0


class TelemetryGap(EffectType):
    """The host's telemetry agent goes silent (exporter hung, network partition): no DCGM and no
    NCCL records from it for the window. The GPUs keep running; counters move on underneath."""

    name = "telemetry_gap"
    scope = "host"
    RANDOM_DURATION = (60.0, 600.0)
    PARAMS: ClassVar[dict[str, Any]] = {}

    def apply(self, rt, t, dt, fleet, mods):
        mods.host_hidden[rt.event.host] = True


# ---------------------------------------------------------------------------------------------
# Benign conditions
# ---------------------------------------------------------------------------------------------


class PowerCap(EffectType):
    """Facility power capping: the host's GPUs get their enforced power limit lowered to
    ``limit_w``. Power sits at the cap, SW_POWER_CAP is set, clocks are moderately lower and
    POWER_VIOLATION grows. Not a fault."""

    name = "power_cap"
    fault = False
    scope = "host"
    PARAMS = {"limit_w": 450.0}

    def apply(self, rt, t, dt, fleet, mods):
        hs = fleet.host_slice(rt.event.host)
        mods.limit[hs] = np.minimum(mods.limit[hs], float(rt.event.params["limit_w"]))


class DriverReload(EffectType):
    """The driver is reloaded on a host (or one GPU is reset): volatile ECC, NVLink, PCIe and
    violation counters and the sticky XID go back to 0, pending row remaps are applied. Aggregate
    ECC counters and remapped-row counts are kept. Not a fault."""

    name = "driver_reload"
    fault = False
    scope = "host"
    instant = True
    PARAMS: ClassVar[dict[str, Any]] = {}

    def apply(self, rt, t, dt, fleet, mods):
        ev = rt.event
        fleet.reset_volatile(fleet.host_slice(ev.host) if ev.gpu is None else rt.gi)


class AfternoonHeat(EffectType):
    """A fleet-wide inlet temperature rise (heat wave, chiller trouble): every host's ambient goes
    up by ``delta_c`` (+-20 % per host) with ``ramp_s`` ramps at both ends. Temperatures rise
    everywhere, nothing throttles. Not a fault -- a must-not-alert case."""

    name = "afternoon_heat"
    fault = False
    scope = "fleet"
    PARAMS = {"delta_c": 5.0, "ramp_s": None}

    def resolve(self, params, rng, window):
        p = super().resolve(params, rng, window)
        if p["ramp_s"] is None:
            p["ramp_s"] = round(0.25 * window, 3)
        return p

    def apply(self, rt, t, dt, fleet, mods):
        ev, p = rt.event, rt.event.params
        if "host_factor" not in rt.state:
            rt.state["host_factor"] = rt.rng.uniform(0.8, 1.2, fleet.H)
        ramp = p["ramp_s"]
        x = min(_ramp(t, ev.t0, ramp), _ramp(ev.t1, t, ramp))
        mods.amb_add_h += p["delta_c"] * x * rt.state["host_factor"]


class NetworkCongestion(EffectType):
    """A congested fabric (another job's all-to-all, an ECMP hot spot): every port's
    ``port_xmit_wait`` grows ``wait_factor`` times as fast, and the job's DP collectives run at
    ``1 - bw_drop`` of their bandwidth, fleet-wide, with no error and no link down. Not a fault --
    a must-not-alert case."""

    name = "network_congestion"
    fault = False
    scope = "fleet"
    source = "nic"
    PARAMS = {"wait_factor": 20.0, "bw_drop": 0.1}

    def apply(self, rt, t, dt, fleet, mods):
        p = rt.event.params
        mods.nic_wait *= float(p["wait_factor"])
        mods.dp_bw *= 1.0 - float(p["bw_drop"])


class Checkpoint(EffectType):
    """A job-wide checkpoint: every GPU of the job idles at once and NCCL traffic stops."""

    name = "checkpoint"
    fault = False
    scope = "job"

    def apply(self, rt, t, dt, fleet, mods):
        mods.paused = True


class HotRack(EffectType):
    """A rack runs warm (a failing CRAH, blocked aisle): the host's inlet is ``delta_c`` warmer.
    Every GPU of the host heats together, nothing throttles. Not a fault."""

    name = "hot_rack"
    fault = False
    scope = "host"
    PARAMS = {"delta_c": 6.0}

    def apply(self, rt, t, dt, fleet, mods):
        mods.amb_add_h[rt.event.host] += float(rt.event.params["delta_c"])


class JobRestart(EffectType):
    """The job is restarted (a crash, a preemption): every GPU idles for the event's length and
    NCCL stops; the new incarnation builds new communicators (new ids). Not a fault."""

    name = "job_restart"
    fault = False
    scope = "job"

    def apply(self, rt, t, dt, fleet, mods):
        mods.paused = True


class GpuReset(EffectType):
    """An operator resets one GPU (nvidia-smi -r): it leaves the exporter's output for the event's
    length, then comes back with its volatile counters and sticky XID at 0. Not a fault."""

    name = "gpu_reset"
    fault = False
    scope = "gpu"

    def apply(self, rt, t, dt, fleet, mods):
        i = rt.gi
        mods.gpu_hidden[i] = True
        mods.force_idle[i] = True
        if not rt.done:
            rt.done = True
            fleet.reset_volatile(i)


class PcieAerCorrected(EffectType):
    """A lone corrected PCIe error (a receiver error a Gen5 link logs now and then): the GPU's
    correctable AER total +1. Benign."""

    name = "pcie_aer_corrected"
    fault = False
    instant = True

    def apply(self, rt, t, dt, fleet, mods):
        fleet.aer_cor[rt.gi] += 1


class EccSbeIsolated(EffectType):
    """A lone corrected single-bit error (cosmic rays, marginal cell): SBE counters +1. Benign."""

    name = "ecc_sbe_isolated"
    fault = False
    instant = True

    def apply(self, rt, t, dt, fleet, mods):
        fleet.sbe_vol[rt.gi] += 1
        fleet.sbe_agg[rt.gi] += 1


TYPES: dict[str, EffectType] = {
    cls.name: cls()
    for cls in (
        ThermalThrottling,
        ThermalHbmThrottling,
        HbmEccBurst,
        NvlinkDegradation,
        NvlinkLinkDown,
        NcclStraggler,
        GpuLost,
        PcieAerFatal,
        NvswitchFatal,
        HangCollective,
        NetworkLinkFlap,
        NetworkNicDown,
        NetworkSymbolDrift,
        TelemetryGap,
        PowerCap,
        DriverReload,
        AfternoonHeat,
        Checkpoint,
        EccSbeIsolated,
        PcieAerCorrected,
        HotRack,
        NetworkCongestion,
        JobRestart,
        GpuReset,
    )
}
FAULT_TYPES: tuple[str, ...] = tuple(n for n, t in TYPES.items() if t.fault)
CONDITION_TYPES: tuple[str, ...] = tuple(n for n, t in TYPES.items() if not t.fault)
# Conditions a scenario may schedule itself (the others are drawn by the simulator).
SCHEDULABLE_CONDITIONS: tuple[str, ...] = (
    "power_cap",
    "driver_reload",
    "afternoon_heat",
    "hot_rack",
    "job_restart",
    "gpu_reset",
    "network_congestion",
)
NVLINK_TYPES = ("nvlink_degradation", "nvlink_link_down")
