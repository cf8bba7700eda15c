"""What the fleet stage does not give its models is counted in the service's metrics
(``gpuwarden_fleet_dropped_records_total{why}``), and its buffer bound is the config's."""

from __future__ import annotations

import math

import msgspec
from pathlib import Path

from pipeline.detection import build_detector
from pipeline.service.fleet import DROPPED, FORCED, FleetTask
from pipeline.service.fleetwire import Envelope
from pipeline.service.forwarded import Columns
from pipeline.service.metrics import Metrics
from pipeline.topology import Topology
from tests.factories import T0, sample
from tests.unit.service.service_factories import services, sim_services

RULES = str(Path(__file__).resolve().parents[3] / "rules")


def _task(**kw) -> FleetTask:
    det, _ = build_detector([RULES], "auto")
    assert isinstance(det, Topology)
    return FleetTask(det.make_fleet_engine, 1, **kw)


def _dropped(task: FleetTask) -> dict[str, int]:
    """What the service's metrics get (Service._process): records not given to the models since
    the last call, by why, and forced releases."""
    return {why: n for why in (*DROPPED, FORCED) if (n := task.take(why))}


def test_duplicates_and_late_records_are_counted_by_why():
    task = _task()
    recs = [sample(t, "n1") for t in range(10)]
    task.stage.feed(recs[:6])
    task.stage.mark(0, T0 + 4)
    task.stage.advance()
    task.stage.feed(recs)              # an upstream replay: 0-3 released (late), 4-5 buffered again
    task.stage.flush()
    assert _dropped(task) == {"late": 4, "duplicate": 2}
    assert _dropped(task) == {}   # counted once


def test_the_buffer_bound_is_the_tasks_and_forced_releases_are_counted():
    task = _task(max_buffer=20)
    task.stage.n_upstream = 2
    task.stage.feed([sample(t, "n1") for t in range(30)])
    task.stage.mark(0, T0 + 25)
    task.stage.mark(1, -math.inf)
    task.stage.advance()
    assert _dropped(task)["forced"] >= 1
    assert _task().stage.max_buffer == 2_000_000


def test_the_service_counts_what_an_upstream_replay_sends_again():
    bus, host, fleet, clock = sim_services(60)
    for _ in range(40):
        host.step()
        fleet.step()
        clock.t += 0.5
    topic = host.topics.fleet
    # The records, forwarded again (each in its envelope, MAC and all: a replay by the host stage).
    again = [m for m in bus.messages(topic) if msgspec.msgpack.decode(m.value, type=Envelope).body[:1] != b"{"]
    p = bus.producer()
    for m in again:
        p.send(topic, m.value, m.key, m.partition)
    for _ in range(20):                # the host stage goes idle, marks final: all released
        host.step()
        fleet.step()
        clock.t += 0.5
    assert fleet.metrics.fleet_records._value.get() > 0

    def dropped(why: str) -> float:
        return fleet.metrics.fleet_dropped.labels(why)._value.get()

    # Every record sent again is dropped, none reaches the models twice: also those of the last
    # second, which the engines' released (a tick's start) did not cover after the idle flush.
    assert dropped("late") + dropped("duplicate") == sum(
        _records_in(msgspec.msgpack.decode(m.value, type=Envelope).body) for m in again
    )
    assert dropped("late") > 0


def test_the_service_metric_has_a_series_per_why():
    m = Metrics()
    m.fleet_dropped.labels("late").inc(3)
    text = "\n".join(f"{s.name}{s.labels} {s.value}" for mt in m.registry.collect() for s in mt.samples)
    assert "gpuwarden_fleet_dropped_records_total{'why': 'late'} 3.0" in text


def test_incident_events_are_counted_by_state_on_metrics():
    # gpuwarden_incidents_total{state}: what the fleet stage sent to <prefix>.incidents.
    bus, host, fleet, clock = sim_services(300)
    for _ in range(400):
        host.step()
        fleet.step()
        clock.t += 0.5
    sent = [msgspec.json.decode(m.value) for m in bus.messages(fleet.topics.incidents)]
    assert sent
    for state in ("opened", "updated", "resolved"):
        assert fleet.metrics.incidents.labels(state)._value.get() == sum(e["state"] == state for e in sent)
    # The stages a view of open incidents reads: the fleet partitions', none in the host stage.
    stages = fleet.incident_stages()
    assert stages and host.incident_stages() == []
    opened = {e["incident"] for e in sent if e["state"] == "opened"}
    resolved = {e["incident"] for e in sent if e["state"] == "resolved"}
    assert sum(s.open_count for s in stages) == len(opened - resolved)


