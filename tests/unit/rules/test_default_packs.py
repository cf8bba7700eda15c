"""The default rule packs against the simulator: every injected thermal, HBM and NVLink fault
found on the right GPU; fault-free fleets (checkpoints, power capping, afternoon heat, driver
reloads) raise nothing."""

from pathlib import Path

import pytest

from pipeline.engine import Engine
from pipeline.evaluation.run import replay_batches
from pipeline.rules import load_rules
from pipeline.schema import fault_family
from pipeline.scoring import match_faults
from producers.sim import Simulator

RULES = Path(__file__).resolve().parents[3] / "rules"


def replay_sim(sim):
    rs, diags = load_rules([RULES])
    assert rs is not None, diags
    return replay_batches(Engine(rules=rs), sim.batches())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_thermal_hbm_nvlink_fault_found_on_the_right_gpu(seed):
    sim = Simulator(hosts=4, duration=1200, seed=seed, scenario="mixed")
    alerts = replay_sim(sim)
    matches, unmatched = match_faults(sim.labels(), alerts)
    hw = [m for m in matches if fault_family(m.label["fault"]) in ("thermal", "hbm", "nvlink")]
    assert len(hw) >= 4
    for m in hw:
        assert m.detected, f"missed {m.label}"
        assert m.right_gpu, f"wrong GPU for {m.label}: {m.alert}"
    assert unmatched == [], [f"{a.rule} {a.host}/{a.gpu} at {a.ts}" for a in unmatched]


@pytest.mark.slow
@pytest.mark.parametrize("scenario, hosts, duration", [
    ("healthy", 8, 7200),          # 64 GPUs, 2 hours of event time
    ("power_cap", 8, 1800),
    ("afternoon_heat", 8, 1800),
    ("driver_reload", 8, 1800),
])
def test_fault_free_fleets_raise_no_alert(scenario, hosts, duration):
    sim = Simulator(hosts=hosts, duration=duration, seed=11, scenario=scenario)
    assert not [lab for lab in sim.labels() if lab.get("fault")]
    alerts = replay_sim(sim)
    assert alerts == [], [f"{a.rule} {a.host}/{a.gpu}: {a.summary}" for a in alerts[:5]]


def test_default_packs_check_clean_strict_and_their_tests_pass(capsys):
    from pipeline.cli import main
    assert main(["rules", "check", "--strict", str(RULES)]) == 0
    assert main(["rules", "test", str(RULES / "tests")]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and " 0 failed" in out
