"""A skeptical review of the incident stage: redelivered alerts, host-level alerts without a GPU,
alerts without a host (docs/architecture.md, "Incidents")."""

from __future__ import annotations

from pipeline.incidents import IncidentStage, default_config
from pipeline.schema import AlertEvent

from tests.unit.incidents.factories import HOUR, T0, alert, resolved


def _hostless(rule: str, fault: str, t: float, id: str, host: str | None = None) -> AlertEvent:
    return AlertEvent(
        id=id,
        state="firing",
        fault=fault,
        severity="warning",
        rule=rule,
        host=host,
        gpu=None,
        ts=T0 + t,
        started_at=T0 + t,
    )


def test_a_members_firing_event_redelivered_after_its_resolution_is_ignored() -> None:
    """At-least-once delivery: a joined alert's firing event again after its resolved one must
    not make it fire in the incident for good (the incident would never resolve)."""
    root = alert("hbm_sbe_burst", 0, id="root")
    member = alert("hbm_ecc_xid", 10, id="member")
    st = IncidentStage(default_config())
    ev = st.process([root, member, resolved(member, 20), member, resolved(root, 30)])
    ev += st.process([alert("pcie_replay_rate", 3 * HOUR, "n9", 1, id="later")])  # time moves on
    mine = [e for e in ev if e.incident == ev[0].incident]
    assert [e.state for e in mine] == ["opened", "updated", "resolved"]
    assert mine[-1].members == ["root", "member"]
    assert st.stats["incidents.ignored.repeated_alert"] == 1


def test_a_redelivered_member_is_ignored_also_after_a_restore() -> None:
    root = alert("hbm_sbe_burst", 0, id="root")
    member = alert("hbm_ecc_xid", 10, id="member")
    st = IncidentStage(default_config())
    st.process([root, member, resolved(member, 20)])
    again = IncidentStage(default_config())
    again.load_state(st.to_state())
    ev = again.process([member, resolved(root, 30), alert("pcie_replay_rate", 3 * HOUR, "n9", 1, id="later")])
    assert [e.state for e in ev if e.incident == ev[0].incident] == ["resolved"]


def test_host_level_alerts_of_a_gpu_entry_do_not_walk_every_host_level_incident() -> None:
    """A flood of host-level alerts (each its own incident) on a host must not make each later
    host-level alert of a ``reach: gpu`` entry's rules walk them all (quadratic)."""
    st = IncidentStage(default_config())
    st.process([_hostless("builtin_telemetry_gap", "telemetry_gap", i * 0.01, f"gap{i}", "n1") for i in range(2000)])
    calls = 0
    explains = st._explains

    def counted(*args):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return explains(*args)

    st._explains = counted  # type: ignore[method-assign]
    hbm = [_hostless("hbm_sbe_burst", "hbm_ecc_burst", 100 + i, f"hbm{i}", "n1") for i in range(100)]
    ev = st.process(hbm)
    assert calls <= 10 * len(hbm)
    # Still one incident: the first opens it, every later one joins it (memory_escalation).
    assert [e.state for e in ev] == ["opened"] + ["updated"] * 99
    assert len({e.incident for e in ev}) == 1


def test_host_level_hbm_alert_does_not_join_a_gpu_incident_of_its_host() -> None:
    st = IncidentStage(default_config())
    ev = st.process(
        [alert("hbm_sbe_burst", 0, "n1", 3, id="g3"), _hostless("hbm_sbe_burst", "hbm_ecc_burst", 1, "h", "n1")]
    )
    assert [e.state for e in ev] == ["opened", "opened"]


def test_incidents_without_a_host_are_no_lemon_host() -> None:
    """``lemon_host`` counts incidents per host: five unrelated fleet-wide incidents (no host)
    are not one host's five, and must not escalate to drain_and_inspect."""
    st = IncidentStage(default_config())
    ev = []
    for i in range(5):
        a = _hostless("nccl_comm_busbw", "nccl_busbw_degraded", i * HOUR, f"f{i}")
        ev += st.process(
            [a, AlertEvent(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "state": "resolved", "ts": a.ts + 10})]
        )
    assert not [e for e in ev if e.policy]
    assert all(e.action == "watch" for e in ev)
    # On a host, five still make a lemon.
    st = IncidentStage(default_config())
    ev = []
    for i in range(5):
        a = _hostless("nccl_comm_busbw", "nccl_busbw_degraded", i * HOUR, f"f{i}", "n1")
        ev += st.process(
            [a, AlertEvent(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "state": "resolved", "ts": a.ts + 10})]
        )
    assert [e.policy for e in ev if e.policy] == ["lemon_host"]
