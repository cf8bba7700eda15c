"""Physical dynamics of a fleet of GPUs, vectorised with numpy over every GPU at once.

The model, per GPU and step (``dt`` seconds):

* load: while the job trains, SM activity and power follow a per-GPU operating point plus a
  job-wide component (all ranks run the same iteration in lock step) and per-GPU noise; during a
  job-wide checkpoint pause every GPU idles (util 0, ~100 W, 345 MHz, GPU_IDLE);
* clocks: the SM clock is the boost clock scaled by the tightest of three limits -- the power
  limit (dynamic power ~ clock^2, so the scale that puts power at the limit is a square root),
  the thermal governor, and any fault-imposed cap -- and is quantised to 15 MHz bins;
* temperatures: core and HBM are first-order lags (tau 30-60 s / 45-75 s) toward
  ``ambient + k * power`` with a per-GPU thermal resistance ``k`` (cooling efficiency varies by
  slot); ambient is the host inlet: a diurnal cycle, a per-host offset, a slow random walk and any
  scenario heat;
* thermal governor: an integrating controller that trims the clock scale while the core is above
  its max operating temperature or the HBM above its own, and a hardware slowdown latch (clock
  cut >= 2x) when the core reaches the slowdown temperature -- what SW_THERMAL, HW_THERMAL and
  HW_SLOWDOWN report;
* counters: violation nanoseconds accumulate while capped or throttled; ECC, NVLink, PCIe and
  remap counters are changed by fault effects (``faults.py``) and by rare benign events.

``FleetState.step`` returns the arrays a DCGM record is made of; ``Mods`` is how fault and
condition effects reach into a step without the physics knowing about them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .fields import (
    GPU_IDLE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
    GpuModelSpec,
)
from .nic import PORTS_PER_HOST as NIC_PORTS
from .rng import substream

NS = 1_000_000_000
SW_FLOOR = 0.6  # lowest clock scale the software thermal slowdown goes to (~1190 MHz)
MAX_SUBSTEP_S = 1.0
CLOCK_SPEED_EXP = 0.7

# Ambient (server inlet) model defaults; a scenario's ``ambient`` mapping overrides them.
AMBIENT_DEFAULTS = {
    "base_c": 24.0,  # inlet temperature at the daily mean
    "diurnal_amplitude_c": 3.0,  # +- around the mean over a day
    "peak_hour": 15.0,  # local hour of the daily maximum (mid-afternoon)
    "utc_offset_h": 0.0,  # the data centre's offset from UTC, for "local hour"
    "host_spread_c": 1.2,  # sd of per-host inlet offsets (rack position, airflow)
}


@dataclass
class StepOut:
    """Per-GPU values of one step (arrays of length N)."""

    training: np.ndarray  # bool: running the job this step
    temp: np.ndarray  # int64 core temperature
    mem_temp: np.ndarray  # int64 HBM temperature
    sm_clock: np.ndarray  # int64
    power: np.ndarray  # float64, rounded to 3 decimals
    limit: np.ndarray  # float64 enforced power limit
    util: np.ndarray  # int64 0..100
    reasons: np.ndarray  # int64 clock-event bitmask
    sm_active: np.ndarray  # float64 0..1, rounded
    nvlink_bw: np.ndarray  # int64 MB/s
    speed: np.ndarray  # float64 effective compute speed (1 = nominal), for NCCL


class Mods:
    """What this step's active faults and conditions impose; reset before every step."""

    def __init__(self, n: int, h: int, limit_w: float | np.ndarray) -> None:
        """``limit_w``: the board limit, one for the fleet or one per GPU (a mixed fleet)."""
        self.n, self.h = n, h
        self.limit_w = np.broadcast_to(np.asarray(limit_w, dtype=float), (n,)).copy()  # board limit per GPU
        self.cool_mult = np.ones(n)  # core thermal resistance multiplier (cooling failure)
        self.hbm_mult = np.ones(n)  # HBM thermal resistance multiplier
        self.stall = np.zeros(n)  # fraction of time the GPU waits on input (straggler)
        self.clock_cap = np.ones(n)  # max clock scale (straggler "clock" mode)
        self.peer_wait = np.zeros(n)  # fraction of SM time lost waiting for a slow peer
        self.limit = self.limit_w.copy()  # enforced power limit (facility power cap)
        self.amb_add_h = np.zeros(h)  # extra inlet temperature per host (heat wave)
        self.nv_gpu = np.ones(n)  # NVLink throughput factor of one GPU
        self.tp_h = np.ones(h)  # NVLink (TP communicator) bandwidth factor per host
        self.gpu_hidden = np.zeros(n, bool)  # GPU absent from the exporter's output
        self.host_hidden = np.zeros(h, bool)  # host sends nothing (telemetry gap)
        self.dead = np.zeros(n, bool)  # GPU not computing, no NCCL ranks
        self.force_idle = np.zeros(n, bool)  # GPU reports but runs nothing
        self.hung = np.zeros(n, bool)  # the GPU's rank hangs in a collective (progress.py)
        self.hang_timeout_s = np.zeros(n)  # its watchdog's collective timeout
        self.paused = False  # job-wide checkpoint pause
        # The hosts' NIC ports (nic.py, the ``nic`` source), 8 a host, and the data-parallel
        # (inter-host) bandwidth factor of each GPU's rank.
        self.nic_down = np.zeros((h, NIC_PORTS), bool)  # port Disabled
        self.nic_polling = np.zeros((h, NIC_PORTS), bool)  # port down, retraining (Polling)
        self.nic_sym_per_s = np.zeros((h, NIC_PORTS))  # extra symbol errors a second
        self.nic_wait = np.ones((h, NIC_PORTS))  # port_xmit_wait factor (fabric congestion)
        self.dp_bw = np.ones(n)  # inter-host (DP communicator) bandwidth factor per GPU

    def reset(self) -> None:
        self.cool_mult.fill(1.0)
        self.hbm_mult.fill(1.0)
        self.stall.fill(0.0)
        self.clock_cap.fill(1.0)
        self.peer_wait.fill(0.0)
        self.limit[:] = self.limit_w
        self.amb_add_h.fill(0.0)
        self.nv_gpu.fill(1.0)
        self.tp_h.fill(1.0)
        self.gpu_hidden.fill(False)
        self.host_hidden.fill(False)
        self.dead.fill(False)
        self.force_idle.fill(False)
        self.hung.fill(False)
        self.paused = False
        self.nic_down.fill(False)
        self.nic_polling.fill(False)
        self.nic_sym_per_s.fill(0.0)
        self.nic_wait.fill(1.0)
        self.dp_bw.fill(1.0)


