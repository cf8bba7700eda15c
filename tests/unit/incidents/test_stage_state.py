"""The incident stage's whole state (open incidents, clock, history) as plain data: a stage
restored from it mid-stream says what one that never stopped says, and a forged state is refused."""

from __future__ import annotations

import copy

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import StateError
from pipeline.incidents import IncidentStage, default_config
from tests.factories import fuzz_examples
from tests.unit.incidents.factories import alert, alert_streams, resolved, run, wire


def _through_msgpack(stage: IncidentStage) -> IncidentStage:
    """A new stage from ``stage``'s state, carried as a checkpoint carries it."""
    new = IncidentStage(default_config())
    new.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(stage.to_state())))
    return new


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(alert_streams(), st.integers(0, 80))
def test_a_restore_mid_stream_gives_the_events_of_one_run(alerts, cut):
    whole = wire(run(alerts))
    first = IncidentStage(default_config())
    before = first.process(alerts[:cut])
    second = _through_msgpack(first)
    assert wire(second.open_incidents()) == wire(first.open_incidents())     # what the live view shows
    after = second.process(alerts[cut:])
    assert wire(before + after) == whole


def test_an_open_incident_survives_a_restore_and_takes_its_next_alert():
    a = alert("nvlink_xid74", 0, comm="c1")
    first = IncidentStage(default_config())
    (opened,) = first.process([a])
    second = _through_msgpack(first)
    assert second.open_count == 1
    ev = second.process([alert("nvlink_crc_errors", 5), resolved(a, 10)])
    assert [(e.incident, e.state, e.changes) for e in ev] == [(opened.incident, "updated", ["alert_joined"])]


def test_xid79_five_times_escalates_once_across_a_restore_between_the_third_and_fourth():
    hour = 3600.0
    seq = []
    for i in range(5):
        a = alert("gpu_fallen_off_bus", i * 4 * hour, id=f"x{i}", xid=79)
        seq += [a, resolved(a, i * 4 * hour + 60)]
    first = IncidentStage(default_config())
    before = first.process(seq[:6])
    after = _through_msgpack(first).process(seq[6:])
    assert [e.policy for e in before + after if e.policy == "xid79_repeat"] == ["xid79_repeat"]
    assert wire(before + after) == wire(run(seq))


def _state() -> dict:
    st_ = IncidentStage(default_config())
    st_.process([alert("nvlink_xid74", 0, comm="c1"), alert("hbm_sbe_burst", 1, "n2", 3)])
    return msgspec.msgpack.decode(msgspec.msgpack.encode(st_.to_state()))


def _forged(change) -> dict:
    s = copy.deepcopy(_state())
    change(s)
    return s


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: s.update(v=9), "not a version 1"),
    (lambda s: s.update(clock=float("nan")), "clock"),
    (lambda s: s["open"].append([1, 2]), "not a row"),
    (lambda s: s["open"][0].__setitem__(3, True), "gpu"),
    (lambda s: s["open"][0].__setitem__(0, "x" * 300), "id"),
    (lambda s: s["open"][0].__setitem__(7, ["m"] * 300), "members"),
    (lambda s: s["open"][1].__setitem__(9, s["open"][0][9]), "fires in two incidents"),
    (lambda s: s["open"].append(s["open"][0]), "twice"),
    (lambda s: s["open"][0].__setitem__(13, "soon"), "last_join"),
    (lambda s: s.update(history={"v": 0}), "history"),
    (lambda s: s["open"][0].__setitem__(20, "resolved"), "not opened or updated"),
    (lambda s: s["open"][0].__setitem__(22, ["alert_left"]), "changes"),
    (lambda s: s["open"][0].__setitem__(21, float("inf")), "updated_at"),
])
def test_a_forged_state_is_refused_naming_the_part_and_changes_nothing(change, says):
    stage = IncidentStage(default_config())
    (opened,) = stage.process([alert("gpu_xid_critical", 0, "n9", 1, xid=48)])
    with pytest.raises(StateError, match=says):
        stage.load_state(_forged(change))
    assert stage.open_count == 1
    ev = stage.process([alert("gpu_xid_critical", 2, "n9", 1, id="more", xid=48)])
    assert [e.incident for e in ev] == [opened.incident]


def test_more_open_incidents_than_the_limit_are_refused():
    stage = IncidentStage(default_config(), max_open=1)
    with pytest.raises(StateError, match="more than the limit"):
        stage.load_state(_state())
