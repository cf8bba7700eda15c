"""The ``nic`` source: each host's InfiniBand ports as NIC records, and the ``network`` faults'
signatures on their port (and their knock-on on NCCL), in their window, and nowhere else."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from functools import lru_cache

import msgspec
import pytest

from pipeline.schema import NicRecord
from producers.sim import Simulator, load_scenario
from producers.sim.scenarios import scenario_from_dict

CLEAN = {"blank_rate": 0.0, "missing_rate": 0.0}


class NicRun:
    """A finished run's NIC records by port and DP communicator records, times from the start."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.labels = sim.labels()
        self.ports: dict[tuple[str, str], list[tuple[float, dict]]] = defaultdict(list)
        self.dp: dict[str, list[tuple[float, float]]] = defaultdict(list)  # comm -> (t, busbw)
        self.dcgm_ts: set[tuple[str, float]] = set()
        self.nic_ts: set[tuple[str, float]] = set()
        for r in sim.records():
            t = round(r["ts"] - sim.start_ts, 3)
            if r["kind"] == "nic":
                self.ports[(r["host"], r["device"])].append((t, r))
                self.nic_ts.add((r["host"], t))
            elif r["kind"] == "dcgm":
                self.dcgm_ts.add((r["host"], t))
            elif r["comm_name"].startswith("dp"):
                self.dp[r["comm_name"]].append((t, r["busbw_gbs"]))

    def label(self, fault: str) -> dict:
        return next(lab for lab in self.labels if lab["fault"] == fault or lab["condition"] == fault)

    def window(self, lab: dict) -> tuple[float, float]:
        return lab["onset"] - self.sim.start_ts, lab["end"] - self.sim.start_ts

    def port(self, host: str, device: str, t0: float = -1e9, t1: float = 1e9) -> list[dict]:
        return [r for t, r in self.ports[(host, device)] if t0 <= t < t1]

    def counter(self, host: str, device: str, name: str, t0: float = -1e9, t1: float = 1e9) -> list[int]:
        return [r["counters"][name] for r in self.port(host, device, t0, t1)]

    def busbw(self, comm: str, t0: float, t1: float) -> float:
        return statistics.median(bw for t, bw in self.dp[comm] if t0 <= t < t1)


@lru_cache(maxsize=None)
def run(name: str, seed: int = 1, hosts: int = 4, duration: float = 900.0) -> NicRun:
    sc = dataclasses.replace(load_scenario(name), checkpoint_every=None, data_quality=dict(CLEAN))
    return NicRun(Simulator(hosts=hosts, duration=duration, seed=seed, scenario=sc))


@lru_cache(maxsize=None)
def with_fault(ftype: str, seed: int = 2, duration: float = 1200.0, **params) -> NicRun:
    sc = scenario_from_dict(
        {
            "sources": ["nic"],
            "checkpoint_every": 0,
            "data_quality": CLEAN,
            "faults": [{"type": ftype, "onset": "20%", "duration": "60%", "params": params}],
        }
    )
    return NicRun(Simulator(hosts=4, duration=duration, seed=seed, scenario=sc))


def test_healthy_ports_are_eight_active_400g_ports_every_10s_with_quiet_counters():
    r = run("congestion", duration=600.0)
    sim = r.sim
    assert {h for h, _ in r.ports} == set(sim.hosts)
    for host in sim.hosts:
        devices = sorted(d for h, d in r.ports if h == host)
        assert devices == [f"mlx5_{p}" for p in range(8)]
    recs = r.port(sim.hosts[1], "mlx5_3")
    times = [t for t, _ in r.ports[(sim.hosts[1], "mlx5_3")]]
    assert all(b - a == pytest.approx(10.0) for a, b in zip(times, times[1:]))
    assert len(times) == 60
    for rec in recs:
        NicRecord(**{k: v for k, v in rec.items() if k != "kind"})  # the schema's own record
        assert (rec["state_name"], rec["phys_state_name"], rec["rate_gbps"]) == ("ACTIVE", "LinkUp", 400.0)
        assert rec["gpus"] == [3] and rec["link_layer"] == "InfiniBand"
    # Decodes as the pipeline's tagged record.
    assert isinstance(msgspec.json.decode(msgspec.json.encode(recs[0]), type=NicRecord), NicRecord)
    # NIC records never share a (host, ts) with DCGM records.
    assert r.nic_ts and not (r.nic_ts & r.dcgm_ts)
    for host, dev in r.ports:
        sym = r.counter(host, dev, "symbol_error")
        assert sym == sorted(sym) and sym[-1] - sym[0] < 120 * 600 / 3600  # well under the bound
        assert len(set(r.counter(host, dev, "link_downed"))) == 1 == len(set(r.counter(host, dev, "carrier_changes")))
        data = r.counter(host, dev, "port_xmit_data")
        assert data == sorted(data) and data[-1] > data[0]


