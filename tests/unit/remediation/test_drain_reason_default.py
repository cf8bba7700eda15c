"""The default ``slurm_drain`` reason names nothing a host-level alert lacks: such an alert (an
NVSwitch SXid, a NIC port down) has no GPU, and a template value the alert lacks skips the
action (``missing_value``), so its node was never drained."""

from __future__ import annotations

from pipeline.remediation import specs as C
from pipeline.remediation.presets import build_action
from pipeline.schema import AlertEvent
from tests.factories import T0


def _host_level() -> AlertEvent:
    return AlertEvent(id="nvswitch_fatal_sxid-n7", state="firing", fault="nvswitch_fatal", severity="critical",
                      rule="nvlink_nvswitch_fatal_sxid", host="n7", gpu=None, ts=T0, started_at=T0)


def test_the_default_drain_of_a_host_level_alert_plans_its_scontrol_call():
    plan = build_action("drain", C.SlurmDrainAction()).plan(_host_level())
    assert plan.argv is not None
    assert plan.argv[:4] == ["scontrol", "update", "nodename=n7", "state=drain"]
    assert plan.argv[4] == "reason=gpuwarden: nvswitch_fatal alert nvswitch_fatal_sxid-n7"
