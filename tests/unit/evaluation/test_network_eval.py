"""The network family through the default detector and the dcgm-health baseline (NVSentinel's NIC
thresholds): a congested fabric raises nothing, and each simulated network fault is found on its
host by the NIC port checks (docs/rules.md#nic-ports)."""

from __future__ import annotations

import pytest

from pipeline.evaluation.detectors import detectors
from pipeline.evaluation.run import run_detectors
from pipeline.scoring import match_faults
from producers.sim import Simulator
from producers.sim.scenarios import scenario_from_dict


def _firing(faults: list[dict], hosts: int = 4, duration: float = 900.0, seed: int = 5, det: str = "gpuwarden"):
    sc = scenario_from_dict({"sources": ["nic"], "checkpoint_every": 0, "faults": faults})
    sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=sc)
    dets = [d for d in detectors() if d.name == det]
    return sim, [a for a in run_detectors(dets, sim)[det] if a.state == "firing"]


def test_healthy_and_congested_fabric_stays_quiet():
    sim, alerts = _firing([{"type": "network_congestion", "onset": "20%", "duration": "60%"}])
    assert [lab["condition"] for lab in sim.labels() if lab["condition"] == "network_congestion"]
    assert [(a.rule, a.host, a.gpu) for a in alerts] == []


@pytest.mark.parametrize(
    ("ftype", "rule"),
    [
        ("network_link_flap", "network_port_flapping"),
        ("network_nic_down", "network_active_ports_low"),
        ("network_symbol_drift", "network_symbol_errors"),
    ],
)
def test_each_network_fault_is_found_on_its_host(ftype, rule):
    sim, alerts = _firing([{"type": ftype, "host": 2, "onset": "20%", "duration": "70%"}])
    (lab,) = [lab for lab in sim.labels() if lab["fault"]]
    (m,), unmatched = match_faults(sim.labels(), alerts)
    assert m.detected and m.alert.family == "network" and m.alert.host == sim.hosts[2]
    assert rule in {a.rule for a in alerts if a.host == sim.hosts[2]}
    assert f"mlx5_{lab['gpu']}" in {a.labels.get("device") for a in alerts if a.labels.get("device")}
    assert [a for a in unmatched if a.family == "network"] == []


def test_the_dcgm_health_baseline_runs_nvsentinels_nic_thresholds():
    # A flap: a port DOWN and link_downed rising are fatal to NVSentinel, the retraining before each
    # fall (link_error_recovery past 5 a minute) non-fatal; a quiet fleet stays quiet.
    sim, alerts = _firing([{"type": "network_link_flap", "host": 1, "onset": "20%", "duration": "60%"}],
                          duration=600.0, det="dcgm-health")  # fmt: skip
    (m,), unmatched = match_faults(sim.labels(), alerts)
    assert m.detected and m.alert.host == sim.hosts[1]
    assert {a.rule for a in alerts} <= {"network_port_down", "network_link_errors", "network_port_degraded",
                                        "network_link_error_recovery", "network_carrier_changes"}
    assert unmatched == []


@pytest.mark.parametrize("det", ["gpuwarden", "dcgm-health"])
def test_the_congestion_scenario_raises_no_network_alert(det):
    # The shipped benign case (producers/sim/scenarios.py "congestion") through the port checks,
    # NVSentinel's non-fatal rates and the lost-port check included.
    from producers.sim.scenarios import load_scenario

    sim = Simulator(hosts=4, duration=900.0, seed=7, scenario=load_scenario("congestion"))
    alerts = [a for a in run_detectors([d for d in detectors() if d.name == det], sim)[det] if a.state == "firing"]
    assert [(a.rule, a.host) for a in alerts if a.family == "network"] == []
