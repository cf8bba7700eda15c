"""A lull on ``<prefix>.fleet`` (pipeline/service/fleet.py, pipeline/fleetstage.py): every
telemetry partition's task final at once. The fleet task releases it at the mark where it comes
(not where its poll ends), every alert so far goes to the incident stage, and marks read again
after a restore leave the stage as its snapshot left it."""

from __future__ import annotations

from pipeline.engine import Engine, EngineConfig
from pipeline.incidents import IncidentStage, default_config
from pipeline.schema import AlertEvent, dcgm
from pipeline.service.fleet import FleetTask
from tests.factories import HEALTHY, T0
from tests.fleet_factories import GROUP, TOPIC, FLEET_KEY, alerts_body, envelope, fleet_message, mark_body, records_body

N = 2  # telemetry partitions


def _task(incidents: bool = False, records: bool = True) -> FleetTask:
    stage = IncidentStage(default_config()) if incidents else None
    engine = lambda: Engine(EngineConfig(), row_checks=[], tick_checks=[], screened=True)  # noqa: E731
    return FleetTask(engine, N, topic=TOPIC, group=GROUP, key=FLEET_KEY, incidents=stage, records=records)


def _records(sender: int, host: str, seconds: range) -> bytes:
    return envelope(records_body([dcgm(T0 + t, host, 0, HEALTHY) for t in seconds]), sender)


def _mark(sender: int, upto: float, final: bool = False) -> bytes:
    return envelope(mark_body(sender, upto, final, N), sender)


def _read(task: FleetTask, values: list[bytes], start: int = 0, poll: int = 1) -> None:
    """``values`` as fleet messages from offset ``start``, ``poll`` to a batch."""
    for i in range(0, len(values), poll):
        out = task.handle_guarded([fleet_message(v, start + i + j) for j, v in enumerate(values[i:i + poll])])
        assert out.dead == []


def test_rules_only_a_lull_waits_for_nothing_and_sends_every_alert_on():
    # No records come (rules only): no task is waited for, and the alerts of the tasks' idle
    # flushes, past their last marks, reach the incident stage at the lull.
    task = _task(incidents=True, records=False)
    alert = AlertEvent(id="a1", state="firing", fault="gpu_xid_critical", severity="critical",
                       rule="gpu_xid_critical", host="n0", gpu=0, ts=T0 + 12, started_at=T0 + 12, evidence={"xid": 48})
    _read(task, [_mark(0, T0 + 10), _mark(1, T0 + 15)])
    _read(task, [envelope(alerts_body([alert]), 0), _mark(0, T0 + 10, True), _mark(1, T0 + 15, True)], 2, poll=3)
    assert task.stage.resuming == {}
    assert [(e.state, e.members) for e in task.take_incidents()] == [("opened", ["a1"])]


def test_marks_read_again_after_a_restore_do_not_make_a_lull_that_never_was():
    # Partition 1 idles (final) and comes back; then partition 0 idles. Read again in one
    # poll from the checkpoint's offset, partition 1's old final mark meets partition 0's final
    # flag as the snapshot holds it: every task final, a lull that never happened, which would
    # release everything and drop the records read again after it.
    log = [
        _records(0, "d", range(0, 6)),
        _mark(0, T0 + 5),
        _records(0, "d", range(10, 41)),
        _records(1, "e", range(0, 31)),
        _mark(1, T0 + 9, True),
        _records(1, "e", range(31, 36)),
        _mark(1, T0 + 33),
        _mark(0, T0 + 5, True),
    ]
    first = _task()
    _read(first, log)
    assert first.stage.pending and first.stage.released == T0 + 33
    resume = first.checkpoint_offset(len(log))
    again = _task()
    again.restore(first.snapshot())
    _read(again, log[resume:], resume, poll=len(log))
    assert again.stage.released == first.stage.released and again.stage.pending == first.stage.pending
    assert again.stage.stats["late"] == 0


def test_a_mark_past_the_snapshots_is_new_even_at_an_offset_read_before():
    # The fleet topic made again (its offsets from 0) under a checkpoint of the old one: a mark
    # there at an offset before the snapshot's position, past its marks, is no mark read again.
    first = _task()
    _read(first, [_records(0, "d", range(0, 20)), _mark(0, T0 + 10), _records(1, "e", range(0, 20)),
                  _mark(1, T0 + 10)])
    again = _task()
    again.restore(first.snapshot())
    _read(again, [_records(0, "d", range(20, 40)), _mark(0, T0 + 30), _records(1, "e", range(20, 40)),
                  _mark(1, T0 + 30)])
    assert again.stage.released == T0 + 30
