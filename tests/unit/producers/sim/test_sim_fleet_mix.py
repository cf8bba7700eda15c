"""Mixed GPU models, DCGM 4.6 field names, sparse sampling and how records arrive (issue 20)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from pipeline.catalog import FIELDS
from producers.sim import SCENARIOS, Simulator
from producers.sim.scenarios import Scenario, scenario_from_dict

START = 1764403200.0


def _run(**kw):
    sim = Simulator(
        hosts=6,
        duration=kw.pop("duration", 900.0),
        interval=kw.pop("interval", 10.0),
        seed=kw.pop("seed", 4),
        scenario=kw.pop("scenario", "mixed_fleet"),
        **kw,
    )
    return sim, [list(b) for b in sim.batches()]


@pytest.fixture(scope="module")
def fleet():
    return _run()


def test_same_seed_same_bytes(fleet):
    sim, batches = fleet
    again = [
        json.dumps(r, separators=(",", ":"))
        for r in Simulator(hosts=6, duration=900.0, interval=10.0, seed=4, scenario="mixed_fleet").records()
    ]
    assert [json.dumps(r, separators=(",", ":")) for b in batches for r in b] == again
    other = [
        json.dumps(r, separators=(",", ":"))
        for r in Simulator(hosts=6, duration=900.0, interval=10.0, seed=5, scenario="mixed_fleet").records()
    ]
    assert again != other


def test_h100_hosts_use_pre_46_names_and_b200_hosts_the_46_names(fleet):
    _, batches = fleet
    models, names = {}, defaultdict(set)
    for r in (r for b in batches for r in b if r["kind"] == "dcgm"):
        models[r["host"]] = r["model"]
        names[r["model"]] |= set(r["fields"])
    assert [models[f"gpu-node-00{h}"] for h in range(6)] == ["NVIDIA H100 80GB HBM3"] * 3 + ["NVIDIA B200"] * 3
    assert "DCGM_FI_DEV_GPU_TEMP" in names["NVIDIA H100 80GB HBM3"]
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS" in names["NVIDIA B200"]
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in names["NVIDIA B200"]
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in names["NVIDIA B200"]
    # Every name is one the field catalog knows, in either spelling.
    assert all(FIELDS.by_name(n) is not None for s in names.values() for n in s)


def test_b200_runs_hotter_near_1000_w_with_its_own_limits():
    sim, batches = _run(
        scenario=Scenario(name="m", checkpoint_every=None, gpu_models=SCENARIOS["mixed_fleet"].gpu_models),
        duration=600.0,
    )
    temp, power, limits = defaultdict(list), defaultdict(list), {}
    for r in (r for b in batches[10:] for r in b if r["kind"] == "dcgm"):
        f = r["fields"]
        temp[r["model"]].append(f.get("DCGM_FI_DEV_GPU_TEMP", f.get("DCGM_FI_DEV_GPU_TEMP_CELSIUS")))
        power[r["model"]].append(f.get("DCGM_FI_DEV_POWER_USAGE", f.get("DCGM_FI_DEV_BOARD_POWER_WATTS")))
        limits[r["model"]] = f.get(
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", f.get("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS")
        )
    h, b = "NVIDIA H100 80GB HBM3", "NVIDIA B200"
    assert 5.0 <= np.mean(temp[b]) - np.mean(temp[h]) <= 13.0
    assert 820.0 <= np.mean(power[b]) <= 1000.0 and 560.0 <= np.mean(power[h]) <= 700.0
    assert (limits[h], limits[b]) == (700.0, 1000.0)


def test_delivery_phase_skew_late_and_joining_hosts(fleet):
    sim, batches = fleet
    first_seen, offsets, arrival = {}, defaultdict(list), defaultdict(list)
    for k, b in enumerate(batches):
        for r in b:
            if r["kind"] != "dcgm":
                continue
            first_seen.setdefault(r["host"], r["ts"] - START)
            offsets[r["host"]].append((r["ts"] - START) % 10.0)
            arrival[r["host"]].append(k * 10.0 - (r["ts"] - START))
    # Host 2 joins a third of the way in; the others report from the start.
    assert 300.0 <= first_seen["gpu-node-002"] <= 310.0
    assert all(first_seen[f"gpu-node-00{h}"] < 10.0 for h in (0, 1, 3, 4, 5))
    # Each host samples at its own phase (jitter 0.3 s); host 1's clock is 2.5 s ahead of its phase.
    phases = {h: float(np.median(v)) for h, v in offsets.items()}
    assert len({round(p) for p in phases.values()}) >= 4
    # Host 4's records arrive 20-40 s after they were stamped; the others within a step.
    assert 15.0 <= np.median(arrival["gpu-node-004"]) <= 45.0
    assert all(np.median(arrival[f"gpu-node-00{h}"]) < 10.0 for h in (0, 1, 3, 5))
    # ... and in the order they were stamped.
    ts4 = [r["ts"] for b in batches for r in b if r["host"] == "gpu-node-004" and r["kind"] == "dcgm" and r["gpu"] == 0]
    assert ts4 == sorted(ts4) and len(ts4) == 90


def test_job_restart_new_communicators_and_gpu_reset():
    sc = scenario_from_dict(
        {
            "checkpoint_every": None,
            "faults": [
                {"type": "job_restart", "onset": 200, "duration": 60},
                {"type": "gpu_reset", "host": 1, "gpu": 3, "onset": 400, "duration": 15},
            ],
        }
    )
    sim = Simulator(hosts=3, duration=600.0, interval=10.0, seed=2, scenario=sc)
    recs = list(sim.records())
    comms_before = {r["comm"] for r in recs if r["kind"] == "nccl" and r["ts"] < START + 200}
    comms_after = {r["comm"] for r in recs if r["kind"] == "nccl" and r["ts"] > START + 260}
    assert comms_before and comms_after and not comms_before & comms_after
    assert not [r for r in recs if r["kind"] == "nccl" and START + 210 <= r["ts"] < START + 260]
    g = [r for r in recs if r["kind"] == "dcgm" and r["host"] == "gpu-node-001" and r["gpu"] == 3]
    gaps = np.diff([r["ts"] for r in g])
    assert gaps.max() == 30.0  # the samples at 400 and 410 s missing
    assert {c["condition"] for c in sim.labels()} >= {"job_restart", "gpu_reset"}


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"gpu_models": [{"model": "NVIDIA B200", "field_names": "5.0"}]}, "gpu_models[0].field_names"),
        ({"gpu_models": [{"modl": "x"}]}, "gpu_models[0].modl"),
        ({"delivery": {"late_s": {3: [40, 20]}}}, "delivery.late_s.3"),
        ({"delivery": {"jitter": 1}}, "delivery.jitter"),
    ],
)
def test_bad_fleet_options_name_the_key(bad, key):
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        scenario_from_dict(bad)
