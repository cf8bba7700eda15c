"""Application XIDs through the engine and the stage: a stale XID 13 on the gauge when the
exporter starts raises an alert but no incident; the same XID three times in an hour opens one."""

from __future__ import annotations

from pipeline.detection import build_detector
from pipeline.incidents import IncidentStage, default_config
from pipeline.resources import rules_dir
from tests.factories import fleet, run_batched


def _xid13(t: float, host: str, gpu: int) -> dict:
    # GPU n0/0's gauge holds XID 13 from the first scrape; the exporter's count shows it again
    # at 20 and 40 minutes (the gauge cannot: the same XID is no new value).
    if host == "n0" and gpu == 0:
        return {"xid": 13, "xid_count": 1 + (t >= 1200) + (t >= 2400)}
    return {}


def _run(seconds: int):
    engine, _ = build_detector([str(rules_dir())], None)
    alerts = run_batched(fleet(range(0, seconds, 10), hosts=1, gpus=4, overrides=_xid13), 500, engine).alerts
    return alerts, IncidentStage(default_config()).process(alerts)


def test_a_stale_xid13_alerts_but_opens_no_incident() -> None:
    alerts, incidents = _run(1000)
    assert [(a.rule, a.state) for a in alerts] == [("gpu_xid_warning", "firing"), ("gpu_xid_warning", "resolved")]
    assert incidents == []


def test_xid13_three_times_in_an_hour_opens_one_incident() -> None:
    alerts, incidents = _run(3000)
    assert [a.rule for a in alerts if a.state == "firing"] == ["gpu_xid_warning", "gpu_xid_repeated", "gpu_xid_repeated"]
    assert [(e.state, e.host, e.gpu, e.root.rule) for e in incidents] == [("opened", "n0", 0, "gpu_xid_repeated")]
    assert incidents[0].reason == "XID 13 3 times in 1h on this GPU" and incidents[0].action == "restart_job"
