"""Each injected fault shows its signature, in its window, on its culprit -- and not elsewhere."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from functools import lru_cache

import pytest

from producers.sim import FAULT_TYPES, Simulator, load_scenario
from producers.sim.faults import TYPES
from producers.sim.fields import HW_SLOWDOWN, HW_THERMAL, SW_THERMAL

P = "DCGM_FI_DEV_"
THERMAL = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN
CLEAN = {"blank_rate": 0.0, "missing_rate": 0.0}


class Run:
    """A finished simulation, indexed for assertions (times relative to the start)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.labels = sim.labels()
        self.dc: dict[tuple[str, int], list[tuple[float, dict]]] = defaultdict(list)
        self.nc: dict[tuple[str, int], list[tuple[float, dict]]] = defaultdict(list)  # (comm, rank)
        self.progress: list[tuple[float, dict]] = []  # the progress source's records
        self.host_ts: dict[str, set[float]] = defaultdict(set)
        for r in sim.records():
            t = round(r["ts"] - sim.start_ts, 3)
            self.host_ts[r["host"]].add(t)
            if r["kind"] == "dcgm":
                self.dc[(r["host"], r["gpu"])].append((t, r["fields"]))
            elif r["kind"] == "progress":
                self.progress.append((t, r))
            else:
                self.nc[(r["comm_name"], r["rank"])].append((t, r))

    def label(self, fault: str) -> dict:
        return next(lab for lab in self.labels if lab["fault"] == fault)

    def window(self, lab: dict) -> tuple[float, float]:
        return lab["onset"] - self.sim.start_ts, lab["end"] - self.sim.start_ts

    def field(self, host: str, gpu: int, name: str, t0: float = -1e9, t1: float = 1e9) -> list:
        return [f[name] for t, f in self.dc[(host, gpu)] if t0 <= t < t1]

    def comm(self, name: str, rank: int, key: str, t0: float = -1e9, t1: float = 1e9) -> list:
        return [r[key] for t, r in self.nc[(name, rank)] if t0 <= t < t1]

    def comm_median(self, name: str, key: str, t0: float, t1: float) -> float:
        vals = [r[key] for (c, _rank), rows in self.nc.items() if c == name for t, r in rows if t0 <= t < t1]
        return statistics.median(vals)

    def host_index(self, host: str) -> int:
        return self.sim.hosts.index(host)


@lru_cache(maxsize=None)
def mixed(seed: int = 1, hosts: int = 4, duration: float = 900.0) -> Run:
    sc = dataclasses.replace(load_scenario("mixed"), checkpoint_every=None, data_quality=dict(CLEAN))
    return Run(Simulator(hosts=hosts, duration=duration, seed=seed, scenario=sc))


@lru_cache(maxsize=None)
def single(name: str, seed: int = 1, hosts: int = 4, duration: float = 900.0, **params) -> Run:
    sc = dataclasses.replace(load_scenario(name), checkpoint_every=None, data_quality=dict(CLEAN))
    if params:
        sc.faults = [dataclasses.replace(sc.faults[0], params={**sc.faults[0].params, **params})]
    return Run(Simulator(hosts=hosts, duration=duration, seed=seed, scenario=sc))


def test_mixed_has_every_fault_type_on_distinct_places():
    run = mixed()
    faults = [lab for lab in run.labels if lab["fault"]]
    # Every fault type dcgm-exporter's fields show; the others need their source (pcie, nvswitch).
    assert sorted(lab["fault"] for lab in faults) == sorted(f for f in FAULT_TYPES if TYPES[f].source is None)
    places = [(lab["host"], lab["gpu"]) for lab in faults if lab["gpu"] is not None]
    assert len(places) == len(set(places))
    assert len({lab["host"] for lab in faults}) == 4
    onsets = sorted(lab["onset"] for lab in faults)
    assert len(set(onsets)) == len(onsets)
    # With 8+ hosts every fault gets its own host.
    sim8 = Simulator(hosts=8, duration=600.0, seed=1, scenario="mixed")
    assert len({lab["host"] for lab in sim8.labels() if lab["fault"]}) == 8
    # With fewer hosts, hosts are reused but GPUs stay distinct.
    for h in (1, 2, 3):
        labs = [lab for lab in Simulator(hosts=h, duration=600.0, seed=1, scenario="mixed").labels() if lab["fault"]]
        assert len(labs) == 8
        places = [(lab["host"], lab["gpu"]) for lab in labs if lab["gpu"] is not None]
        assert len(places) == len(set(places))


