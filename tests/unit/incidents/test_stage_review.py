"""The incident stage under hostile fields, floods on one host or communicator and repeated alert
ids: its checkpoint always restores, an alert walks only the incidents that may take it (the same
choice as a walk over every open incident), and an open incident is never replaced by another of
the same id."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.incidents import IncidentStage, default_config
from pipeline.schema import AlertEvent
from tests.factories import fuzz_examples
from tests.unit.incidents.factories import RULES, T0, EveryIncident, alert, resolved, run, wire


def _restored(stage: IncidentStage) -> IncidentStage:
    new = IncidentStage(default_config())
    new.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(stage.to_state())))
    return new


def _raw(**kw) -> AlertEvent:
    base = dict(
        id="a1",
        state="firing",
        fault="hbm_ecc_burst",
        severity="warning",
        rule="hbm_sbe_burst",
        host="n1",
        gpu=0,
        ts=T0,
        started_at=T0,
    )
    return AlertEvent(**{**base, **kw})


@pytest.mark.parametrize(
    "hostile",
    [
        {"severity": "s" * 300},
        {"fault": "f" * 300},
        {"fault": "hbm_" + "f" * 300},
        {"gpu": -1},
        {"gpu": 1 << 20},
    ],
)
def test_a_hostile_field_never_makes_the_checkpoint_unrestorable(hostile) -> None:
    stage = IncidentStage(default_config())
    stage.process([_raw(id="bad", **hostile), _raw(id="good", host="n2")])
    again = _restored(stage)
    assert stage.stats["incidents.dropped.bad_alert"] == 1
    nxt = [_raw(id="next", ts=T0 + 1), _raw(id="next2", host="n2", ts=T0 + 1)]
    assert wire(again.process(nxt)) == wire(stage.process(nxt))


def test_an_incident_of_many_distinct_rules_still_restores() -> None:
    # A hostile stream of 10,001 rule names on one GPU joins one incident (same family).
    stage = IncidentStage(default_config())
    stage.process([_raw(id=f"a{i}", rule=f"hbm_r{i}", ts=T0 + i * 0.01) for i in range(10_001)])
    again = _restored(stage)
    nxt = [_raw(id="next", rule="hbm_dbe", fault="hbm_uncorrectable_error", severity="critical", ts=T0 + 200)]
    assert wire(again.process(nxt)) == wire(stage.process(nxt))


def _counting_explains(monkeypatch) -> list[int]:
    calls = [0]
    explains = IncidentStage._explains

    def counted(self, inc, a, comm):
        calls[0] += 1
        return explains(self, inc, a, comm)

    monkeypatch.setattr(IncidentStage, "_explains", counted)
    return calls


def test_bandwidth_alerts_of_every_host_of_one_communicator_do_not_walk_each_others_incidents(monkeypatch) -> None:
    # A slow fabric drops the bus bandwidth of every host of a job: each host's alert opens its
    # own incident (none explains another), and must not look at every other one to find that.
    calls = _counting_explains(monkeypatch)
    n = 300
    flood = [alert("nccl_comm_busbw", i * 0.01, f"h{i}", None, id=f"bw{i}", comm="c1") for i in range(n)]
    flood += [alert("nccl_rank_straggler", 10 + i * 0.01, f"h{i}", 0, id=f"st{i}", comm="c1") for i in range(n)]
    ev = run(flood)
    assert sum(e.state == "opened" for e in ev) == 2 * n
    assert calls[0] <= 2 * n


def test_many_incidents_on_one_host_are_not_walked_by_each_alert_there(monkeypatch) -> None:
    # A host whose jobs' many communicators each lose bandwidth, and whose GPUs each burst: every
    # alert opens its own incident, and must not look at every other one of its host to find that.
    calls = _counting_explains(monkeypatch)
    n = 300
    flood = [alert("nccl_comm_busbw", i * 0.01, "h", None, id=f"bw{i}", comm=f"c{i}") for i in range(n)]
    flood += [alert("hbm_sbe_burst", 10 + i * 0.01, "h", i, id=f"sbe{i}") for i in range(n)]
    ev = run(flood)
    assert sum(e.state == "opened" for e in ev) == 2 * n
    assert calls[0] <= 2 * n


def test_the_bandwidth_alert_still_joins_the_straggler_of_its_communicator_elsewhere() -> None:
    st = alert("nccl_rank_straggler", 0, "h1", 3, id="st", comm="c1")
    other = alert("nccl_rank_straggler", 5, "h3", 1, id="st2", comm="c2")
    bw = alert("nccl_comm_busbw", 10, "h2", None, id="bw", comm="c1")
    ev = run([st, other, bw])
    assert [e.incident for e in ev if e.state == "opened"] == [ev[0].incident, ev[1].incident]
    assert ev[-1].incident == ev[0].incident and ev[-1].members == ["st", "bw"]


def test_an_alert_firing_again_after_it_resolved_never_replaces_its_open_incident() -> None:
    # At-least-once delivery straight to the stage: the firing event of a host-level root again
    # after its resolution, while its incident waits out its quiet period.
    x = alert("nccl_comm_busbw", 0, "n1", None, id="x", comm="c1")
    stage = IncidentStage(default_config())
    ev = stage.process([x, resolved(x, 10), x])
    assert [e.state for e in ev] == ["opened"]
    assert stage.stats["incidents.ignored.repeated_alert"] == 1
    later = stage.process([alert("hbm_sbe_burst", 1000, "n9", 0, id="later")])
    assert [(e.incident, e.state) for e in later if e.state == "resolved"] == [(ev[0].incident, "resolved")]


# Beside the factories' rules, causes and explained alerts of the host-reach entries.
MORE = {
    "pcie_aer_fatal": "pcie_aer_fatal",
    "network_port_down": "network_port_down",
    "nvlink_nvswitch_fatal_sxid": "nvswitch_fatal",
    "power_brake_slowdown": "power_brake",
}


@st.composite
def _streams(draw):
    """Alerts of any rule on three hosts, on a GPU or the host, naming a communicator or none,
    some resolved later."""
    out = []
    t = 0.0
    for i in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 5.0, 60.0, 200.0, 400.0]))
        rule = draw(st.sampled_from(sorted(RULES) + sorted(MORE)))
        fault, severity = RULES.get(rule, (MORE.get(rule, ""), "critical"))
        a = AlertEvent(
            id=f"a{i}",
            state="firing",
            fault=fault,
            severity=severity,
            rule=rule,
            host=draw(st.sampled_from(["n1", "n2", "n3"])),
            gpu=draw(st.sampled_from([None, 0, 1])),
            ts=T0 + t,
            started_at=T0 + t,
            evidence={"comm": draw(st.sampled_from(["c1", "c2", ""]))},
        )
        out.append(a)
        if draw(st.booleans()):
            out.append(resolved(a, t + draw(st.sampled_from([10.0, 300.0, 900.0]))))
    return sorted(out, key=lambda a: a.ts)


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(_streams(), st.integers(0, 80))
def test_the_indexes_choose_what_a_walk_over_every_incident_chooses(alerts, cut) -> None:
    want = wire(run(alerts, stage=EveryIncident(default_config())))
    first = IncidentStage(default_config())
    before = first.process(alerts[:cut])
    assert wire(before + _restored(first).process(alerts[cut:])) == want


def test_a_communicators_bandwidth_alerts_do_not_walk_its_many_straggler_incidents(monkeypatch) -> None:
    # A fabric fault slows a quarter of a big job: each straggler opens an incident that explains
    # the communicator's bandwidth alerts, and each bandwidth alert looked at all of them (4,000
    # stragglers and 2,000 bandwidth alerts took 113 s). It joins the latest, as a walk finds.
    n = 300
    flood = [alert("nccl_rank_straggler", i * 0.01, f"h{i // 8}", i % 8, id=f"st{i}", comm="c1") for i in range(n)]
    flood += [alert("nccl_comm_busbw", 10 + i * 0.01, f"x{i}", None, id=f"bw{i}", comm="c1") for i in range(n)]
    want = wire(run(flood, stage=EveryIncident(default_config())))
    calls = _counting_explains(monkeypatch)
    assert wire(run(flood)) == want
    assert calls[0] <= 2 * n


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(_streams(), st.randoms(use_true_random=False))
def test_alerts_out_of_time_order_join_what_a_walk_chooses(alerts, rnd) -> None:
    # Out of order (a driver handing alerts in another order than the feed's): an alert behind
    # the stage's clock still finds what a walk over every incident finds.
    alerts = list(alerts)
    rnd.shuffle(alerts)
    assert wire(run(alerts)) == wire(run(alerts, stage=EveryIncident(default_config())))


def test_an_alert_behind_the_clock_joins_an_incident_recent_for_it_though_not_for_the_clock() -> None:
    # The straggler's incident resolved and waits out its quiet period; at t=400 it is neither
    # firing nor recent, so that alert passes it by. One of t=250 (handed over late) is within
    # join_window of its last alert and joins it, as a walk over every incident finds.
    st0 = alert("nccl_rank_straggler", 0, "h1", 3, id="st", comm="c1")
    later = alert("nccl_comm_busbw", 400, "h2", None, id="bw400", comm="c1")
    behind = alert("nccl_comm_busbw", 250, "h3", None, id="bw250", comm="c1")
    alerts = [st0, resolved(st0, 200), later, behind]
    want = wire(run(alerts, stage=EveryIncident(default_config())))
    got = run(alerts)
    assert wire(got) == want
    assert got[-1].incident == got[0].incident and got[-1].members == ["st", "bw250"]
