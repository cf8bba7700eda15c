import random

import numpy as np

from tests.factories import T0, fleet, sample
from tests.unit.rules.factories import fired, one_rule, run_rules


def test_unknown_is_not_true(make_rules):
    # A GPU that never reports a temperature is neither hot nor "not hot".
    rs = make_rules(one_rule("not (gpu_temp > 85)"))
    recs = [sample(t, "n0", 0, gpu_temp=70) for t in range(5)] + \
           [sample(t, "n0", 1, gpu_temp=float("nan")) for t in range(5)]
    alerts, _ = run_rules(rs, sorted(recs, key=lambda r: r.ts))
    assert fired(alerts) == [("n0", 0, 0.0)]


def test_increase_over_a_window_and_reset(make_rules):
    rs = make_rules(one_rule("increase(ecc_sbe_volatile, 1m) >= 30"))
    # +1/s for 20 s (19 in all), a driver reload resets the counter to 0, then +1/s again.
    vals = [float(t) for t in range(20)] + [0.0] + [float(i) for i in range(1, 41)]
    recs = [sample(t, "n0", 0, ecc_sbe_volatile=v) for t, v in enumerate(vals)]
    alerts, _ = run_rules(rs, recs)
    # 19 before the reset + 11 after it = 30 at t=31: the reset counted 0, neither -19 (t=50)
    # nor a burst (t=21).
    assert fired(alerts) == [("n0", 0, 31.0)]


def test_avg_min_max_delta_windows(make_rules):
    for cond, want in [("avg_over(gpu_temp, 10s) >= 80", 14.0), ("min_over(gpu_temp, 10s) >= 80", 19.0),
                       ("max_over(gpu_temp, 10s) >= 80", 10.0), ("delta(gpu_temp, 30s) >= 20", 10.0)]:
        rs = make_rules(one_rule(cond))
        recs = [sample(t, "n0", 0, gpu_temp=60 if t < 10 else 100) for t in range(40)]
        alerts, _ = run_rules(rs, recs)
        assert fired(alerts)[:1] == [("n0", 0, want)], cond


def test_baseline_learns_normal_not_bursts_and_warms_up(make_rules):
    rs = make_rules(one_rule("sm_clock < 0.8 * baseline(sm_clock, 10m)"))
    clocks = [1980.0] * 300 + [900.0] * 60 + [1980.0] * 60
    alerts, _ = run_rules(rs, [sample(t, "n0", 0, sm_clock=c) for t, c in enumerate(clocks)])
    assert fired(alerts) == [("n0", 0, 300.0)]
    assert fired(alerts, "resolved") == [("n0", 0, 360.0)]
    # During warm-up the baseline is unknown: nothing fires on the first samples.
    rs = make_rules(one_rule("sm_clock < 0.8 * baseline(sm_clock, 10m)"), name="fresh.yaml")
    alerts, _ = run_rules(rs, [sample(t, "n0", 0, sm_clock=900.0 if t == 3 else 1980.0) for t in range(30)])
    assert fired(alerts) == []


def test_a_new_regime_longer_than_tau_becomes_the_baseline(make_rules):
    rs = make_rules(one_rule("sm_clock > 1.5 * baseline(sm_clock, 60s)"))
    # Warmed up idle (345 MHz), then busy for good: fires at first, then the baseline follows.
    clocks = [345.0] * 60 + [1980.0] * 300
    alerts, _ = run_rules(rs, [sample(t, "n0", 0, sm_clock=c) for t, c in enumerate(clocks)])
    assert fired(alerts) == [("n0", 0, 60.0)] and len(fired(alerts, "resolved")) == 1


def test_peer_median_compares_gpus_of_the_same_host(make_rules):
    rs = make_rules(one_rule("gpu_temp > peer_median(gpu_temp, by=host) + 10"))
    recs = fleet(range(5), hosts=2, gpus=4, overrides=lambda t, h, g: {"gpu_temp": 85 if (h, g) == ("n1", 2) else
                                                                        (75 if h == "n0" else 70)})
    alerts, _ = run_rules(rs, recs)
    assert fired(alerts) == [("n1", 2, 0.0)]


def test_changed_and_absent(make_rules):
    rs = make_rules(one_rule("changed(xid) and xid == 79", keep_firing_for="2s"))
    xids = [0, 0, 79, 79, 79, 79, 79, 13, 79]
    alerts, _ = run_rules(rs, [sample(t, "n0", 0, xid=x) for t, x in enumerate(xids)])
    assert fired(alerts) == [("n0", 0, 2.0), ("n0", 0, 8.0)]
    rs = make_rules(one_rule("absent(gpu_temp, 10s)"))
    recs = [sample(t, "n0", 0, gpu_temp=70 if t < 5 else float("nan")) for t in range(30)]
    alerts, _ = run_rules(rs, recs)
    assert fired(alerts) == [("n0", 0, 15.0)]


def test_host_level_rule_names_the_host(make_rules):
    rs = make_rules(one_rule("clocks_event_reasons has HW_POWER_BRAKE", level="host"))
    recs = fleet(range(10), hosts=2, gpus=4,
                 overrides=lambda t, h, g: {"clocks_event_reasons": 0x80 if h == "n1" and t >= 3 else 0})
    alerts, _ = run_rules(rs, recs)
    assert fired(alerts) == [("n1", None, 3.0)]


