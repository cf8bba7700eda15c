"""The incident stage groups the alerts of one root cause (docs/architecture.md, "Incidents")."""

from __future__ import annotations

import math

from pipeline.incidents import IncidentStage, default_config, incident_id
from pipeline.incidents.stage import MAX_MEMBERS
from pipeline.schema import AlertEvent
from tests.unit.incidents.factories import T0, alert, resolved, run


def opened(events):
    return [e for e in events if e.state == "opened"]


def test_a_link_going_down_is_one_incident_with_its_hosts_bandwidth_alert() -> None:
    # The demo's case: XID 74, CRC, recovery, replay and drift on the GPU, then the host's busbw.
    link = [alert(r, 0, "n5", 2) for r in ("nvlink_xid74", "nvlink_crc_errors", "nvlink_recoveries",
                                            "nvlink_replays", "nvlink_error_rate")]
    busbw = alert("nccl_comm_busbw", 35, "n5", None, comm="0xabc", rank=7)
    ev = run([*link, busbw])
    assert len(opened(ev)) == 1
    last = ev[-1]
    assert last.members == [a.id for a in [*link, busbw]]
    assert last.root.rule == "nvlink_xid74" and last.host == "n5" and last.gpu == 2
    assert last.severity == "critical" and last.action == "drain_node"


def test_the_bandwidth_alert_of_another_host_is_not_explained_by_a_link() -> None:
    ev = run([alert("nvlink_xid74", 0, "n5", 2), alert("nccl_comm_busbw", 35, "n6", None)])
    assert len(opened(ev)) == 2


def test_a_gpu_off_the_bus_explains_the_stragglers_of_its_communicator_on_other_hosts() -> None:
    off = alert("gpu_fallen_off_bus", 0, "n1", 4, xid=79)
    lost = alert("builtin_gpu_lost", 30, "n1", 4)
    # The communicator is known from an alert of the incident that names it...
    own = alert("nccl_rank_straggler", 40, "n1", 4, comm="0xc1", rank=4)
    other_host = alert("nccl_rank_straggler", 50, "n2", 1, comm="0xc1", rank=9)
    # ... and a straggler of another communicator on another GPU is another fault.
    unrelated = alert("nccl_rank_straggler", 60, "n1", 2, comm="0xff", rank=2)
    ev = run([off, lost, own, other_host, unrelated])
    incs = opened(ev)
    assert [e.root.rule for e in incs] == ["gpu_fallen_off_bus", "nccl_rank_straggler"]
    first = [e for e in ev if e.incident == incs[0].incident][-1]
    assert first.members == [off.id, lost.id, own.id, other_host.id]
    assert first.root.fault == "gpu_fallen_off_bus" and first.root.alert == off.id


def test_an_sbe_burst_its_xids_and_the_remap_are_one_incident_that_escalates() -> None:
    seq = [
        alert("hbm_sbe_burst", 0, gpu=3),
        alert("hbm_ecc_xid", 15, gpu=3, xid=92),
        alert("hbm_row_remap_pending", 100, gpu=3),
        alert("hbm_dbe", 250, gpu=3),
    ]
    ev = run(seq)
    assert len({e.incident for e in ev}) == 1
    assert [(e.severity, e.action, e.changes) for e in ev] == [
        ("warning", "watch", []),
        ("critical", "reset_gpu", ["alert_joined", "severity_rose", "action_escalated"]),
        ("critical", "reset_gpu", ["alert_joined"]),
        ("critical", "drain_node", ["alert_joined", "action_escalated"]),
    ]


def test_cooling_degradation_then_throttling_is_one_incident() -> None:
    ev = run([alert("gpu_cooling_degraded", 0, gpu=4), alert("gpu_thermal_throttling", 20, gpu=4),
              alert("nccl_comm_busbw", 40, gpu=None)])
    assert len(opened(ev)) == 1 and len(ev[-1].members) == 3


def test_a_fault_of_another_family_long_after_on_the_same_gpu_is_a_new_incident() -> None:
    # A model alert that keeps firing must not swallow a later, unrelated fault on its GPU.
    ev = run([alert("nvlink_error_rate", 0, gpu=2), alert("hbm_sbe_burst", 2000, gpu=2)])
    assert len(opened(ev)) == 2


def test_an_incident_resolves_a_quiet_period_after_its_alerts_resolve() -> None:
    cfg = default_config()
    a, b = alert("hbm_sbe_burst", 0), alert("hbm_ecc_xid", 10, xid=92)
    later = alert("pcie_replay_rate", 1000, host="n9")
    ev = run([a, b, resolved(a, 100), resolved(b, 200), later])
    res = [e for e in ev if e.state == "resolved"]
    assert len(res) == 1 and res[0].ts == T0 + 200 + cfg.quiet
    assert res[0].incident == incident_id(a.id)
    # A new alert on that GPU after it resolved opens a new incident.
    ev2 = run([a, resolved(a, 100), alert("pcie_replay_rate", 1000, host="n9"), alert("hbm_dbe", 1100)])
    assert len(opened(ev2)) == 3