@pytest.mark.parametrize("source", ["mixed", "single"])
def test_thermal_throttling_signature(source):
    run = mixed() if source == "mixed" else single("thermal", seed=3)
    lab = run.label("thermal_throttling")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    hot_from = a + lab["params"]["ramp_s"] + 60
    rows = [f for t, f in run.dc[(h, g)] if hot_from <= t < b]
    assert len(rows) > 60
    throttled = [
        f
        for f in rows
        if f[P + "CLOCK_THROTTLE_REASONS"] & (SW_THERMAL | HW_THERMAL)
        and f[P + "GPU_UTIL"] >= 90
        and f[P + "SM_CLOCK"] <= 1300
    ]
    assert len(throttled) > 0.6 * len(rows)
    assert any(
        f[P + "CLOCK_THROTTLE_REASONS"] & HW_THERMAL and f[P + "CLOCK_THROTTLE_REASONS"] & HW_SLOWDOWN for f in rows
    )
    assert max(f[P + "GPU_TEMP"] for f in rows) >= 88
    assert 86 <= statistics.median(f[P + "GPU_TEMP"] for f in rows) <= 92
    viol = run.field(h, g, P + "THERMAL_VIOLATION")
    assert rows[-1][P + "THERMAL_VIOLATION"] - rows[0][P + "THERMAL_VIOLATION"] > 0.5 * (b - hot_from) * 1e9
    assert viol == sorted(viol)
    # None before onset, recovered two minutes after the end, peers never.
    assert all(x & THERMAL == 0 for x in run.field(h, g, P + "CLOCK_THROTTLE_REASONS", 0, a))
    if b + 150 < run.sim.duration:
        after = run.field(h, g, P + "CLOCK_THROTTLE_REASONS", b + 120, b + 150)
        assert after and all(x & THERMAL == 0 for x in after)
        assert statistics.median(run.field(h, g, P + "SM_CLOCK", b + 120, b + 150)) == 1980
    for peer in range(8):
        if peer != g and (h, peer) not in {(x["host"], x["gpu"]) for x in run.labels if x["fault"]}:
            assert all(x & THERMAL == 0 for x in run.field(h, peer, P + "CLOCK_THROTTLE_REASONS"))


@pytest.mark.parametrize("source", ["mixed", "single"])
def test_thermal_hbm_throttling_signature(source):
    run = mixed() if source == "mixed" else single("thermal_hbm", seed=4)
    lab = run.label("thermal_hbm_throttling")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    rows = [f for t, f in run.dc[(h, g)] if a + lab["params"]["ramp_s"] + 60 <= t < b]
    assert rows
    assert max(f[P + "MEMORY_TEMP"] for f in rows) >= 95
    assert statistics.median(f[P + "MEMORY_TEMP"] for f in rows) >= 94
    assert max(f[P + "GPU_TEMP"] for f in rows) < 87  # core looks normal
    assert sum(bool(f[P + "CLOCK_THROTTLE_REASONS"] & SW_THERMAL) for f in rows) > 0.8 * len(rows)
    assert not any(f[P + "CLOCK_THROTTLE_REASONS"] & HW_THERMAL for f in rows)
    assert 1200 <= statistics.median(f[P + "SM_CLOCK"] for f in rows) <= 1850  # moderately down
    assert statistics.median(f[P + "GPU_UTIL"] for f in rows) >= 95