def test_rules_give_the_same_alerts_whatever_the_batching(make_rules):
    rs_text = one_rule("increase(ecc_sbe_volatile, 30s) >= 10 and gpu_temp > peer_median(gpu_temp, by=host)")
    recs = fleet(range(200), hosts=3, gpus=4, overrides=lambda t, h, g: {
        "ecc_sbe_volatile": float(t if (h, g) == ("n2", 3) and t > 100 else 0),
        "gpu_temp": 80 if (h, g) == ("n2", 3) else 70})
    golden, _ = run_rules(make_rules(rs_text), recs)
    assert fired(golden)
    key = lambda al: sorted((a.id, a.state, a.ts) for a in al)  # noqa: E731
    rng = random.Random(1)
    for batch in (1, 13, 500):
        shuffled = []
        for i in range(0, len(recs), batch):
            chunk = recs[i:i + batch]
            rng.shuffle(chunk)
            shuffled += chunk
        got, _ = run_rules(make_rules(rs_text, name=f"b{batch}.yaml"), shuffled, batch=batch)
        assert key(got) == key(golden), batch


def test_alert_evidence_and_summary(make_rules):
    rs = make_rules("""
rules:
  - name: burst
    fault: hbm_ecc_burst
    severity: warning
    condition: increase(ecc_sbe_volatile, 1m) >= 10
    values:
      per_min: increase(ecc_sbe_volatile, 1m)
    labels: {team: infra}
    summary: "GPU {gpu} on {host}: {per_min:.0f} SBE/min at {gpu_temp:.0f} C"
""")
    alerts, _ = run_rules(rs, [sample(t, "n0", 3, ecc_sbe_volatile=5.0 * t) for t in range(5)])
    a = alerts[0]
    assert a.summary == "GPU 3 on n0: 10 SBE/min at 68 C"
    assert a.evidence["per_min"] == 10 and a.evidence["increase(ecc_sbe_volatile, 1m)"] == 10
    assert a.labels == {"team": "infra"} and a.fault == "hbm_ecc_burst" and a.family == "hbm"


def test_snapshot_keeps_windows_and_baselines(make_rules):
    text = one_rule("increase(ecc_sbe_volatile, 1m) >= 30 or sm_clock < 0.8 * baseline(sm_clock, 5m)")
    recs = [sample(t, "n0", 0, ecc_sbe_volatile=float(t // 2), sm_clock=1980.0 if t < 150 else 900.0)
            for t in range(200)]
    golden, _ = run_rules(make_rules(text), recs)
    from pipeline.engine import Engine, EngineConfig
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=make_rules(text, "a.yaml"))
    first = eng.process(recs[:100]).alerts
    eng2 = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=make_rules(text, "b.yaml"))
    eng2.restore(eng.snapshot())
    rest = eng2.process(recs[100:]).alerts + eng2.flush().alerts
    assert [(a.id, a.state, a.ts) for a in first + rest] == [(a.id, a.state, a.ts) for a in golden]
    assert len(golden) >= 2


def test_window_memory_is_bounded():
    from pipeline.rules.windows import PaneWindow
    w = PaneWindow(1800, 1.0, ("sum", "count"))
    w.update(np.array([0]), T0, np.array([1.0]), 1000)
    assert w.pw == 150 and w.n == 12
    assert sum(a.nbytes for a in w.data.values()) == 1000 * 12 * 8 * 2   # 192 B per GPU, any length


def test_rules_share_only_identical_sub_expressions(make_rules):
    # Sub-expressions are computed once a tick per distinct structure: two rules comparing
    # different fields with the same operator and constant must not share a result.
    rs = make_rules("""
rules:
  - {name: pending, fault: hbm_pending, severity: warning, condition: "row_remap_pending >= 1"}
  - {name: failure, fault: hbm_failure, severity: warning, condition: "row_remap_failure >= 1"}
  - {name: pending_again, fault: hbm_again, severity: warning, condition: "row_remap_pending >= 1 and gpu_util >= 0"}
""")
    recs = [sample(t, "n0", 0, row_remap_pending=0, row_remap_failure=1, gpu_util=50) for t in range(3)]
    alerts, _ = run_rules(rs, recs)
    assert sorted({a.rule for a in alerts if a.state == "firing"}) == ["failure"]


def test_and_or_are_kleene_whatever_the_left_side_decides(make_rules):
    # 'and'/'or' skip their right side when the left decides every row; unknown stays unknown.
    cases = {
        "xid == 79 and gpu_temp > 80": [],                  # left false everywhere: false
        "gpu_temp > 80 or power > 100": [0, 1, 2],          # left true everywhere: true
        "not (gpu_temp > 80 and power > 100)": [],          # power never reported: unknown, not true
        "not (xid == 79 or power > 100)": [],               # false or unknown = unknown
    }
    for text, gpus in cases.items():
        rs = make_rules(one_rule(text))
        recs = [sample(t, "n0", g, xid=0, gpu_temp=90) for t in range(3) for g in range(3)]
        alerts, _ = run_rules(rs, recs)
        assert sorted({a.gpu for a in alerts if a.state == "firing"}) == gpus, text
