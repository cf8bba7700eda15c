"""Repeat offenders: policies count per GPU and host, escalate once a window, and their history
survives a checkpoint as plain data (docs/rules.md#incidents)."""

from __future__ import annotations

import json

import msgspec
import pytest

from pipeline.errors import StateError
from pipeline.incidents import IncidentStage, RepeatHistory, default_config
from tests.unit.incidents.factories import alert, resolved, run

HOUR = 3600.0


def xid79(i: int, t: float, gpu: int = 0):
    # A GPU that falls off the bus, comes back after a reset, and falls off again.
    return alert("gpu_fallen_off_bus", t, gpu=gpu, id=f"x79-{i}", xid=79)


def five_xid79s(gap: float = 4 * HOUR):
    out = []
    for i in range(5):
        a = xid79(i, i * gap)
        out += [a, resolved(a, i * gap + 600)]
    return out


def escalations(events, policy: str = "xid79_repeat"):
    return [e for e in events if "action_escalated" in e.changes and e.policy == policy]


def test_xid79_five_times_in_24h_escalates_once_with_a_reason() -> None:
    ev = run(five_xid79s())
    esc = escalations(ev)
    assert len(esc) == 1
    e = esc[0]
    # The same five incidents on one host also make it a lemon: a second, separate escalation.
    assert [x.policy for x in ev if x.policy] == ["lemon_host", "xid79_repeat"]
    assert e.policy == "xid79_repeat" and e.action == "drain_and_inspect" and e.state == "updated"
    assert "XID 79 5 times in 24h on this GPU" in e.reason and "contact support" in e.reason
    assert e.root.alert == "x79-4"  # the incident the fifth one opened
    # A sixth within the window does not escalate again.
    assert len(escalations(run([*five_xid79s(), xid79(5, 17 * HOUR)]))) == 1


def test_xid79_four_times_or_spread_over_more_than_a_day_does_not_escalate() -> None:
    assert escalations(run(five_xid79s()[:8])) == []
    assert escalations(run(five_xid79s(gap=7 * HOUR))) == []


def test_a_restore_between_the_third_and_fourth_xid79_still_escalates_once() -> None:
    seq = five_xid79s()
    first = IncidentStage(default_config())
    before = first.process(seq[:6])  # three XID 79s, each opened and resolved
    # The history goes through msgpack as a service's checkpoint would carry it.
    blob = msgspec.msgpack.encode(first.history.to_state())
    history = RepeatHistory()
    history.load_state(msgspec.msgpack.decode(blob))
    second = IncidentStage(default_config(), history)
    after = second.process(seq[6:])
    assert escalations(before) == [] and len(escalations(after)) == 1
    # Reprocessing alerts the checkpoint already counted changes nothing.
    again = IncidentStage(default_config(), history)
    assert escalations(again.process(seq[4:])) == []


def test_a_lone_stale_application_xid_raises_nothing() -> None:
    # XID 13 already on the gauge when the exporter started: gpu_xid_warning fires once.
    st = IncidentStage(default_config())
    assert st.process([alert("gpu_xid_warning", 0, xid=13)]) == []
    assert st.stats["incidents.suppressed.application_xid"] == 1


def test_the_same_application_xid_three_times_in_an_hour_on_one_gpu_opens_an_incident() -> None:
    seq = [alert("gpu_xid_warning", 0, xid=13), alert("gpu_xid_repeated", 1200, xid=13),
           alert("gpu_xid_repeated", 2400, xid=13, id="again")]
    ev = run(seq)
    assert len(ev) == 1 and ev[0].state == "opened" and ev[0].root.alert == "again"
    assert "XID 13 3 times in 1h on this GPU" in ev[0].reason
    # Spread over more than an hour, or over three GPUs, it does not.
    assert run([alert("gpu_xid_warning", t, xid=13, id=f"s{t}") for t in (0, 2000, 4000)]) == []
    assert run([alert("gpu_xid_warning", 0, gpu=g, xid=13) for g in range(3)]) == []


def test_an_application_xid_on_a_gpu_with_an_incident_joins_it() -> None:
    ev = run([alert("hbm_dbe", 0), alert("gpu_xid_warning", 10, xid=45)])
    assert len(ev) == 2 and ev[1].changes == ["alert_joined"]


def test_a_hardware_xid_alone_still_opens_an_incident() -> None:
    assert len(run([alert("gpu_xid_critical", 0, xid=119)])) == 1


