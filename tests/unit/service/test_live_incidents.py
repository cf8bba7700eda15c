"""The service's /incidents page (pipeline/service/app.py, liveview.py): computed by the loop
between turns from the incident stages of the fleet-stage tasks it holds, served by its HTTP
endpoint beside /metrics; "off" where no task runs an incident stage."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.retry import Backoff
from pipeline.bus.telemetry import per_host_messages
from pipeline.incidents import IncidentStage, default_config
from pipeline.protocols import IncidentSource
from pipeline.service.app import Service, open_incidents
from pipeline.service.config import load_config_text
from pipeline.service.fleet import FleetTask
from pipeline.service.liveview import LoopQuery
from pipeline.service.state import MemoryStateStore
from producers.sim.simulator import Simulator
from tests.factories import Clock
from tests.unit.incidents.factories import run, two_open_incidents

RULES = str(Path(__file__).resolve().parents[3] / "rules")
KEY = b"unit-test-state-key-0123456789ab"
HOSTILE = "<script>alert(1)</script>"


# -- the loop's answers ----------------------------------------------------------------------


def ask_in_thread(q: LoopQuery, timeout: float = 5.0) -> tuple[threading.Thread, list]:
    got: list = []

    def ask() -> None:
        try:
            got.append(q.ask(timeout))
        except BaseException as e:  # noqa: BLE001 - the test looks at what was raised
            got.append(e)

    t = threading.Thread(target=ask)
    t.start()
    deadline = time.monotonic() + 5
    while not q.pending() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert q.pending()
    return t, got


def test_the_loop_computes_only_when_asked_and_once_for_all_waiting() -> None:
    calls = []
    q = LoopQuery(lambda: calls.append(1) or len(calls))
    q.answer()
    q.answer()
    assert calls == []                                   # nobody asked: the loop pays nothing
    waiting = [ask_in_thread(q) for _ in range(3)]
    q.answer()
    for t, got in waiting:
        t.join(5)
        assert got == [1]
    assert calls == [1] and not q.pending()
    t, got = ask_in_thread(q)
    q.answer()
    t.join(5)
    assert got == [2]


def test_an_answer_fresher_than_fresh_for_is_given_again_without_the_loop() -> None:
    """A client asking in a loop cost the loop one page computation a turn; within ``fresh_for``
    of the last the answer is given again, and after it the loop computes anew."""
    calls, now = [], [100.0]
    q = LoopQuery(lambda: calls.append(1) or len(calls), fresh_for=1.0, clock=lambda: now[0])
    t, got = ask_in_thread(q)
    q.answer()
    t.join(5)
    now[0] += 0.5
    assert [q.ask(0.01) for _ in range(50)] == [1] * 50 and calls == [1] and not q.pending()
    now[0] += 0.6
    t, got = ask_in_thread(q)
    q.answer()
    t.join(5)
    assert got == [2] and calls == [1, 1]

def test_no_answer_in_time_is_a_timeout_and_a_failure_reaches_the_asker_not_the_loop() -> None:
    q: LoopQuery[int] = LoopQuery(lambda: 1 // 0)
    with pytest.raises(TimeoutError):
        q.ask(0.05)
    t, got = ask_in_thread(q)
    q.answer()                                           # does not raise in the loop
    t.join(5)
    assert isinstance(got[0], ZeroDivisionError)


# -- the service -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def telemetry() -> list[tuple[bytes, bytes]]:
    sim = Simulator(hosts=2, duration=60, seed=5, scenario="mixed")
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


def services(telemetry, incidents: bool = False) -> tuple[Service, Service]:
    """Both stages on the in-memory bus; ``incidents`` off by default: the tests below give the
    fleet tasks incident stages of their own making."""
    bus = MemoryBus(partitions=2)
    topics = Topics("t")
    p = bus.producer()
    for key, value in telemetry:
        p.send(topics.telemetry, value, key)
    cfg = load_config_text(json.dumps({
        "kafka": {"prefix": "t", "max_poll_records": 20, "partitions": 2},
        "http": {"host": "127.0.0.1", "port": 0},
        "service": {"rules": [RULES], "models": "auto", "flush_idle_s": 3, "incidents": incidents}}), env={})
    clock = Clock()

    def make(stage: str) -> Service:
        group, topic = ("svc", topics.telemetry) if stage == "host" else ("svc.fleet", topics.fleet)
        state = MemoryStateStore(bus, topics.state, group, topic, key=KEY)
        return Service(cfg, consumer=bus.group_consumer(topic, group), producer=bus.producer(), state=state,
                       clock=clock, backoff=Backoff(sleep=lambda s: None), stage=stage)

    return make("host"), make("fleet")


def with_incidents(task: FleetTask, stage: IncidentStage) -> None:
    # What the fleet-stage task holds once it runs the incident stage: its `incidents`.
    task.incidents = stage


def test_incidents_are_off_until_a_fleet_task_runs_an_incident_stage(telemetry) -> None:
    host, fleet = services(telemetry)
    for _ in range(10):
        host.step()
        fleet.step()
    assert fleet.parts and all(isinstance(ps.pipe, FleetTask) for ps in fleet.parts.values())
    assert open_incidents([host, fleet]) is None
    stage = IncidentStage(default_config())
    run(two_open_incidents(), stage=stage)
    task = next(iter(fleet.parts.values())).pipe
    assert isinstance(task, FleetTask)
    with_incidents(task, stage)
    assert isinstance(task, IncidentSource) and fleet.incident_stages() == [stage] and host.incident_stages() == []
    assert open_incidents([host, fleet]) == stage.open_incidents()
    for s in (host, fleet):
        s.shutdown()


def test_with_incidents_on_every_fleet_task_runs_the_stage_the_page_reads(telemetry) -> None:
    # service.incidents (the default): the fleet tasks' own stages, fed by the service.
    host, fleet = services(telemetry, incidents=True)
    for _ in range(10):
        host.step()
        fleet.step()
    stages = fleet.incident_stages()
    assert fleet.parts and len(stages) == len(fleet.parts) and host.incident_stages() == []
    assert all(isinstance(ps.pipe, FleetTask) and ps.pipe.incidents is not None for ps in fleet.parts.values())
    assert open_incidents([host, fleet]) == [e for st in stages for e in st.open_incidents()]
    for s in (host, fleet):
        s.shutdown()


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        return r.read()


def test_the_running_service_serves_its_open_incidents_beside_metrics(telemetry) -> None:
    host, fleet = services(telemetry)
    stage = IncidentStage(default_config())
    attach = threading.Event()
    seen: dict[str, object] = {}
    inner = fleet.consumer.poll

    def poll(timeout_s: float, max_records: int):
        # On the loop thread, as the fleet-stage tasks would: each its own incident stage, the
        # first one's with two open incidents.
        if attach.is_set() and fleet.parts and not fleet.incident_stages():
            for i, ps in enumerate(fleet.parts.values()):
                assert isinstance(ps.pipe, FleetTask)
                with_incidents(ps.pipe, stage if i == 0 else IncidentStage(default_config()))
            run(two_open_incidents(host=HOSTILE), stage=stage)
            seen["tasks"] = len(fleet.incident_stages())
        return inner(timeout_s, max_records)

    fleet.consumer.poll = poll

    def client() -> None:
        try:
            deadline = time.monotonic() + 30
            while host.http is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert host.http is not None
            port = host.http.port
            seen["off"] = get(port, "/incidents")
            seen["off_json"] = json.loads(get(port, "/incidents.json"))
            attach.set()
            while time.monotonic() < deadline:
                data = json.loads(get(port, "/incidents.json"))
                if data["enabled"]:
                    seen["json"] = data
                    break
                time.sleep(0.05)
            seen["page"] = get(port, "/incidents")
            seen["metrics"] = get(port, "/metrics")
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            seen["error"] = e
        finally:
            host.request_stop()
            fleet.request_stop()

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    t = threading.Thread(target=client)
    t.start()
    try:
        host.run(fleet)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        t.join(30)
    assert "error" not in seen, seen.get("error")
    assert b"Incidents are off" in seen["off"] and seen["off_json"]["enabled"] is False
    data = seen["json"]
    want = stage.open_incidents()
    assert [e["incident"] for e in data["incidents"]] == [e.incident for e in want]
    assert len(want) == 2 and seen["tasks"] == 2
    page = seen["page"]
    assert isinstance(page, bytes)
    for e in want:
        assert e.incident.encode() in page
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in page and b"<script>" not in page
    assert b"gpuwarden_records_total" in seen["metrics"]
