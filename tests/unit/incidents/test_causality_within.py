"""A causality entry's ``within``: a cause explains what follows it within that time, not a later
fault that comes while its incident still fires (a second NIC port down twenty minutes after the
first port's last fall; a GPU lost minutes after a PCIe error on another GPU). Each test of the
change failed before it (docs/rules.md, incidents: `within`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import StateError
from pipeline.incidents import IncidentStage, default_config, parse_config
from pipeline.incidents.events import OPENED, IncidentEvent
from pipeline.incidents.stagestate import FIELDS
from pipeline.schema import AlertEvent
from tests.factories import fuzz_examples
from tests.unit.incidents.factories import alert, resolved, run


def _opened(events: list[IncidentEvent]) -> list[tuple[str, int | None]]:
    return [(e.root.rule, e.gpu) for e in events if e.state == OPENED]


def _incident_of(events: list[IncidentEvent], alert_id: str) -> str:
    """The incident whose event names ``alert_id`` among its members."""
    return next(e.incident for e in reversed(events) if alert_id in e.members)


MLX5_7 = {"device": "mlx5_7", "port": 1}
MLX5_4 = {"device": "mlx5_4", "port": 1}


def _flapping_port(host: str = "n1", first: str = "network_link_errors") -> list[AlertEvent]:
    """One NIC port (mlx5_7) that falls every two minutes for six minutes: its alerts, host-level;
    ``first``: the rule of its first alert, which roots its incident."""
    out = [alert(first, 0.0, host, None, **MLX5_7)]
    if first != "network_port_down":
        out.append(alert("network_port_down", 0.0, host, None, **MLX5_7))
    for t in (120.0, 240.0, 360.0):
        out += [resolved(out[-1], t - 100.0), alert("network_port_down", t, host, None, **MLX5_7)]
    out.append(alert("network_port_flapping", 380.0, host, None, **MLX5_7))  # still firing long after
    return out


def _other_port(t: float, rule: str = "network_port_down") -> AlertEvent:
    return alert(rule, t, "n1", None, id=f"{rule}/n1/mlx5_4/{t:g}", **MLX5_4)


def test_a_flapping_port_stays_one_incident_and_another_port_later_is_its_own() -> None:
    flap = _flapping_port()
    later = _other_port(360.0 + 20 * 60.0)
    events = run(flap + [later])
    # Before: the first port's flap count still fired, so the second port joined its incident.
    assert _opened(events) == [("network_link_errors", None), ("network_port_down", None)]
    assert _incident_of(events, later.id) != _incident_of(events, flap[0].id)
    # Every fall of the flapping port (two minutes apart) joined its one incident.
    assert {_incident_of(events, a.id) for a in flap if a.state == "firing"} == {_incident_of(events, flap[0].id)}


def test_another_port_is_no_recurrence_of_an_incident_rooted_at_its_rule() -> None:
    # The first port's incident is rooted at network_port_down, the rule of the other port's
    # alert: before, it rejoined it as a host-level fault back before its incident resolved.
    flap = _flapping_port(first="network_port_down")
    later = _other_port(380.0 + 20 * 60.0)
    # The first port falls again ten minutes later still: a recurrence of its own incident.
    again = alert("network_port_down", 380.0 + 30 * 60.0, "n1", None, **MLX5_7)
    events = run(flap + [later, again])
    assert _opened(events) == [("network_port_down", None), ("network_port_down", None)]
    assert _incident_of(events, later.id) != _incident_of(events, flap[0].id) == _incident_of(events, again.id)


def test_a_gpu_lost_minutes_after_a_pcie_error_on_another_gpu_is_its_own_incident() -> None:
    pcie = alert("pcie_aer_fatal", 0.0, "n1", 5)
    off = alert("gpu_fallen_off_bus", 847.0, "n1", 1)
    lost = alert("builtin_gpu_lost", 878.0, "n1", 1)
    events = run([pcie, off, lost])  # the PCIe alert still fires
    assert _opened(events) == [("pcie_aer_fatal", 5), ("gpu_fallen_off_bus", 1)]
    assert _incident_of(events, lost.id) == _incident_of(events, off.id) != _incident_of(events, pcie.id)


def test_the_gpu_a_pcie_error_cuts_off_joins_its_incident() -> None:
    pcie = alert("pcie_aer_fatal", 0.0, "n1", 5)
    off = alert("gpu_fallen_off_bus", 3.0, "n1", 4)  # behind the same bridge
    lost = alert("builtin_gpu_lost", 78.0, "n1", 4)  # one absence later at 30 s sampling
    events = run([pcie, off, lost])
    assert _opened(events) == [("pcie_aer_fatal", 5)]


def test_within_is_measured_from_the_latest_alert_of_a_cause_rule() -> None:
    first = alert("pcie_aer_fatal", 0.0, "n1", 5)
    again = alert("pcie_aer_nonfatal", 200.0, "n1", 5)  # the path errs again
    off = alert("gpu_fallen_off_bus", 280.0, "n1", 2)  # 80 s after it, 280 s after the first
    events = run([first, resolved(first, 30.0), again, off])
    assert _opened(events) == [("pcie_aer_fatal", 5)]


@settings(max_examples=fuzz_examples(40), deadline=None)
@given(gap=st.floats(min_value=0.0, max_value=900.0, allow_nan=False).map(lambda g: round(g, 1)))
def test_a_later_gpu_joins_the_pcie_incident_exactly_when_within_two_minutes(gap: float) -> None:
    pcie = alert("pcie_aer_fatal", 0.0, "n1", 5)
    off = alert("gpu_fallen_off_bus", gap, "n1", 1)
    events = run([pcie, off])
    joined = _incident_of(events, off.id) == _incident_of(events, pcie.id)
    assert joined == (gap <= 120.0), (gap, _opened(events))


@settings(max_examples=fuzz_examples(40), deadline=None)
@given(gap=st.floats(min_value=1.0, max_value=1800.0, allow_nan=False).map(lambda g: round(g, 1)))
def test_another_port_joins_the_nic_incident_exactly_when_within_five_minutes_of_its_last_fall(gap: float) -> None:
    flap = _flapping_port()
    last_fall = 380.0  # the flap count's alert, the latest of a cause rule
    later = _other_port(last_fall + gap)
    events = run(flap + [later])
    joined = _incident_of(events, later.id) == _incident_of(events, flap[0].id)
    assert joined == (gap <= 300.0), (gap, _opened(events))


def test_a_restored_stage_measures_within_as_the_uninterrupted_one() -> None:
    pcie = alert("pcie_aer_fatal", 0.0, "n1", 5)
    again = alert("pcie_aer_nonfatal", 200.0, "n1", 5)
    rest = [alert("gpu_fallen_off_bus", 290.0, "n1", 2), alert("gpu_fallen_off_bus", 500.0, "n1", 3)]
    whole = run([pcie, resolved(pcie, 30.0), again, *rest])

    first = IncidentStage(default_config())
    events = run([pcie, resolved(pcie, 30.0), again], stage=first)
    second = IncidentStage(default_config())
    second.load_state(json.loads(json.dumps(first.to_state())))
    events += run(rest, stage=second)
    assert [(e.incident, e.state, e.changes) for e in events] == [(e.incident, e.state, e.changes) for e in whole]
    assert _opened(events) == [("pcie_aer_fatal", 5), ("gpu_fallen_off_bus", 3)]


def test_a_state_written_before_cause_at_loads_and_measures_from_the_last_alert() -> None:
    pcie = alert("pcie_aer_fatal", 0.0, "n1", 5)
    first = IncidentStage(default_config())
    run([pcie], stage=first)
    state = json.loads(json.dumps(first.to_state()))
    state["open"] = [row[: FIELDS.index("cause_at")] for row in state["open"]]  # the older rows
    second = IncidentStage(default_config())
    second.load_state(state)
    events = run([alert("gpu_fallen_off_bus", 100.0, "n1", 1)], stage=second)
    assert _opened(events) == []  # joined: 100 s after the incident's last alert


def test_a_restored_stage_knows_which_port_an_incident_is_about() -> None:
    flap = _flapping_port(first="network_port_down")
    first = IncidentStage(default_config())
    run(flap, stage=first)
    state = json.loads(json.dumps(first.to_state()))
    second = IncidentStage(default_config())
    second.load_state(state)
    events = run([_other_port(1580.0)], stage=second)
    assert _opened(events) == [("network_port_down", None)]
    bad = json.loads(json.dumps(state))
    bad["open"][0][FIELDS.index("where")] = [["port", "1"], ["device", "mlx5_7"]]  # out of order
    with pytest.raises(StateError, match="where"):
        IncidentStage(default_config()).load_state(bad)


def test_within_must_be_a_positive_duration() -> None:
    base = "causality:\n  - {name: a, cause: [x], explains: [y], within: %s}\n"
    for bad, says in (("soon", "'soon' is not a duration"), ("0s", "must be longer than 0s"), ("-5m", "")):
        cfg, diags = parse_config(base % bad, "inc.yaml")
        assert cfg is None
        shown = "\n".join(map(str, diags))
        assert "inc.yaml:2:" in shown and "causality a: within:" in shown and says in shown and "[I007]" in shown
    cfg, diags = parse_config(base % "90s", "inc.yaml")
    assert diags == [] and cfg is not None and cfg.causality[0].within == 90.0
    cfg, _ = parse_config("causality:\n  - {name: a, cause: [x], explains: [y]}\n", "inc.yaml")
    assert cfg is not None and cfg.causality[0].within is None


def test_the_alertmanager_export_says_within_is_not_expressible_there() -> None:
    from pipeline.incidents.amconfig import render

    text = render(default_config(), "rules/incidents.yaml")
    assert "#   nic_port: 1 inhibit rule(s), reach host; its within (300s) is not expressible" in text
    assert "#   nvlink_down: 1 inhibit rule(s), reach host\n" in text