@pytest.mark.parametrize("escalate,seed", [(True, 1), (False, 2)])
def test_hbm_ecc_burst_signature(escalate, seed):
    run = single("hbm", seed=seed, escalate=escalate)
    lab = run.label("hbm_ecc_burst")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    p = lab["params"]
    assert p["escalate"] is escalate and 40 <= p["sbe_per_min"] <= 300
    sbe = dict((t, f[P + "ECC_SBE_VOL_TOTAL"]) for t, f in run.dc[(h, g)])
    agg = dict((t, f[P + "ECC_SBE_AGG_TOTAL"]) for t, f in run.dc[(h, g)])
    mid = a + 0.5 * (b - a)
    per_min = sbe[mid + 60] - sbe[mid]
    assert per_min >= 10 and per_min >= 0.5 * p["sbe_per_min"]  # tens to hundreds a minute
    assert agg[mid + 60] - agg[mid] == per_min
    assert sbe[a - 1] == 0 or sbe[a - 1] <= 2  # quiet before (isolated SBEs aside)
    xids = [x for x in run.field(h, g, P + "XID_ERRORS", a, 1e9)]
    seq = [x for i, x in enumerate(xids) if x and (i == 0 or xids[i - 1] != x)]
    if p["xid92"]:
        assert seq[0] == 92
    assert 63 in seq
    remap_t = a + p["remap_at"] * (b - a)
    pending = run.field(h, g, P + "ROW_REMAP_PENDING", remap_t + 1, 1e9)
    assert pending and all(x == 1 for x in pending)
    rows = run.field(h, g, P + "CORRECTABLE_REMAPPED_ROWS")
    assert rows[-1] > rows[0]
    dbe = run.field(h, g, P + "ECC_DBE_VOL_TOTAL")
    if escalate:
        assert dbe[-1] - dbe[0] == 1
        i48 = seq.index(48)
        assert seq[i48 + 1] in (94, 95) and seq[i48 + 1] == (94 if p["contained"] else 95)
        assert (
            run.field(h, g, P + "UNCORRECTABLE_REMAPPED_ROWS")[-1]
            > run.field(h, g, P + "UNCORRECTABLE_REMAPPED_ROWS")[0]
        )
    else:
        assert dbe[-1] == dbe[0] and 48 not in seq
    # SBE burst ends with the window.
    if b + 60 < run.sim.duration:
        assert sbe[b + 60] - sbe[b + 1] <= 2


def test_sram_variant_skips_remap():
    sc = dataclasses.replace(load_scenario("hbm"), checkpoint_every=None, data_quality=dict(CLEAN))
    sc.faults = [dataclasses.replace(sc.faults[0], params={"memory": "sram"})]
    run = Run(Simulator(hosts=2, duration=600.0, seed=5, scenario=sc))
    lab = run.label("hbm_ecc_burst")
    assert lab["params"]["escalate"] is True
    xids = set(run.field(lab["host"], lab["gpu"], P + "XID_ERRORS"))
    assert 48 in xids and 63 not in xids
    assert run.field(lab["host"], lab["gpu"], P + "ROW_REMAP_PENDING")[-1] == 0