def _records_in(body: bytes) -> int:
    """How many records a records message's body (pipeline/service/forwarded.py) holds."""
    cols = msgspec.msgpack.decode(body, type=Columns)
    return cols.n + len(cols.other)


def test_alerts_the_incident_side_drops_are_counted_by_why():
    # An alert past the incident stage's max_open, and one for a second the feed had released
    # (a host stage's partition back from an idle flush): both were counted only in stats that
    # nothing read, and left <prefix>.incidents without a word.
    from pipeline.engine import Engine
    from pipeline.incidents import IncidentStage, default_config
    from pipeline.schema import AlertEvent
    from tests.fleet_factories import alerts_body, envelope, fleet_message, mark_body

    def alert(host: str, t: float) -> AlertEvent:
        return AlertEvent(id=f"a-{host}", state="firing", fault="gpu_fallen_off_bus", severity="critical",
                          rule="gpu_fallen_off_bus", host=host, gpu=0, ts=T0 + t, started_at=T0 + t)

    stage = IncidentStage(default_config(), max_open=1)
    task = FleetTask(lambda: Engine(row_checks=[], tick_checks=[], screened=True), 1, topic="t.fleet",
                     group="svc", key=None, incidents=stage, records=False)
    msgs = [envelope(alerts_body([alert("n1", 1), alert("n2", 2)]), 0, key=None),
            envelope(mark_body(0, T0 + 10, n=1), 0, key=None)]
    task.handle_guarded([fleet_message(m, i) for i, m in enumerate(msgs)])
    task.handle_guarded([fleet_message(envelope(alerts_body([alert("n3", 5)]), 0, key=None), 2)])
    assert [e.host for e in task.take_incidents()] == ["n1"]
    assert task.take_incident_drops() == {"too_many_open": 1, "late": 1}
    assert task.take_incident_drops() == {}   # counted once
    m = Metrics()
    m.incident_dropped.labels("late").inc(1)
    text = "\n".join(f"{s.name}{s.labels} {s.value}" for mt in m.registry.collect() for s in mt.samples)
    assert "gpuwarden_incident_alerts_dropped_total{'why': 'late'} 1.0" in text


def test_every_assigned_partition_has_a_lag_series_also_one_without_data():
    # Found by an audit: gpuwarden_consumer_lag had series only for partitions that had sent
    # something, though docs/operations.md promises one for each assigned partition.
    from pipeline.bus.telemetry import per_host_messages
    from tests.factories import Clock

    one_host = [sample(t, "n1") for t in range(20)]
    telemetry = list(per_host_messages(one_host))
    clock = Clock()
    bus, host, fleet = services(telemetry, clock)
    for _ in range(30):
        host.step()
        fleet.step()
        clock.t += 0.5
    assigned = sorted(host.parts)
    assert len(assigned) == 2  # one holds n1's telemetry, the other nothing
    series = {s.labels["partition"]: s.value for mt in host.metrics.registry.collect()
              for s in mt.samples if s.name == "gpuwarden_consumer_lag"}  # fmt: skip
    assert set(series) == {str(p) for p in assigned}
    assert all(v == 0 for v in series.values())
    # Retention emptied the partition nothing was read from: its end is 5, its first offset 5.
    (idle,) = [p for p in assigned if host.parts[p].next_offset is None]
    ends, begins = host.consumer.end_offsets, host.consumer.beginning_offsets
    host.consumer.end_offsets = lambda ps: {**ends(ps), **({idle: 5} if idle in ps else {})}
    host.consumer.beginning_offsets = lambda ps: {**begins(ps), **({idle: 5} if idle in ps else {})}
    clock.t += 10
    host.step()
    assert host.metrics.lag.labels(str(idle))._value.get() == 0


def test_the_fleet_service_counts_the_messages_it_read():
    # The incident drops' loop reused the name of the batch's message count: a batch in which
    # the incident side dropped an alert counted that many messages read, not the batch's.
    bus, host, fleet, clock = sim_services(60)
    for _ in range(60):
        host.step()
        fleet.step()
        for ps in fleet.parts.values():  # an alert dropped in every batch (a late one, say)
            if isinstance(ps.pipe, FleetTask):
                ps.pipe.take_incident_drops = lambda: {"late": 1}
        clock.t += 0.5
    assert fleet.totals["messages"] == len(bus.messages(host.topics.fleet)) > 0
    assert fleet.metrics.incident_dropped.labels("late")._value.get() > 0
