from pipeline.evaluation.detectors import default_exporter_fields, detectors
from pipeline.evaluation.score import Score, score_run
from pipeline.schema import AlertEvent

T = 1764403200.0


def alert(fault, host, gpu, ts, state="firing", aid=None):
    return AlertEvent(id=aid or f"{fault}{host}{gpu}{ts}", state=state, fault=fault, severity="critical", rule="r",
                      host=host, gpu=gpu, ts=T + ts, started_at=T + ts)


def test_recall_precision_latency_localisation_and_false_alerts():
    labels = [{"fault": "hbm_ecc_burst", "host": "a", "gpu": 1, "onset": T + 100, "end": T + 400},
              {"fault": "thermal_throttling", "host": "b", "gpu": 2, "onset": T + 100, "end": T + 400},
              {"fault": "nvlink_degradation", "host": "c", "gpu": 3, "onset": T + 100, "end": T + 400},
              {"fault": None, "condition": "power_cap", "host": "d", "onset": T, "end": T + 10}]
    alerts = [alert("hbm_ecc_burst", "a", 1, 130),            # found after 30 s on the right GPU
              alert("thermal_throttling", "b", 5, 160),       # found after 60 s, wrong GPU
              alert("thermal_throttling", "z", 0, 200),       # a false alert
              alert("hbm_ecc_burst", "a", 1, 200, "resolved", aid="hbm_ecc_bursta1130")]
    s = Score("x")
    score_run(s, labels, alerts, gpu_hours=500.0)
    hbm, thermal, nvlink = s.family("hbm"), s.family("thermal"), s.family("nvlink")
    assert (hbm.recall, hbm.precision, hbm.localisation, hbm.latency(50)) == (1.0, 1.0, 1.0, 30.0)
    assert (thermal.recall, thermal.precision, thermal.localisation) == (1.0, 0.5, 0.0)
    assert nvlink.recall == 0.0 and nvlink.f1 != nvlink.f1   # no alerts: precision undefined
    assert s.false_per_1000_gpu_h == 2.0                    # 1 false alert in 500 GPU-hours


def test_baselines_see_what_they_would_in_real_life():
    dets = {d.name: d for d in detectors()}
    fields = default_exporter_fields()
    assert "DCGM_FI_DEV_GPU_TEMP" in fields and "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in fields
    batches = [[{"kind": "dcgm", "ts": T + t, "host": "a", "gpu": 0,
                 "fields": {"DCGM_FI_DEV_GPU_TEMP": 70, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 1}}] for t in range(90)]
    seen = list(dets["community"].transform(iter(batches)))
    assert [b[0]["ts"] - T for b in seen] == [0, 30, 60]                     # a 30 s scrape
    assert set(seen[0][0]["fields"]) == {"DCGM_FI_DEV_GPU_TEMP"}           # default fields only
    assert len(list(dets["gpuwarden"].transform(iter(batches)))) == 90
    for d in dets.values():
        d.engine()  # every pack loads


def test_knock_on_effects_are_told_apart_from_false_alerts():
    from pipeline.scoring import knock_on
    labels = [{"fault": "thermal_throttling", "host": "a", "gpu": 1, "onset": T + 100, "end": T + 400}]
    assert knock_on(alert("nccl_straggler", "a", 1, 200), labels)            # same GPU, during the fault
    assert knock_on(alert("nccl_busbw_degraded", "a", None, 200), labels)    # its host, host-level alert
    assert not knock_on(alert("nccl_straggler", "a", 2, 200), labels)        # a neighbour GPU
    assert not knock_on(alert("nccl_straggler", "a", 1, 900), labels)        # long after
    assert not knock_on(alert("nccl_straggler", "b", 1, 200), labels)        # another host


def scored(name, found, injected=2, false=0, gpu_hours=100.0):
    """A Score on one family ("hbm") with ``found``: fault key -> latency."""
    from pipeline.evaluation.score import FamilyScore
    fam = FamilyScore("hbm", injected=injected, detected=len(found), latencies=list(found.values()),
                      detections=dict(found), false_alerts=false, alerts=len(found) + false)
    return Score(name, gpu_hours=gpu_hours, families={"hbm": fam})


def test_beating_needs_recall_latency_and_false_alerts_no_worse_and_something_better():
    from pipeline.evaluation.score import compare
    base = scored("base", {"a": 60.0})
    assert compare(scored("ours", {"a": 10.0}), base).beats                          # faster
    assert compare(scored("ours", {"a": 60.0, "b": 90.0}), base).beats               # finds more
    assert not compare(scored("ours", {"a": 60.0}), base).beats                      # identical: better nowhere
    slower = compare(scored("ours", {"a": 70.0, "b": 5.0}), base)                    # more recall, but slower on "a"
    assert not slower.beats and any("latency p50 70s > 60s" in r for r in slower.reasons)
    assert not compare(scored("ours", {}), base).beats                               # lower recall
    noisy = compare(scored("ours", {"a": 10.0}, false=1), base)
    assert not noisy.beats and any("false alerts" in r for r in noisy.reasons)


def test_false_alert_rate_has_an_upper_bound_even_at_zero():
    s = Score("x", gpu_hours=1000.0)
    assert s.false_per_1000_gpu_h == 0.0
    assert abs(s.false_per_1000_gpu_h_upper() - 2.996) < 0.01                       # -ln(0.05): "rule of three"
    s.family("hbm").false_alerts = 2
    assert s.false_per_1000_gpu_h == 2.0 and s.false_per_1000_gpu_h_upper() > 2 * 2.996


def test_knock_on_alerts_are_counted_apart_from_false_ones():
    labels = [{"fault": "thermal_throttling", "host": "a", "gpu": 1, "onset": T + 100, "end": T + 400}]
    alerts = [alert("thermal_throttling", "a", 1, 130), alert("nccl_straggler", "a", 1, 200),
              alert("nccl_straggler", "b", 1, 200)]
    s = Score("x")
    score_run(s, labels, alerts, gpu_hours=1000.0, run="r1")
    nccl = s.family("nccl")
    assert (nccl.alerts, nccl.knock_on, nccl.false_alerts) == (2, 1, 1)
    assert s.false_per_1000_gpu_h == 1.0 and s.knock_on_alerts == 1
    assert list(s.family("thermal").detections.values()) == [30.0]
