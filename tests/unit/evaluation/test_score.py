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
