"""``IncidentStage.open_incidents()``: each open incident as its latest event said it, ordered
for a reader (most severe, then the longest open)."""

from __future__ import annotations

from pipeline.incidents import IncidentStage, default_config
from tests.unit.incidents.factories import alert, resolved, run, two_open_incidents


def latest_by_incident(events):
    last = {}
    for e in events:
        last[e.incident] = e
    return last


def test_each_open_incident_is_what_its_latest_event_said() -> None:
    st = IncidentStage(default_config())
    events = run(two_open_incidents(), batch=3, stage=st)
    now = st.open_incidents()
    last = latest_by_incident(events)
    still_open = {i for i, e in last.items() if e.state != "resolved"}
    assert {e.incident for e in now} == still_open and len(still_open) == 2
    for e in now:
        want = last[e.incident]
        assert (e.state, e.ts, e.members, e.severity, e.action, e.changes) == (
            want.state, want.ts, want.members, want.severity, want.action, want.changes)
    assert st.open_count == 2


def test_an_escalations_reason_stays_when_an_alert_joins_later() -> None:
    st = IncidentStage(default_config())
    alerts = two_open_incidents()
    run(alerts, stage=st)
    escalated = next(e for e in st.open_incidents() if e.host == "n1")
    assert escalated.policy == "xid79_repeat" and "XID 79 5 times in 24h" in escalated.reason
    assert escalated.action == "drain_and_inspect"
    # A link alert on the same GPU joins it: its latest event is the join, the reason stays.
    st.process([alert("nvlink_crc_errors", 16 * 3600 + 200, "n1", 0, id="crc-1")])
    after = next(e for e in st.open_incidents() if e.host == "n1")
    assert after.changes == ["alert_joined"] and after.members[-1] == "crc-1"
    assert after.reason == escalated.reason and after.policy == "xid79_repeat"


def test_most_severe_first_then_longest_open() -> None:
    st = IncidentStage(default_config())
    st.process([
        alert("hbm_sbe_burst", 0, "w-old", 0),          # warning, oldest
        alert("gpu_xid_critical", 10, "c-new", 0, xid=48),  # critical, newer
        alert("hbm_sbe_burst", 5, "w-new", 0),          # warning, newer
        alert("gpu_fallen_off_bus", 1, "c-old", 1, xid=79),  # critical, older
    ])
    assert [e.host for e in st.open_incidents()] == ["c-old", "c-new", "w-old", "w-new"]


def test_resolved_incidents_leave_and_the_result_is_a_copy() -> None:
    st = IncidentStage(default_config())
    a = alert("hbm_sbe_burst", 0, "n1", 0)
    st.process([a, resolved(a, 30)])
    assert [e.host for e in st.open_incidents()] == ["n1"]   # quiet has not passed yet
    st.process([alert("hbm_sbe_burst", 1000, "n2", 0)])       # time moves past n1's quiet period
    now = st.open_incidents()
    assert [e.host for e in now] == ["n2"]
    now[0].members.append("tampered")
    now[0].changes.append("tampered")
    again = st.open_incidents()[0]
    assert "tampered" not in again.members and "tampered" not in again.changes
    assert IncidentStage(default_config()).open_incidents() == []