def test_xmit_wait_grows_with_load_and_surges_under_congestion():
    r = run("congestion", duration=900.0)
    lab = r.label("network_congestion")
    a, b = r.window(lab)
    assert lab["fault"] is None and lab["family"] is None
    host = r.sim.hosts[0]

    def wait_rate(t0: float, t1: float) -> float:
        w = r.counter(host, "mlx5_0", "port_xmit_wait", t0, t1)
        return (w[-1] - w[0]) / (t1 - t0)

    before, during, after = wait_rate(0, a), wait_rate(a + 10, b), wait_rate(b + 10, 900)
    assert during > 10 * before and after < 2 * before and before > 0
    # The job's DP collectives slow a little, fleet-wide; no port goes down, no error counter moves.
    assert r.busbw("dp0", a + 30, b) < 0.95 * r.busbw("dp0", 0, a)
    assert r.busbw("dp0", a + 30, b) > 0.75 * r.busbw("dp0", 0, a)
    for host_dev, rows in r.ports.items():
        assert {row["state_name"] for _, row in rows} == {"ACTIVE"}
        assert len({row["counters"]["link_downed"] for _, row in rows}) == 1


def test_network_link_flap_signature():
    r = run("network", seed=3, duration=1200.0)
    lab = r.label("network_link_flap")
    h, dev = lab["host"], f"mlx5_{lab['gpu']}"
    a, b = r.window(lab)
    during = r.port(h, dev, a, b)
    states = [(x["state_name"], x["phys_state_name"]) for x in during]
    assert ("DOWN", "Polling") in states and ("ACTIVE", "LinkUp") in states
    # Down then ACTIVE again, as many times as it flapped.
    falls = sum(1 for x, y in zip(states, states[1:]) if x[0] == "ACTIVE" and y[0] == "DOWN")
    assert falls == lab["params"]["flaps"] - (states[0][0] == "DOWN")
    downed = r.counter(h, dev, "link_downed")
    assert downed[0] == 0 and downed[-1] == lab["params"]["flaps"]
    cc = r.counter(h, dev, "carrier_changes")
    assert cc[-1] - cc[0] == 2 * lab["params"]["flaps"]
    assert {x["state_name"] for x in r.port(h, dev, b + 1)} == {"ACTIVE"}
    # Only that port: every other port of the fleet stays up.
    for (host, d), rows in r.ports.items():
        if (host, d) != (h, dev):
            assert {row["state_name"] for _, row in rows} == {"ACTIVE"}
    # Its GPU's DP communicator slows while the link is down (a fifth of the window here).
    comm = f"dp{lab['gpu']}"
    assert min(bw for t, bw in r.dp[comm] if a <= t < b) < 0.7 * r.busbw(comm, 0, a)
    assert min(bw for t, bw in r.dp[comm] if b + 10 <= t) > 0.85 * r.busbw(comm, 0, a)


def test_network_nic_down_signature():
    r = with_fault("network_nic_down")
    lab = r.label("network_nic_down")
    h, dev = lab["host"], f"mlx5_{lab['gpu']}"
    a, b = r.window(lab)
    assert {(x["state_name"], x["phys_state_name"]) for x in r.port(h, dev, a + 1, b)} == {("DOWN", "Disabled")}
    assert {x["state_name"] for x in r.port(h, dev, -1e9, a)} == {"ACTIVE"}
    assert r.counter(h, dev, "link_downed", a + 1, b)[0] == 1
    comm = f"dp{lab['gpu']}"
    assert r.busbw(comm, a + 10, b) < 0.7 * r.busbw(comm, 0, a)
    assert r.busbw("dp" + str((lab["gpu"] + 1) % 8), a + 10, b) > 0.85 * r.busbw("dp" + str((lab["gpu"] + 1) % 8), 0, a)


def test_network_symbol_drift_signature():
    r = with_fault("network_symbol_drift")
    lab = r.label("network_symbol_drift")
    h, dev = lab["host"], f"mlx5_{lab['gpu']}"
    a, b = r.window(lab)
    sym_before = r.counter(h, dev, "symbol_error", 0, a)
    sym_during = r.counter(h, dev, "symbol_error", a, b)
    hours = (b - a) / 3600.0
    assert sym_before[-1] - sym_before[0] < 120 * a / 3600.0
    assert sym_during[-1] - sym_during[0] > 120 * hours * 3  # far past the IBTA bound
    assert {x["state_name"] for x in r.port(h, dev)} == {"ACTIVE"}
    assert len(set(r.counter(h, dev, "link_downed"))) == 1


def test_nic_records_only_with_the_nic_source():
    plain = run("mixed", duration=300.0)
    assert not plain.ports
    with pytest.raises(ValueError, match=r"faults\[0\]\.type: network_link_flap .*sources: \[nic\]"):
        scenario_from_dict({"faults": [{"type": "network_link_flap"}]})
    with pytest.raises(ValueError, match="network_congestion is fleet-wide"):
        scenario_from_dict({"sources": ["nic"], "faults": [{"type": "network_congestion", "host": 1}]})


def test_a_hidden_host_sends_no_nic_records():
    sc = scenario_from_dict(
        {"sources": ["nic"], "faults": [{"type": "telemetry_gap", "host": 1, "onset": 100, "duration": 100}]}
    )
    r = NicRun(Simulator(hosts=2, duration=300.0, seed=1, scenario=sc))
    host = r.sim.hosts[1]
    times = [t for t, _ in r.ports[(host, "mlx5_0")]]
    assert not [t for t in times if 101 <= t < 199] and [t for t in times if t >= 200]