@pytest.mark.parametrize("source", ["mixed", "single"])
def test_nvlink_degradation_signature(source):
    run = mixed() if source == "mixed" else single("nvlink", seed=6)
    lab = run.label("nvlink_degradation")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    assert lab["link"] is not None and 0 <= lab["link"] < 18
    ramp = lab["params"]["ramp_s"]
    crc = dict((t, f[P + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]) for t, f in run.dc[(h, g)])
    t_early, t_late = round(a + 0.1 * ramp), round(a + 0.9 * ramp)
    early = (crc[t_early + 30] - crc[t_early]) / 30
    late = (crc[t_late + 30] - crc[t_late]) / 30
    assert late > 50 and late > 20 * max(early, 0.1)  # accelerating, hundreds/s late
    replay = run.field(h, g, P + "NVLINK_REPLAY_ERROR_COUNT_TOTAL")
    data = run.field(h, g, P + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")
    assert replay[-1] > replay[0] and data[-1] > data[0]
    # TP busbw of that host sags; other hosts' do not.
    tp = f"tp{run.host_index(h)}"
    before = run.comm_median(tp, "busbw_gbs", 0, a)
    late_bw = run.comm_median(tp, "busbw_gbs", a + 0.8 * ramp, b)
    assert late_bw < 0.85 * before
    bw = [f[P + "NVLINK_BANDWIDTH_TOTAL"] for t, f in run.dc[(h, g)]]
    assert statistics.median(
        run.field(h, g, P + "NVLINK_BANDWIDTH_TOTAL", a + 0.8 * ramp, b)
    ) < 0.85 * statistics.median(run.field(h, g, P + "NVLINK_BANDWIDTH_TOTAL", 0, a))
    assert bw
    busy = {
        x["host"]
        for x in run.labels
        if x["fault"] and x is not lab and x["onset"] < lab["end"] and x["end"] > lab["onset"]
    }
    for other in run.sim.hosts:
        if other == h or other in busy:
            continue
        name = f"tp{run.host_index(other)}"
        assert run.comm_median(name, "busbw_gbs", a + 0.8 * ramp, b) > 0.95 * run.comm_median(name, "busbw_gbs", 0, a)
        for peer in range(8):
            assert run.field(other, peer, P + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")[-1] == 0


@pytest.mark.parametrize("source", ["mixed", "single"])
def test_nvlink_link_down_signature(source):
    run = mixed() if source == "mixed" else single("nvlink_down", seed=7)
    lab = run.label("nvlink_link_down")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    xids = run.field(h, g, P + "XID_ERRORS", a, a + 2)
    assert xids and xids[0] == 74
    assert 0 not in run.field(h, g, P + "XID_ERRORS", a, b)
    rec = dict((t, f[P + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL"]) for t, f in run.dc[(h, g)])
    crc = dict((t, f[P + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]) for t, f in run.dc[(h, g)])
    assert rec[a + 10] - rec[a - 1] >= 1
    assert crc[a + 60] - crc[a - 1] > 500  # a burst
    tp = f"tp{run.host_index(h)}"
    before = run.comm_median(tp, "busbw_gbs", 0, a)
    during = run.comm_median(tp, "busbw_gbs", a + 5, b)
    assert during < 0.6 * before  # collapsed from onset
    if b + 30 < run.sim.duration:
        assert run.comm_median(tp, "busbw_gbs", b + 5, b + 30) > 0.9 * before


@pytest.mark.parametrize("source,mode", [("mixed", "stall"), ("single", "stall"), ("single", "clock")])
def test_nccl_straggler_signature(source, mode):
    run = mixed() if source == "mixed" else single("straggler", seed=8, mode=mode)
    lab = run.label("nccl_straggler")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    hi = run.host_index(h)
    tp, dp = f"tp{hi}", f"dp{g}"
    s0, s1 = a + 10, b
    # TP: the other ranks wait for the straggler; the comm's busbw falls.
    own = statistics.median(run.comm(tp, g, "exec_time_us", s0, s1))
    others = [statistics.median(run.comm(tp, r, "exec_time_us", s0, s1)) for r in range(8) if r != g]
    assert min(others) > 1.3 * own
    assert run.comm_median(tp, "busbw_gbs", s0, s1) < 0.85 * run.comm_median(tp, "busbw_gbs", 0, a)
    # DP communicator of that GPU index: other hosts' ranks wait too.
    own_dp = statistics.median(run.comm(dp, hi, "exec_time_us", s0, s1))
    others_dp = [
        statistics.median(run.comm(dp, r, "exec_time_us", s0, s1))
        for r in range(len(run.sim.hosts))
        if r != hi and run.comm(dp, r, "exec_time_us", s0, s1)
    ]
    assert others_dp and min(others_dp) > 1.3 * own_dp
    # Communicators without the straggler are untouched.
    busy_hosts = {
        x["host"]
        for x in run.labels
        if x["fault"] and x is not lab and x["onset"] < lab["end"] and x["end"] > lab["onset"]
    }
    busy_gpus = {
        x["gpu"]
        for x in run.labels
        if x["fault"] and x is not lab and x["onset"] < lab["end"] and x["end"] > lab["onset"]
    }
    other_g = next(x for x in range(8) if x != g and x not in busy_gpus)
    name = f"dp{other_g}"
    assert run.comm_median(name, "busbw_gbs", s0, s1) > 0.9 * run.comm_median(name, "busbw_gbs", 0, a)
    for other in run.sim.hosts:
        if other != h and other not in busy_hosts:
            name = f"tp{run.host_index(other)}"
            assert run.comm_median(name, "busbw_gbs", s0, s1) > 0.95 * run.comm_median(name, "busbw_gbs", 0, a)
    # DCGM: the straggler shows lower power (and lower SM activity when stalled), no bits.
    peers = [x for x in range(8) if x != g]
    pw = statistics.median(run.field(h, g, P + "POWER_USAGE", s0, s1))
    pw_peers = statistics.median(v for x in peers for v in run.field(h, x, P + "POWER_USAGE", s0, s1))
    assert pw < 0.9 * pw_peers
    sm = statistics.median(run.field(h, g, "DCGM_FI_PROF_SM_ACTIVE", s0, s1))
    sm_peers = statistics.median(v for x in peers for v in run.field(h, x, "DCGM_FI_PROF_SM_ACTIVE", s0, s1))
    if lab["params"]["mode"] == "stall":
        assert sm < 0.85 * sm_peers
    else:
        assert statistics.median(run.field(h, g, P + "SM_CLOCK", s0, s1)) < 1500
    assert all(x & THERMAL == 0 for x in run.field(h, g, P + "CLOCK_THROTTLE_REASONS"))


@pytest.mark.parametrize("source", ["mixed", "single"])
def test_gpu_lost_signature(source):
    run = mixed() if source == "mixed" else single("gpu_lost", seed=9)
    lab = run.label("gpu_lost")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    n_xid = lab["params"]["xid_samples"]
    rows = run.dc[(h, g)]
    last_t, last = rows[-1]
    assert last[P + "XID_ERRORS"] == 79
    assert [f[P + "XID_ERRORS"] for t, f in rows if t >= a] == [79] * n_xid
    assert last_t < a + n_xid
    # The host keeps reporting its other GPUs after the loss.
    for peer in range(8):
        if peer != g:
            assert max(t for t, _ in run.dc[(h, peer)]) >= run.sim.duration - 2
    # Its NCCL ranks stop at onset.
    hi = run.host_index(h)
    assert max(t for t, _ in run.nc[(f"tp{hi}", g)]) <= a
    assert max(t for t, _ in run.nc[(f"dp{g}", hi)]) <= a
    assert max(t for t, _ in run.nc[(f"tp{hi}", (g + 1) % 8)]) > a + 30


def test_gpu_lost_gsp_variant_and_return():
    sc = dataclasses.replace(load_scenario("gpu_lost"), checkpoint_every=None, data_quality=dict(CLEAN))
    sc.faults = [dataclasses.replace(sc.faults[0], duration="20%", params={"xid": 119})]
    run = Run(Simulator(hosts=2, duration=600.0, seed=10, scenario=sc))
    lab = run.label("gpu_lost")
    a, b = run.window(lab)
    h, g = lab["host"], lab["gpu"]
    assert run.field(h, g, P + "XID_ERRORS", a, a + 1) == [119]
    assert not run.field(h, g, P + "GPU_TEMP", a + 3, b)
    back = run.field(h, g, P + "XID_ERRORS", b, 1e9)
    assert back and all(x == 0 for x in back)  # came back reset
    reload = [x for x in run.labels if x["condition"] == "driver_reload"]
    assert reload and reload[0]["host"] == h and reload[0]["gpu"] == g and reload[0]["onset"] == lab["end"]


@pytest.mark.parametrize("source", ["mixed", "single"])
def test_telemetry_gap_signature(source):
    run = mixed() if source == "mixed" else single("telemetry_gap", seed=11)
    lab = run.label("telemetry_gap")
    h = lab["host"]
    a, b = run.window(lab)
    assert lab["gpu"] is None
    ts = run.host_ts[h]
    assert not [t for t in ts if a <= t < b]
    assert any(t < a for t in ts) and any(t >= b for t in ts)
    for other in run.sim.hosts:
        if other != h:
            assert len([t for t in run.host_ts[other] if a <= t < b]) >= (b - a) - 1


A = "GPUWARDEN_PCIE_AER_"


def test_pcie_aer_fatal_signature():
    run = single("pcie", seed=4)
    lab = run.label("pcie_aer_fatal")
    h, g = lab["host"], lab["gpu"]
    a, b = run.window(lab)
    up = run.field(h, g, A + "UPSTREAM_FATAL")
    assert set(run.field(h, g, A + "UPSTREAM_FATAL", -1e9, a)) == {0} and set(
        run.field(h, g, A + "UPSTREAM_FATAL", a + 1)
    ) == {1}
    assert len(up) == len(run.dc[(h, g)])  # on every record of the GPU, as the producer sends it
    assert run.field(h, g, A + "DEV_NONFATAL", a + 1, a + 2) == [2]
    cor = run.field(h, g, A + "DEV_CORRECTABLE")
    assert cor == sorted(cor) and cor[-1] - cor[0] > 100  # a corrected-error storm while it lasts
    # The GPU stays on the bus; no other GPU's AER totals move.
    assert max(t for t, _ in run.dc[(h, g)]) >= run.sim.duration - 2
    for (host, gpu), rows in run.dc.items():
        if (host, gpu) != (h, g):
            assert len({f[A + "UPSTREAM_FATAL"] for _, f in rows}) == 1


def test_nvswitch_fatal_signature():
    run = single("nvswitch", seed=4)
    lab = run.label("nvswitch_fatal")
    h = lab["host"]
    a, b = run.window(lab)
    for g in range(8):
        assert set(run.field(h, g, P + "NVSWITCH_FATAL_ERRORS", -1e9, a)) == {0}
        assert set(run.field(h, g, P + "NVSWITCH_FATAL_ERRORS", a + 1, b)) == {20034}
    before = statistics.median(run.field(h, 0, P + "NVLINK_BANDWIDTH_TOTAL", a - 120, a))
    during = statistics.median(run.field(h, 0, P + "NVLINK_BANDWIDTH_TOTAL", a + 10, b))
    assert during < 0.6 * before
    others = {host for host, _ in run.dc if host != h}
    assert all(set(run.field(o, 0, P + "NVSWITCH_FATAL_ERRORS")) == {0} for o in others)


def test_hang_collective_signature():
    run = single("hang", seed=4, duration=1200.0)
    lab = run.label("hang_collective")
    h, g, hi = lab["host"], lab["gpu"], run.host_index(lab["host"])
    a, b = run.window(lab)
    timeout = lab["params"]["timeout_ms"] / 1000.0
    assert timeout < b - a  # the run sees the watchdog fire
    ras = [(t, r) for t, r in run.progress if r["source"] == "ras"]
    # RAS is polled every 30 s: every rank of every communicator (tp<h>: 8 GPUs, dp<g>: 4 hosts).
    assert sorted({t for t, _ in ras})[:3] == [30.0, 60.0, 90.0]
    assert len([r for t, r in ras if t == 30.0]) == 4 * 8 * 2
    by_comm: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for t, r in ras:
        by_comm[(t, r["comm"])].append(r)
    mine = {r["comm"] for _, r in ras if r["host"] == h and r["gpu"] == g}
    assert len(mine) == 2  # its TP and its DP communicator
    for (t, comm), rows in by_comm.items():
        counts = {r["rank"]: r["last_enqueued"] for r in rows}
        culprit = next((r for r in rows if r["host"] == h and r["gpu"] == g), None)
        if a <= t < b and comm in mine:
            # Stuck one operation behind its peers, which wait in the next collective.
            assert culprit is not None and culprit["state"] == "lagging"
            assert {c for k, c in counts.items() if k != culprit["rank"]} == {culprit["last_enqueued"] + 1}
            assert [r["state"] for r in rows].count("lagging") == 1
        else:
            assert len(set(counts.values())) == 1 and {r["state"] for r in rows} == {"progress"}
    # Nothing moves during the hang; counts go on afterwards, never backwards.
    for comm in mine:
        seen = [(t, r["last_enqueued"]) for t, r in ras if r["comm"] == comm and r["host"] == h and r["gpu"] == g]
        assert len({c for t, c in seen if a <= t < b}) == 1
        assert [c for _, c in seen] == sorted(c for _, c in seen)
        assert max(c for t, c in seen if t >= b + 30) > max(c for t, c in seen if t < b)
    # The job's NCCL records stop for the hang, everywhere.
    nccl = [t for rows in run.nc.values() for t, _ in rows]
    assert not [t for t in nccl if a + 5 < t < b] and [t for t in nccl if t > b + 5]
    # Every rank of its two communicators reports a watchdog timeout once, naming what it waited on.
    wd = [(t, r) for t, r in run.progress if r["source"] == "watchdog"]
    assert {t for t, _ in wd} == {a + timeout}
    assert len(wd) == 8 + 4 and {r["comm_name"] for _, r in wd} == {f"tp{hi}", f"dp{g}"}
    for _, r in wd:
        assert (
            r["state"] == "timeout" and r["timeout_ms"] == lab["params"]["timeout_ms"] and r["ran_ms"] > r["timeout_ms"]
        )
        assert r["seq"] == r["last_enqueued"] == r["last_completed"] + 1
    for name in (f"tp{hi}", f"dp{g}"):
        rows = {(r["host"], r["gpu"]): r for _, r in wd if r["comm_name"] == name}
        peers = {r["last_completed"] for k, r in rows.items() if k != (h, g)}
        assert peers == {rows[(h, g)]["last_completed"] + 1}


def test_progress_records_only_when_the_scenario_runs_the_source():
    assert single("gpu_lost", seed=9).progress == []
    sc = dataclasses.replace(load_scenario("healthy"), sources=["progress"], data_quality=dict(CLEAN))
    run = Run(Simulator(hosts=2, duration=120.0, seed=9, scenario=sc))
    assert {r["source"] for _, r in run.progress} == {"ras"}  # no timeout without a hang


@pytest.mark.parametrize("delivery", [{}, {"phase": True, "jitter_s": 0.5}])
def test_the_progress_source_adds_its_records_and_changes_nothing_else(delivery):
    base = dataclasses.replace(load_scenario("healthy"), checkpoint_every=120.0, delivery=delivery)
    without = list(Simulator(hosts=3, duration=300.0, seed=5, scenario=base).records())
    sim = Simulator(hosts=3, duration=300.0, seed=5, scenario=dataclasses.replace(base, sources=["progress"]))
    recs = list(sim.records())
    assert [r for r in recs if r["kind"] != "progress"] == without
    # Every rank of 3 TP and 8 DP communicators, polled at 30, 60, ... 270 s.
    assert len(recs) - len(without) == 9 * 3 * 8 * 2


@pytest.mark.parametrize("bad", [0, -5, True, "2m", 1e12])
def test_a_hang_timeout_that_is_not_milliseconds_is_refused(bad):
    from producers.sim.scenarios import scenario_from_dict

    # The scenario's checks refuse what is not a positive number; the fault's, a timeout out of range.
    with pytest.raises(ValueError, match=r"faults\[0\]\.params\.timeout_ms: "):
        fault = {"type": "hang_collective", "params": {"timeout_ms": bad}}
        Simulator(hosts=2, duration=600.0, scenario=scenario_from_dict({"sources": ["progress"], "faults": [fault]}))


def test_a_hung_rank_is_named_by_the_hang_detector():
    from pipeline.hang import HangDetector
    from pipeline.schema import ProgressRecord
    import msgspec

    run = single("hang", seed=4, duration=1200.0)
    lab = run.label("hang_collective")
    a, _ = run.window(lab)
    det = HangDetector()
    recs = [msgspec.convert({k: v for k, v in r.items() if k != "kind"}, ProgressRecord) for _, r in run.progress]
    alerts = [x for x in det.observe(recs) + det.advance(float("inf")) if x.state == "firing"]
    # One alert for the hang, naming the hung rank only; the hung communicators (RAS's and the
    # watchdog's view of each) are in its evidence.
    assert len(alerts) == 1
    (x,) = alerts
    assert (x.host, x.gpu) == (lab["host"], lab["gpu"])
    assert [(s["host"], s["gpu"]) for s in x.evidence["suspects"]] == [(lab["host"], lab["gpu"])]
    assert a < x.ts - run.sim.start_ts <= a + 120 + 30 + 30
    assert x.evidence["communicators_total"] == 4  # the two comms as RAS and the watchdog name them


def test_records_carry_a_source_only_when_the_scenario_runs_it():
    plain = single("gpu_lost", seed=9)
    rows = next(iter(plain.dc.values()))
    assert not any(k.startswith(A) or "NVSWITCH" in k for k in rows[0][1])


def test_a_fault_whose_source_the_scenario_does_not_run_is_refused():
    from producers.sim.scenarios import scenario_from_dict

    with pytest.raises(ValueError, match=r"faults\[0\]\.type: pcie_aer_fatal .*sources: \[pcie_aer\]"):
        scenario_from_dict({"faults": [{"type": "pcie_aer_fatal"}]})
    with pytest.raises(ValueError, match="sources"):
        scenario_from_dict({"sources": ["infiniband"]})
    assert scenario_from_dict({"sources": ["nvswitch"], "faults": [{"type": "nvswitch_fatal"}]}).sources == ["nvswitch"]