def test_an_alert_joining_during_the_quiet_period_keeps_the_incident_open() -> None:
    a = alert("hbm_sbe_burst", 0)
    ev = run([a, resolved(a, 100), alert("hbm_dbe", 200), alert("pcie_replay_rate", 450, host="n9")])
    assert [e.state for e in ev if e.incident == incident_id(a.id)] == ["opened", "updated"]


def test_ids_are_the_hash_of_the_root_alert() -> None:
    a = alert("hbm_sbe_burst", 0)
    assert run([a])[0].incident == incident_id(a.id) == run([a], batch=1)[0].incident


def test_the_job_pod_and_mig_instance_of_the_alerts_are_carried() -> None:
    ev = run([alert("hbm_sbe_burst", 0, job="pretrain"),
              alert("hbm_dbe", 10, pod="trainer-0", namespace="ml", GPU_I_ID="2", GPU_I_PROFILE="3g.40gb")])
    last = ev[-1]
    assert (last.job, last.pod, last.namespace, last.mig_instance, last.mig_profile) == (
        "pretrain", "trainer-0", "ml", "2", "3g.40gb")


def test_members_are_bounded_and_counted_past_the_limit() -> None:
    many = [alert("nvlink_crc_errors", i, id=f"a{i}") for i in range(MAX_MEMBERS + 10)]
    last = run(many)[-1]
    assert len(last.members) == MAX_MEMBERS and last.more_members == 10


def test_open_incidents_are_bounded_and_what_does_not_fit_is_counted() -> None:
    st = IncidentStage(default_config(), max_open=3)
    ev = st.process([alert("hbm_sbe_burst", i, host=f"n{i}") for i in range(5)])
    assert len(opened(ev)) == 3 and st.stats["incidents.dropped.too_many_open"] == 2


def test_hostile_alerts_cost_only_themselves_and_are_counted() -> None:
    good = alert("hbm_sbe_burst", 0)
    bad = [
        AlertEvent(id="x" * 10_000, state="firing", fault="gpu_x", severity="warning", rule="r", host="n1",
                   ts=T0, started_at=T0),
        AlertEvent(id="nan", state="firing", fault="gpu_x", severity="warning", rule="r", host="n1",
                   ts=math.nan, started_at=T0),
        AlertEvent(id="odd", state="pending", fault="gpu_x", severity="loud", rule="r", host="n1",
                   ts=T0, started_at=T0),
        AlertEvent(id="ghost", state="resolved", fault="gpu_x", severity="warning", rule="r", host="n1",
                   ts=T0, started_at=T0),
        alert("hbm_ecc_xid", 5, xid="ninety-two"),  # evidence of the wrong type: no XID, still joins
    ]
    st = IncidentStage(default_config())
    ev = st.process([good, *bad])
    assert len(opened(ev)) == 1 and len(ev[-1].members) == 2
    assert st.stats["incidents.dropped.bad_alert"] == 2
    assert st.stats["incidents.dropped.bad_state"] == 1
    assert st.stats["incidents.ignored.resolved_not_member"] == 1


def test_the_same_firing_alert_twice_is_counted_once() -> None:
    a = alert("hbm_sbe_burst", 0)
    st = IncidentStage(default_config())
    ev = st.process([a, a])
    assert len(ev) == 1 and st.stats["incidents.ignored.repeated_alert"] == 1


def test_a_flood_of_alerts_on_many_hosts_is_handled_without_a_quadratic_walk() -> None:
    # 20,000 alerts on 20,000 hosts: each looks only at its own host's incidents (and its
    # communicators'), so this takes a second or two, where walking every open incident for every
    # alert took minutes. The generous bound only proves there is no such walk.
    import time

    st = IncidentStage(default_config())
    flood = [alert("nccl_comm_busbw", i * 0.01, host=f"h{i}", gpu=None, comm=f"c{i}", id=f"f{i}") for i in range(20_000)]
    t0 = time.perf_counter()
    ev = st.process(flood)
    assert time.perf_counter() - t0 < 20.0
    assert len(ev) == st.max_open and st.stats["incidents.dropped.too_many_open"] == 20_000 - st.max_open


def test_firing_alerts_tracked_for_resolution_are_bounded(monkeypatch) -> None:
    from pipeline.incidents import stage

    monkeypatch.setattr(stage, "MAX_FIRING", 5)
    st = IncidentStage(default_config())
    st.process([alert("nvlink_crc_errors", i, id=f"a{i}") for i in range(8)])
    assert st.stats["incidents.dropped.too_many_firing"] == 3


def test_every_event_carries_every_key_null_when_unknown() -> None:
    import json

    from pipeline.schema import encode

    doc = json.loads(encode(run([alert("builtin_telemetry_gap", 0, gpu=None)])[0]))
    assert doc["gpu"] is None and doc["job"] is None and doc["mig_instance"] is None
    assert {"incident", "state", "ts", "host", "gpu", "root", "members", "severity", "action", "job", "pod",
            "mig_instance"} <= set(doc)
    assert doc["root"] == {"alert": "builtin_telemetry_gap/n1/None/0", "rule": "builtin_telemetry_gap",
                           "fault": "telemetry_gap"}
