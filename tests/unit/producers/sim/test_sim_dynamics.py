"""Simulator physics: load phases, checkpoints, coupling, counters, benign conditions."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

import numpy as np

from producers.sim import Simulator, load_scenario
from producers.sim.fields import (
    BLANK_INT64,
    GPU_IDLE,
    HW_SLOWDOWN,
    HW_THERMAL,
    PERSISTENT_COUNTERS,
    SW_POWER_CAP,
    SW_THERMAL,
    VOLATILE_COUNTERS,
)

P = "DCGM_FI_DEV_"
THERMAL = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN
CLEAN = {"blank_rate": 0.0, "missing_rate": 0.0}


def scenario(name: str, **changes):
    sc = load_scenario(name)
    return dataclasses.replace(sc, **{"data_quality": dict(CLEAN), **changes})


def series(sim: Simulator):
    """(host, gpu) -> list of (t, fields) with t relative to the start; NCCL records by comm."""
    dc, nc = defaultdict(list), defaultdict(list)
    for r in sim.records():
        t = r["ts"] - sim.start_ts
        if r["kind"] == "dcgm":
            dc[(r["host"], r["gpu"])].append((t, r["fields"]))
        else:
            nc[r["comm_name"]].append((t, r))
    return dc, nc


def test_training_operating_point():
    sim = Simulator(hosts=4, duration=300.0, seed=11, scenario=scenario("healthy", checkpoint_every=None))
    dc, _ = series(sim)
    util, power, smact, clock, temp, mtemp = [], [], [], [], [], []
    for rows in dc.values():
        for _, f in rows:
            util.append(f[P + "GPU_UTIL"])
            power.append(f[P + "POWER_USAGE"])
            smact.append(f["DCGM_FI_PROF_SM_ACTIVE"])
            clock.append(f[P + "SM_CLOCK"])
            temp.append(f[P + "GPU_TEMP"])
            mtemp.append(f[P + "MEMORY_TEMP"])
            assert f[P + "ENFORCED_POWER_LIMIT"] == 700.0
            assert f[P + "POWER_USAGE"] <= 700.0 + 1e-6
    assert np.percentile(util, 5) >= 95 and max(util) <= 100
    assert 0.7 <= np.median(smact) <= 0.9
    assert 530 <= np.percentile(power, 1) and np.percentile(power, 99) <= 700
    assert statistics.median(clock) == 1980
    assert 55 <= np.median(temp) <= 78
    assert np.median(mtemp) > np.median(temp)  # HBM runs a few degrees above the core
    assert np.median(mtemp) - np.median(temp) < 15


def test_checkpoint_pauses_all_gpus_at_once_and_stop_nccl():
    sim = Simulator(
        hosts=4,
        duration=400.0,
        seed=5,
        scenario=scenario("healthy", checkpoint_every=200.0, checkpoint_duration=(40.0, 40.0)),
    )
    cps = [lab for lab in sim.labels() if lab["condition"] == "checkpoint"]
    assert cps
    cp = cps[0]
    a, b = cp["onset"] - sim.start_ts, cp["end"] - sim.start_ts
    idle_by_t: dict[float, list[bool]] = defaultdict(list)
    nccl_ts = set()
    for batch in sim.batches():
        for r in batch:
            t = r["ts"] - sim.start_ts
            if r["kind"] == "dcgm":
                f = r["fields"]
                idle = bool(f[P + "CLOCK_THROTTLE_REASONS"] & GPU_IDLE)
                idle_by_t[t].append(idle)
                if idle:
                    assert f[P + "GPU_UTIL"] == 0
                    assert f[P + "SM_CLOCK"] == 345
                    assert 80 <= f[P + "POWER_USAGE"] <= 130
                    assert f["DCGM_FI_PROF_SM_ACTIVE"] < 0.02
            else:
                nccl_ts.add(t)
    for t, flags in idle_by_t.items():
        inside = any(lab["onset"] - sim.start_ts - 1e-6 <= t < lab["end"] - sim.start_ts - 1e-6 for lab in cps)
        assert all(flags) if inside else not any(flags), t  # all GPUs together, never alone
    # No NCCL interval whose steps (t-5 .. t-1) all lay inside the pause reports anything.
    for t in nccl_ts:
        assert not (a - 1e-6 <= t - 5.0 and t - 1.0 < b - 1e-6), t
    assert any(t > b for t in nccl_ts) and any(t < a for t in nccl_ts)


def test_temperature_is_a_lag_of_power():
    # After a checkpoint starts the core cools over tens of seconds, not in one step.
    sim = Simulator(
        hosts=1,
        duration=300.0,
        seed=5,
        scenario=scenario("healthy", checkpoint_every=150.0, checkpoint_duration=(80.0, 80.0)),
    )
    cp = next(lab for lab in sim.labels() if lab["condition"] == "checkpoint")
    a = cp["onset"] - sim.start_ts
    dc, _ = series(sim)
    rows = dc[("gpu-node-000", 0)]
    before = [f[P + "GPU_TEMP"] for t, f in rows if a - 10 <= t < a]
    after5 = [f[P + "GPU_TEMP"] for t, f in rows if a + 3 <= t < a + 6]
    after60 = [f[P + "GPU_TEMP"] for t, f in rows if a + 55 <= t < a + 60]
    drop_total = np.mean(before) - np.mean(after60)
    drop_early = np.mean(before) - np.mean(after5)
    assert drop_total > 15
    assert 0 < drop_early < 0.5 * drop_total


def test_diurnal_cycle_peaks_in_the_afternoon():
    def mean_temp(start_ts: float) -> float:
        sim = Simulator(
            hosts=2, duration=60.0, seed=3, start_ts=start_ts, scenario=scenario("healthy", checkpoint_every=None)
        )
        return float(np.mean([f[P + "GPU_TEMP"] for rows in series(sim)[0].values() for _, f in rows]))

    day = 1764374400.0  # 2025-11-29 00:00 UTC
    assert mean_temp(day + 15 * 3600) - mean_temp(day + 3 * 3600) > 3.5


def test_counters_monotonic_except_labelled_reloads():
    sc = scenario(
        "mixed",
        faults=list(load_scenario("mixed").faults)
        + [
            {"type": "driver_reload", "host": 1, "onset": "70%"},
        ],
    )
    sc.faults[-2] = dataclasses.replace(sc.faults[-2], duration="8%")  # gpu_lost comes back
    sim = Simulator(hosts=4, duration=600.0, seed=2, scenario=sc)
    labels = sim.labels()
    reloads = [lab for lab in labels if lab["condition"] == "driver_reload"]
    assert len(reloads) == 2 and any(lab["gpu"] is not None for lab in reloads)
    dc, _ = series(sim)
    resets_seen = 0
    for (host, gpu), rows in dc.items():
        prev: dict[str, int] = {}
        for t, f in rows:
            for name in VOLATILE_COUNTERS + PERSISTENT_COUNTERS:
                v = f.get(name)
                if v is None or v == BLANK_INT64:
                    continue
                if name in prev and v < prev[name]:
                    assert name in VOLATILE_COUNTERS, (host, gpu, name)
                    assert v == 0
                    ok = [
                        lab
                        for lab in reloads
                        if lab["host"] == host
                        and lab["gpu"] in (None, gpu)
                        and prev["_t"] < lab["onset"] - sim.start_ts + 1e-6 <= t + 1e-6
                    ]
                    assert ok, (host, gpu, name, t)
                    resets_seen += 1
                prev[name] = v
            prev["_t"] = t
    assert resets_seen > 0


def test_isolated_sbe_are_labelled_benign():
    sc = scenario("healthy", random={"sbe_per_gpu_day": 2000.0}, checkpoint_every=None)
    sim = Simulator(hosts=2, duration=300.0, seed=4, scenario=sc)
    iso = [lab for lab in sim.labels() if lab["condition"] == "ecc_sbe_isolated"]
    assert 5 <= len(iso) <= 200
    dc, _ = series(sim)
    total = 0
    for rows in dc.values():
        total += rows[-1][1][P + "ECC_SBE_VOL_TOTAL"] - rows[0][1][P + "ECC_SBE_VOL_TOTAL"]
    assert abs(total - len(iso)) <= 2 * 16  # those before the first sample are not in the diff


def test_healthy_has_no_throttle_bits_but_idle_or_power_cap():
    sim = Simulator(hosts=8, duration=1200.0, interval=2.0, seed=12, scenario=scenario("healthy"))
    seen = 0
    for r in sim.records():
        if r["kind"] == "dcgm":
            bits = r["fields"][P + "CLOCK_THROTTLE_REASONS"]
            assert bits & ~(GPU_IDLE | SW_POWER_CAP) == 0
            seen |= bits
            assert r["fields"][P + "XID_ERRORS"] == 0
    assert seen & GPU_IDLE  # a checkpoint happened


def test_afternoon_heat_raises_temps_without_thermal_bits():
    kw = dict(hosts=16, duration=1800.0, interval=5.0, seed=21, start_ts=1764374400.0 + 14 * 3600)
    hot = Simulator(scenario=scenario("afternoon_heat", checkpoint_every=None), **kw)
    base = Simulator(scenario=scenario("healthy", checkpoint_every=None), **kw)
    heat = next(lab for lab in hot.labels() if lab["condition"] == "afternoon_heat")
    assert heat["fault"] is None and heat["host"] is None
    assert not [lab for lab in hot.labels() if lab["fault"]]
    mid = (heat["onset"] + heat["end"]) / 2 - hot.start_ts

    def temps(sim):
        out, mx = [], 0
        for r in sim.records():
            if r["kind"] != "dcgm":
                continue
            f = r["fields"]
            assert f[P + "CLOCK_THROTTLE_REASONS"] & THERMAL == 0
            mx = max(mx, f[P + "GPU_TEMP"])
            if abs(r["ts"] - sim.start_ts - mid) < 120:
                out.append(f[P + "GPU_TEMP"])
        return float(np.mean(out)), mx

    t_hot, mx_hot = temps(hot)
    t_base, _ = temps(base)
    assert t_hot - t_base > 3.0
    assert mx_hot < 87


def test_power_cap_is_benign_and_visible():
    sim = Simulator(hosts=4, duration=600.0, seed=6, scenario=scenario("power_cap", checkpoint_every=None))
    caps = [lab for lab in sim.labels() if lab["condition"] == "power_cap"]
    assert len(caps) == 1 and caps[0]["fault"] is None and caps[0]["params"]["limit_w"] == 450.0
    assert not [lab for lab in sim.labels() if lab["fault"]]
    cap = caps[0]
    a, b = cap["onset"] - sim.start_ts, cap["end"] - sim.start_ts
    dc, _ = series(sim)
    for (host, _gpu), rows in dc.items():
        inside = [f for t, f in rows if a + 5 <= t < b]
        outside = [f for t, f in rows if t < a]
        if host == cap["host"]:
            assert all(f[P + "ENFORCED_POWER_LIMIT"] == 450.0 for f in inside)
            assert all(f[P + "CLOCK_THROTTLE_REASONS"] & SW_POWER_CAP for f in inside)
            assert all(f[P + "CLOCK_THROTTLE_REASONS"] & THERMAL == 0 for f in inside)
            assert all(440 <= f[P + "POWER_USAGE"] <= 450.0 for f in inside)
            assert 1500 <= statistics.median(f[P + "SM_CLOCK"] for f in inside) <= 1850
            assert inside[-1][P + "POWER_VIOLATION"] - inside[0][P + "POWER_VIOLATION"] > 0.8 * (b - a - 10) * 1e9
            assert all(f[P + "GPU_UTIL"] >= 90 for f in inside)
        else:
            assert all(f[P + "ENFORCED_POWER_LIMIT"] == 700.0 for f in inside + outside)