def test_a_lemon_host_escalates_at_its_fifth_incident_in_seven_days() -> None:
    seq = []
    for i in range(5):
        a = alert("hbm_dbe", i * 86400.0, gpu=i)
        seq += [a, resolved(a, i * 86400.0 + 60)]
    ev = run(seq)
    esc = [e for e in ev if e.policy]
    assert [(e.policy, e.action) for e in esc] == [("lemon_host", "drain_and_inspect")]
    assert "incidents 5 times in 7d on this host" in esc[0].reason


def test_incidents_within_join_window_of_each_other_count_once_for_a_lemon() -> None:
    # Five GPUs failing within a minute are one episode; the episodes of five days are five.
    burst = [alert("hbm_dbe", i * 10.0, gpu=i) for i in range(5)]
    assert not [e for e in run(burst) if e.policy]
    seq = []
    for day in range(5):
        seq += [alert("hbm_dbe", day * 86400.0 + i * 10.0, gpu=2 * day + i) for i in range(2)]
    esc = [e for e in run(seq) if e.policy]
    assert [e.policy for e in esc] == ["lemon_host"] and "incidents 5 times in 7d" in esc[0].reason


def test_link_flaps_escalate_at_the_third_recovery_in_an_hour() -> None:
    seq = [alert("nvlink_recoveries", t, gpu=1, id=f"r{t}") for t in (0, 900, 1800)]
    esc = [e for e in run(seq) if e.policy]
    assert [e.policy for e in esc] == ["nvlink_flaps"] and "nvlink_recoveries alerts 3 times in 1h" in esc[0].reason


def test_an_alerts_policy_names_the_rules_it_counted() -> None:
    # Every count: alerts policy's reason said "link flaps", whatever rules it counted.
    from pipeline.incidents.config import parse_config

    cfg, diags = parse_config(
        "policies:\n  - {name: sbe_again, count: alerts, rules: [hbm_sbe_burst], per: gpu, threshold: 2,"
        " window: 1h, action: drain_node}\n"
    )
    assert cfg is not None, diags
    seq = [alert("hbm_sbe_burst", t, gpu=2, id=f"s{t}") for t in (0, 600)]
    esc = [e for e in run(seq, stage=IncidentStage(cfg)) if e.policy]
    assert [e.policy for e in esc] == ["sbe_again"] and "hbm_sbe_burst alerts 2 times in 1h" in esc[0].reason
    assert "link flaps" not in esc[0].reason


def test_history_state_is_plain_data_and_round_trips() -> None:
    st = IncidentStage(default_config())
    st.process(five_xid79s()[:6])
    state = st.history.to_state()
    assert json.loads(json.dumps(state)) == state
    h = RepeatHistory()
    h.load_state(state)
    assert h.to_state() == state


@pytest.mark.parametrize(
    "state",
    [
        None,
        {"v": 2, "keys": []},
        {"v": 1, "keys": "x"},
        {"v": 1, "keys": [["p", "h", 0, [[1.0, "a"]]]]},
        {"v": 1, "keys": [["p", "h", True, [], None]]},
        {"v": 1, "keys": [["p", "h", 0, [[float("nan"), "a"]], None]]},
        {"v": 1, "keys": [["p", "h", 0, [[1.0, 7]], None]]},
        {"v": 1, "keys": [["p" * 1000, "h", 0, [], None]]},
        {"v": 1, "keys": [["p", "h", 0, [[1.0, "a"]] * 5000, None]]},
        {"v": 1, "keys": [["p", "h", 0, [], "soon"]]},
    ],
)
def test_a_forged_history_state_is_refused_and_leaves_the_history_as_it_was(state) -> None:
    h = RepeatHistory()
    h.note(("p", "h", 0), 1.0, "a", keep=3, window=10)
    before = h.to_state()
    with pytest.raises(StateError, match="incident history state"):
        h.load_state(state)
    assert h.to_state() == before


def test_the_history_is_bounded_in_keys_and_times() -> None:
    h = RepeatHistory(max_keys=10)
    for i in range(100):
        for t in range(20):
            h.note(("p", f"h{i}", 0), float(t), f"a{t}", keep=5, window=100)
    assert len(h) == 10 and h.evicted == 90
    assert all(len(row[3]) == 5 for row in h.to_state()["keys"])