class FleetState:
    """Static per-GPU characteristics plus the dynamic state (temperatures, counters, governor)."""

    def __init__(
        self,
        hosts: int,
        gpus_per_host: int,
        spec: GpuModelSpec | list[GpuModelSpec],
        seed: int,
        dt: float,
        ambient: dict | None = None,
        start_paused: bool = False,
        start_ts: float = 0.0,
    ) -> None:
        self.H, self.G, self.N = hosts, gpus_per_host, hosts * gpus_per_host
        specs = spec if isinstance(spec, list) else [spec] * hosts  # one GPU model per host
        self.spec, self.dt = specs[0], dt
        self.specs_h = specs
        per_gpu = lambda attr: np.repeat(
            np.array([getattr(sp, attr) for sp in specs], dtype=float),  # noqa: E731
            gpus_per_host,
        )
        self.max_op, self.mem_max_op = per_gpu("gpu_max_op_c"), per_gpu("mem_max_op_c")
        self.slowdown, self.boost, self.idle_mhz = per_gpu("slowdown_c"), per_gpu("boost_mhz"), per_gpu("idle_mhz")
        self.board_w = per_gpu("power_limit_w")
        load_scale, k_scale = per_gpu("load_scale"), per_gpu("k_scale")
        self.amb = {**AMBIENT_DEFAULTS, **(ambient or {})}
        n, h = self.N, self.H
        r = substream(seed, "fleet-static")
        self.host_of = np.repeat(np.arange(h), gpus_per_host)
        self.gpu_of = np.tile(np.arange(gpus_per_host), h)
        # Cooling: thermal resistance (C/W) varies by GPU; clipped so a healthy GPU at the power
        # limit on the hottest afternoon stays under max operating temperature.
        self.k_core = np.clip(r.normal(0.062, 0.0025, n), 0.055, 0.067) * k_scale
        self.k_hbm = np.clip(r.normal(0.066, 0.003, n), 0.058, 0.071) * k_scale
        self.hbm_off = r.uniform(4.0, 7.0, n)  # HBM sits a few degrees above the die
        self.gpu_amb_off = r.uniform(-1.0, 1.5, n)  # airflow position inside the chassis
        self.host_amb_off = np.clip(r.normal(0.0, self.amb["host_spread_c"], h), -2.5, 2.5)
        tau_core = r.uniform(30.0, 60.0, n)
        tau_hbm = r.uniform(45.0, 75.0, n)
        self.n_sub = max(1, math.ceil(dt / MAX_SUBSTEP_S - 1e-9))
        self.alpha_core = 1.0 - np.exp(-(dt / self.n_sub) / tau_core)
        self.alpha_hbm = 1.0 - np.exp(-(dt / self.n_sub) / tau_hbm)
        # Operating point: idle power, checkpoint power (host still copies state), training power
        # and SM activity differ a little between GPUs (silicon lottery, position in the model).
        self.p_idle = r.uniform(68.0, 90.0, n)
        self.p_ckpt = self.p_idle + r.uniform(18.0, 30.0, n)
        self.p_load = r.uniform(585.0, 662.0, n) * load_scale
        self.act_base = r.uniform(0.74, 0.86, n)
        self.nv_base = r.uniform(125_000.0, 155_000.0, n)  # NVLink MB/s while training
        # Counters start where a fleet in service would be: some history in the aggregates.
        self.sbe_vol = np.zeros(n, np.int64)
        self.dbe_vol = np.zeros(n, np.int64)
        self.sbe_agg = np.where(r.random(n) < 0.2, r.integers(1, 40, n), 0).astype(np.int64)
        self.dbe_agg = np.where(r.random(n) < 0.01, 1, 0).astype(np.int64)
        self.rows_corr = np.where(r.random(n) < 0.05, r.integers(1, 4, n), 0).astype(np.int64)
        self.rows_unc = np.where(r.random(n) < 0.005, 1, 0).astype(np.int64)
        self.remap_pending = np.zeros(n, np.int64)
        self.remap_failure = np.zeros(n, np.int64)
        self.crc_flit = np.zeros(n, np.int64)
        self.crc_data = np.zeros(n, np.int64)
        self.replay = np.zeros(n, np.int64)
        self.recovery = np.zeros(n, np.int64)
        self.pcie_replay = np.where(r.random(n) < 0.1, r.integers(1, 6, n), 0).astype(np.int64)
        self.xid = np.zeros(n, np.int64)
        # PCIe AER totals since boot (the kernel's, not the driver's: a driver reload keeps them),
        # the GPU's own and its bridges'; a few GPUs have some corrected-error history. Drawn
        # from their own stream so the draws above are the same with or without them.
        ra = substream(seed, "fleet-aer")
        self.aer_cor = np.where(ra.random(n) < 0.1, ra.integers(1, 20, n), 0).astype(np.int64)
        self.aer_nonfatal = np.zeros(n, np.int64)
        self.aer_fatal = np.zeros(n, np.int64)
        self.aer_up_cor = np.where(ra.random(n) < 0.1, ra.integers(1, 50, n), 0).astype(np.int64)
        self.aer_up_nonfatal = np.zeros(n, np.int64)
        self.aer_up_fatal = np.zeros(n, np.int64)
        # The host's last NVSwitch SXid of each kind, on each of its GPUs (as produce kmsg sends it).
        self.sxid_fatal = np.zeros(n, np.int64)
        self.sxid_nonfatal = np.zeros(n, np.int64)
        # Since the driver loaded (days ago) the job has brushed the power limit now and then.
        self.power_ns = (r.uniform(0.0, 600.0, n) * NS).astype(np.int64)
        self.therm_ns = np.where(r.random(n) < 0.03, r.uniform(1, 30, n) * NS, 0).astype(np.int64)
        # Dynamic state.
        self.amb_walk = np.zeros(h)
        self.scale_th = np.ones(n)
        self.hw_latch = np.zeros(n, bool)
        self.tp_speed_h = np.ones(h)
        self._noise = substream(seed, "fleet-noise")
        # Start in equilibrium with the load and the ambient of the first sample.
        amb0 = self.ambient_h(start_ts)[self.host_of] + self.gpu_amb_off
        p0 = self.p_ckpt if start_paused else self.p_load
        self.t_core = amb0 + self.k_core * p0
        self.t_hbm = amb0 + self.hbm_off + self.k_hbm * p0

    # --- helpers used by fault effects -------------------------------------------------------
    def gpu_index(self, host: int, gpu: int) -> int:
        return host * self.G + gpu

    def host_slice(self, host: int) -> slice:
        return slice(host * self.G, (host + 1) * self.G)

    def reset_volatile(self, idx: slice | int | np.ndarray) -> None:
        """A driver reload: volatile counters and the sticky XID go back to zero; a pending row
        remap is applied by the GPU reset that comes with it. Aggregates and remapped rows stay."""
        for arr in (
            self.sbe_vol,
            self.dbe_vol,
            self.crc_flit,
            self.crc_data,
            self.replay,
            self.recovery,
            self.pcie_replay,
            self.xid,
            self.therm_ns,
            self.power_ns,
            self.remap_pending,
        ):
            arr[idx] = 0

    def ambient_h(self, ts: float) -> np.ndarray:
        """Inlet temperature per host at event time ``ts`` (without scenario heat)."""
        a = self.amb
        hour = (ts / 3600.0 + a["utc_offset_h"]) % 24.0
        diurnal = a["diurnal_amplitude_c"] * math.cos(2.0 * math.pi * (hour - a["peak_hour"]) / 24.0)
        return a["base_c"] + diurnal + self.host_amb_off + self.amb_walk

    # --- one step -------------------------------------------------------------------------------
    def step(self, ts: float, mods: Mods) -> StepOut:
        """Advance every GPU by ``dt`` under ``mods`` and return what DCGM would report."""
        spec, dt, n, rnd = self.spec, self.dt, self.N, self._noise
        host_of = self.host_of
        # Slow weather/HVAC wander of each host's inlet (AR(1), sd ~0.3 C, hours-long memory).
        self.amb_walk += -self.amb_walk * (dt / 1800.0) + rnd.normal(0.0, 0.3 * math.sqrt(2 * dt / 1800.0), self.H)
        amb = (self.ambient_h(ts) + mods.amb_add_h)[host_of] + self.gpu_amb_off

        training = ~(mods.dead | mods.force_idle)
        if mods.paused:
            training[:] = False
        # Load. All ranks run the same iteration, so a job-wide term moves every GPU together.
        job = rnd.normal(0.0, 0.012)
        host_j = rnd.normal(0.0, 0.006, self.H)[host_of]
        eps_act = rnd.normal(0.0, 0.015, n)
        eps_pow = rnd.normal(0.0, 8.0, n)
        eps_util = rnd.normal(0.0, 1.2, n)
        eps_idle = rnd.normal(0.0, 2.5, n)
        eps_cap = np.abs(rnd.normal(0.0, 0.004, n))
        eps_bw = rnd.normal(0.0, 0.03, n)
        eps_t = rnd.normal(0.0, 0.25, (2, n))

        work = (1.0 - mods.stall) * (1.0 - mods.peer_wait)
        act_t = np.clip(self.act_base * work * (1.0 + job + host_j + eps_act), 0.0, 0.99)
        p_dem = self.p_idle + (self.p_load - self.p_idle) * (act_t / self.act_base) + eps_pow
        p_dem = np.where(training, p_dem, self.p_ckpt + eps_idle)
        dyn = np.maximum(p_dem - self.p_idle, 1.0)

        # Long sampling intervals (the exporter's default is 30 s) are integrated in sub-steps of
        # at most MAX_SUBSTEP_S so the governor can react as fast as the silicon does; the sample
        # reports the last sub-step, the violation counters the whole interval.
        limit = mods.limit
        h = dt / self.n_sub
        for _ in range(self.n_sub):
            # Clock scale: thermal governor (hardware latch cuts >= 2x), fault cap, power limit.
            hw_th = self.hw_latch.copy()
            s_th = np.where(hw_th, np.minimum(self.scale_th, 0.5), self.scale_th)
            s_req = np.minimum(s_th, mods.clock_cap)
            p_s = self.p_idle + dyn * s_req * s_req
            capped = training & (p_s > limit)
            s_pow = np.sqrt(np.maximum(limit - self.p_idle, 1.0) / dyn)
            s = np.where(capped, np.minimum(s_req, s_pow), s_req)
            power = np.where(capped, limit * (1.0 - eps_cap), np.where(training, p_s, p_dem))
            power = np.maximum(power, 20.0)

            # Temperatures: first-order lag toward ambient + k * power.
            self.t_core += (amb + self.k_core * mods.cool_mult * power - self.t_core) * self.alpha_core
            self.t_hbm += (amb + self.hbm_off + self.k_hbm * mods.hbm_mult * power - self.t_hbm) * self.alpha_hbm

            # Software thermal slowdown is on while the governor holds the clock down or a
            # temperature is at its max operating limit.
            sw_th = (
                (training & (s_th < 0.995)) | (self.t_core >= self.max_op - 0.5) | (self.t_hbm >= self.mem_max_op - 0.5)
            )

            # Thermal governor (acts on the next sub-step): integrate the excess over the set
            # points, recover slowly once comfortably below them. Software slowdown only trims
            # the clock so far (SW_FLOOR); a GPU whose cooling cannot keep up keeps heating to the
            # slowdown temperature, where the hardware latch cuts the clock >= 2x until it is back
            # a little under max operating temperature (hysteresis).
            over = np.maximum(self.t_core - (self.max_op + 1.0), self.t_hbm - (self.mem_max_op + 0.5))
            self.scale_th = np.clip(
                np.where(
                    over > 0,
                    self.scale_th - 0.012 * over * h,
                    np.where(over < -1.5, self.scale_th + 0.01 * h, self.scale_th),
                ),
                SW_FLOOR,
                1.0,
            )
            self.hw_latch = (self.t_core >= self.slowdown) | (hw_th & (self.t_core >= self.max_op - 0.5))

            # Violation counters: time spent held below the requested clock, in ns.
            over_cap = np.clip((p_s - limit) / (0.03 * limit), 0.25, 1.0)
            self.power_ns += np.where(capped, over_cap * h * NS, 0.0).astype(np.int64)
            self.therm_ns += np.where(sw_th | hw_th, int(h * NS), 0)

        step_mhz = spec.clock_step_mhz
        clock = np.rint(self.boost * s / step_mhz).astype(np.int64) * step_mhz
        clock = np.where(training, np.maximum(clock, 210), self.idle_mhz.astype(np.int64))
        temp = np.rint(self.t_core + eps_t[0]).astype(np.int64)
        mem_temp = np.rint(self.t_hbm + eps_t[1]).astype(np.int64)
        # Clock-event reasons, from the limits that shaped the sampled clock.
        reasons = (
            np.where(training, 0, GPU_IDLE)
            | np.where(capped, SW_POWER_CAP, 0)
            | np.where(sw_th, SW_THERMAL, 0)
            | np.where(hw_th, HW_THERMAL | HW_SLOWDOWN, 0)
        ).astype(np.int64)

        # Rare benign PCIe replays (a marginal slot retrains now and then).
        k = rnd.poisson(2e-6 * dt * n)
        if k:
            np.add.at(self.pcie_replay, rnd.integers(0, n, k), 1)

        util = np.where(training, np.rint(100.0 * (1.0 - 0.45 * mods.stall) - np.abs(eps_util)), 0)
        util = np.clip(util, 0, 100).astype(np.int64)
        sm_active = np.where(training, act_t, np.abs(eps_act) * 0.2)

        # Compute speed for the NCCL model: training is partly memory- and network-bound, so
        # throughput falls slower than the clock (~clock^0.7); input stalls cost time directly.
        speed = np.where(training, s**CLOCK_SPEED_EXP * (1.0 - mods.stall), 0.0)
        # NVLink traffic follows the TP collectives: the host's link health and its slowest rank.
        host_speed = np.where(training, speed, 1.0).reshape(self.H, self.G).min(axis=1)
        nvbw = self.nv_base * (mods.tp_h * np.minimum(host_speed, 1.0))[host_of] * mods.nv_gpu * (1.0 + eps_bw)
        nvbw = np.where(training, nvbw, np.abs(eps_bw) * 800.0).astype(np.int64)

        return StepOut(
            training=training,
            temp=temp,
            mem_temp=mem_temp,
            sm_clock=clock,
            power=np.round(power, 3),
            limit=np.round(limit, 3),
            util=util,
            reasons=reasons,
            sm_active=np.round(sm_active, 3),
            nvlink_bw=nvbw,
            speed=speed,
        )
