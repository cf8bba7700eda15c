"""The service's two stages on the in-memory bus: host stage -> <prefix>.fleet -> fleet stage.

With the models on, the alerts of any number of host- and fleet-stage replicas, with members
joining and crashing mid-stream, are exactly those of one in-process replay of the same
messages (pipeline/topology.py), and so are the incident events on <prefix>.incidents (the
replay's incident stage, fed through its AlertFeed); with rules only too. The same against a
real broker and real processes: tests/faults/test_service_stages.py.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from pathlib import Path

import msgspec
import pytest

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.base import Message
from pipeline.bus.retry import Backoff
from pipeline.bus.telemetry import COLUMNAR, per_host_messages, per_host_wire
from pipeline.detection import build_detector
from pipeline.incidents import IncidentStage, default_config
from pipeline.replay import incident_watermark
from pipeline.runner import Pipeline
from pipeline.service.app import Service
from pipeline.service.config import load_config_text
from pipeline.service.forwarded import Columns
from pipeline.service.state import MemoryStateStore
from pipeline.service.peers import PEER_ENVELOPE
from producers.sim.simulator import Simulator
from tests.factories import Clock

RULES = str(Path(__file__).resolve().parents[3] / "rules")
KEY = b"unit-test-state-key-0123456789ab"
GROUP = "svc"


@pytest.fixture(scope="module")
def telemetry() -> list[tuple[bytes, bytes]]:
    # Eight hosts, ten minutes of the mixed scenario: a straggler on a communicator spanning
    # every host, a host whose NCCL bandwidth sags, and cohort-model (counter_rate) alerts.
    sim = Simulator(hosts=8, duration=600, seed=3, scenario="mixed")
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


def _replay(telemetry, models: str) -> tuple[list[dict], list[dict]]:
    """One process, everything in order: the alerts and incident events `gpuwarden replay
    --incidents-out` of the recording writes."""
    det, diags = build_detector([RULES], models)
    assert det is not None, diags
    pipe = Pipeline(det)
    stage = IncidentStage(default_config(RULES))
    feed = stage.feed()
    out, incidents = [], []
    for i in range(0, len(telemetry), 64):
        msgs = [Message("rec", -1, j, k, v) for j, (k, v) in enumerate(telemetry[i:i + 64], start=i)]
        got = pipe.handle(msgs).alerts
        feed.add(got)
        out += got
        incidents += stage.process(feed.release(incident_watermark(det)))
    got = pipe.flush().alerts
    feed.add(got)
    out += got
    incidents += stage.process(feed.flush())
    return [msgspec.to_builtins(a) for a in out], [msgspec.to_builtins(e) for e in incidents]


@pytest.fixture(scope="module")
def replayed(telemetry) -> tuple[list[dict], list[dict]]:
    return _replay(telemetry, "auto")


@pytest.fixture(scope="module")
def reference(replayed) -> list[dict]:
    return replayed[0]


@pytest.fixture(scope="module")
def reference_incidents(replayed) -> list[dict]:
    return replayed[1]


class Fleet:
    def __init__(self, telemetry, max_poll_records: int = 16, models: str = "auto", shard_models: bool = False,
                 engine: dict | None = None) -> None:
        self.bus = MemoryBus(partitions=4)
        self.topics = Topics("t")
        p = self.bus.producer()
        for key, value, *headers in telemetry:  # (key, value) or, columnar, (key, value, headers)
            p.send(self.topics.telemetry, value, key, headers=headers[0] if headers else None)
        self.cfg = load_config_text(json.dumps({
            "kafka": {"prefix": "t", "max_poll_records": max_poll_records, "partitions": 4},
            "service": {"rules": [RULES], "models": models, "flush_idle_s": 3, "checkpoint_interval_s": 5,
                        "shard_models": shard_models},
            "engine": engine or {}}),
            env={})
        self.clock = Clock()

    def service(self, stage: str) -> Service:
        group, topic = (GROUP, self.topics.telemetry) if stage == "host" else (GROUP + ".fleet", self.topics.fleet)
        state = MemoryStateStore(self.bus, self.topics.state, group, topic, key=KEY)
        return Service(self.cfg, consumer=self.bus.group_consumer(topic, group), producer=self.bus.producer(),
                       state=state, clock=self.clock, backoff=Backoff(sleep=lambda s: None), stage=stage)

    def step(self, *services: Service) -> None:
        for s in services:
            s.step()
        self.clock.t += 0.5

    def idle(self, services: list[Service]) -> bool:
        for s in services:
            for p, ps in s.parts.items():
                if s.consumer.end_offsets([p])[p] != (ps.next_offset or 0):
                    return False
        hosts = [s for s in services if s.stage == "host"]
        return all(not ps.pipe.pending and ps.outbox.final_sent()
                   for s in hosts for ps in s.parts.values()) and sum(len(s.parts) for s in hosts) == 4

    def alerts(self) -> list[dict]:
        return [msgspec.json.decode(m.value) for m in self.bus.messages(self.topics.alerts)]

    def incidents(self) -> list[dict]:
        return [msgspec.json.decode(m.value) for m in self.bus.messages(self.topics.incidents)]


def _ids(alerts: list[dict]) -> set[tuple[str, str]]:
    return {(a["id"], a["state"]) for a in alerts}


def _events(incidents: list[dict]) -> set[str]:
    """Incident events as comparable wholes: every field, so any difference in grouping, order,
    severity, action or members shows. Sent again after a crash, an event is the same one."""
    return {json.dumps(e, sort_keys=True) for e in incidents}


def _run(f: Fleet, services: list[Service], steps: int = 4000, events: dict | None = None) -> None:
    events = events or {}
    for i in range(steps):
        if i in events:
            events[i](services)
        f.step(*services)
        if i > max(events, default=0) and f.idle(services):
            for _ in range(8):      # the fleet stage reads the last marks
                f.step(*services)
            break
    else:
        raise AssertionError("the stages did not drain")
    for s in services:
        s.shutdown()


def test_the_reference_has_cross_host_model_alerts(reference):
    detectors = {a["labels"].get("detector") for a in reference if a["labels"].get("source") == "model"}
    assert {"nccl_straggler", "nccl_busbw", "counter_rate"} <= detectors


# One of each, and more replicas of each stage than the other has (2 and 2 proved nothing more;
# members joining and crashing: the next test).
@pytest.mark.parametrize(("hosts", "fleets"), [(1, 1), (4, 3)])
def test_any_number_of_replicas_give_the_alerts_of_one_replay(telemetry, reference, reference_incidents, hosts,
                                                               fleets):
    f = Fleet(telemetry)
    services = [f.service("host") for _ in range(hosts)] + [f.service("fleet") for _ in range(fleets)]
    _run(f, services)
    got = f.alerts()
    assert _ids(got) == _ids(reference)
    incidents = f.incidents()
    assert len({e["incident"] for e in reference_incidents}) >= 3
    assert _events(incidents) == _events(reference_incidents)
    assert len(incidents) == len(reference_incidents)      # no crash: each event once
    assert any(a["labels"].get("source") == "model" for a in got)
    # Records and marks go to the one fleet key's partition: the others hold nothing to release.
    assert len({m.partition for m in f.bus.messages(f.topics.fleet)}) == 1
    # The default models' DCGM ones score a host's rows early (its NCCL ones judge them when the
    # tick is whole): the marks name the hosts released ahead.
    assert any(b'"hosts":{"' in m.value for m in f.bus.messages(f.topics.fleet))



def test_a_host_limit_sized_for_a_partition_holds_the_fleet_stage_too(telemetry, reference):
    # engine.max_hosts bounds each host stage's engine to one telemetry partition's hosts; the
    # fleet stage's engine keeps every host of the fleet, so its bound is that times the
    # partitions, and it refuses no host a host stage let through.
    f = Fleet(telemetry)
    per_partition: dict[int, set] = {}
    for m in f.bus.messages(f.topics.telemetry):
        per_partition.setdefault(m.partition, set()).add(m.key)
    limit = max(len(h) for h in per_partition.values())
    assert sum(len(h) for h in per_partition.values()) > limit
    f = Fleet(telemetry, engine={"max_hosts": limit})
    _run(f, [f.service("host"), f.service("fleet")])
    assert _ids(f.alerts()) == _ids(reference)
    assert not [m for m in f.bus.messages(f.topics.dlq) if b'"reason":"entity_limit"' in m.value]

@pytest.mark.slow
def test_the_host_stage_runs_a_hosts_rows_before_the_rest_of_the_tick_with_the_same_alerts(telemetry, reference):
    # The host stage's engines release each host as soon as it is complete for a tick
    # (Engine.release_hosts): read 3 messages a poll, ticks are cut between hosts, and the
    # alerts are still the replay's.
    f = Fleet(telemetry, max_poll_records=3)
    host, fleet = f.service("host"), f.service("fleet")
    made = []
    new_engine = host._new_engine
    host._new_engine = lambda p: made.append(new_engine(p)) or made[-1]
    _run(f, [host, fleet], steps=20000)
    assert _ids(f.alerts()) == _ids(reference)
    assert made and all(e.host.release_hosts and e.host.host_local for e in made)
    assert sum(e.host.stats["early_releases"] for e in made) > 100


@pytest.fixture(scope="module")
def phased() -> list[tuple[bytes, bytes]]:
    # Hosts at their own phases of the second, with jitter, a skewed, a late and a joining host
    # and a fleet-wide power cap: each host's message sent on its own, as exporters do.
    sim = Simulator(hosts=8, duration=300, seed=5, scenario="mixed_fleet")
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


@pytest.mark.slow
@pytest.mark.parametrize("shard_models", [False, True])
def test_the_fleet_stage_runs_a_hosts_rows_early_with_the_replays_alerts(phased, shard_models):
    # The default models: the fleet stage (or each shard) runs a host's rows of a tick through
    # the DCGM models once the marks say its task released them (Mark.hosts); the NCCL models
    # judge them once the tick is whole. Each host's message is read on its own, a step of the
    # loop apart, as a paced fleet sends them; the fleet replica crashes mid-stream and another
    # takes its partitions from their checkpoints.
    models = "auto"
    reference, reference_incidents = _replay(phased, models)
    sources = {a["labels"].get("detector") for a in reference if a["labels"].get("source") == "model"}
    assert "nccl_straggler" in sources and "counter_rate" in sources
    f = Fleet([], models=models, shard_models=shard_models)
    made: list = []

    def fleet_replica() -> Service:
        s = f.service("fleet")
        s._new_part = lambda p, now, new=s._new_part: made.append(new(p, now)) or made[-1]
        return s
    services = [f.service("host"), fleet_replica()]
    producer = f.bus.producer()
    for i, (key, value) in enumerate(phased):
        producer.send(f.topics.telemetry, value, key)
        f.step(*services)
        if i == len(phased) // 2:
            victim = services.pop()
            victim.consumer.crash()
            services.append(fleet_replica())
    _run(f, services, steps=4000)
    got = f.alerts()
    assert _ids(got) == _ids(reference)
    assert _events(f.incidents()) == _events(reference_incidents)
    assert len(made) >= (8 if shard_models else 2) and all(ps.pipe.stage.engine().host_local for ps in made)
    assert sum(ps.pipe.stage.stats["early"] for ps in made) > 1000
    # ... and the NCCL models judged such rows when their tick was whole. An engine's counts
    # ride in its checkpoint, so each partition's last owner holds the run's.
    last = {ps.partition: ps for ps in made}
    assert sum(e.stats["rows.deferred"] for ps in last.values() for e in ps.pipe.stage.engines.values()) > 1000
    assert services[-1].metrics.fleet_early._value.get() > 0
    assert any(b'"hosts":{"' in m.value for m in f.bus.messages(f.topics.fleet))


# With model shards a third fleet replica joins, so the crash leaves two holding the four shards.
@pytest.mark.parametrize(("shard_models", "fleets_joining", "crash_at"), [(False, 1, 120), (True, 2, 150)])
def test_replicas_joining_and_crashing_mid_stream_change_nothing(telemetry, reference, reference_incidents,
                                                                shard_models, fleets_joining, crash_at):
    f = Fleet(telemetry, shard_models=shard_models)
    services = [f.service("host"), f.service("fleet")]

    def join(svcs: list[Service]) -> None:
        svcs += [f.service("host")] + [f.service("fleet") for _ in range(fleets_joining)]

    def crash(svcs: list[Service]) -> None:
        # kill -9 of one replica of each stage: no callback, nothing saved; the others restore
        # its partitions' last checkpoints and replay from there.
        for stage in ("host", "fleet"):
            victim = next(s for s in svcs if s.stage == stage)
            victim.consumer.crash()
            svcs.remove(victim)
    _run(f, services, events={40: join, crash_at: crash})
    got = f.alerts()
    assert _ids(got) == _ids(reference)
    seen: dict[tuple[str, str], dict] = {}
    for a in got:   # alerts sent again after the crash are the same events
        assert seen.setdefault((a["id"], a["state"]), a) == a
    assert _events(f.incidents()) == _events(reference_incidents)


def _partition(f: Fleet, key: bytes) -> int:
    return zlib.crc32(key) % f.bus.partitions  # the memory bus's keyed partitioner


def _lull_then_one_partition_first(f: Fleet, telemetry, services: list[Service]) -> None:
    """The first half of ``telemetry`` (already on the bus) until every host-stage task idles
    and marks final (a lull: the fleet stage releases everything); then one telemetry
    partition's whole second half, run until its task idles again, before any other's (as
    when a poll after a broker outage fetches one partition's backlog first); then the rest."""
    for _ in range(4000):
        f.step(*services)
        if f.idle(services):
            break
    else:
        raise AssertionError("the first half did not drain")
    for _ in range(8):
        f.step(*services)  # the fleet stage reads the final marks
    rest = telemetry[len(telemetry) // 2:]
    lead = _partition(f, rest[0][0])
    p = f.bus.producer()
    for key, value in rest:
        if _partition(f, key) == lead:
            p.send(f.topics.telemetry, value, key)
    for _ in range(200):
        f.step(*services)
    for key, value in rest:
        if _partition(f, key) != lead:
            p.send(f.topics.telemetry, value, key)


@pytest.mark.parametrize("shard_models", [False, True])
def test_after_a_lull_the_partition_that_resumes_first_does_not_run_ahead(telemetry, reference, reference_incidents,
                                                                        shard_models, caplog):
    # The fleet stage waits for the telemetry partitions that were sending before the lull
    # rather than passing them as idle: none of their records is late to the models, nor any
    # of their alerts to the incident stage.
    caplog.set_level(logging.INFO, logger="gpuwarden.service")
    f = Fleet(telemetry[:len(telemetry) // 2], shard_models=shard_models)
    services = [f.service("host"), f.service("fleet")]
    _lull_then_one_partition_first(f, telemetry, services)
    _run(f, services)
    assert _ids(f.alerts()) == _ids(reference)
    assert _events(f.incidents()) == _events(reference_incidents)
    assert any(r.getMessage().startswith("fleet: every telemetry partition idle") for r in caplog.records)


def test_the_fleet_stage_answers_alike_wherever_its_polls_end(telemetry, reference):
    # The fleet topic of a lull and one partition resuming first, read by a fleet task a
    # message at a time, all at once, and in random batches: one answer, the replay's. (A
    # batch holding both the lull's final marks and a resumed partition's records once
    # released those with the lull, ahead of the others': a real-broker test caught it.)
    f = Fleet(telemetry[:len(telemetry) // 2])
    host = f.service("host")
    _lull_then_one_partition_first(f, telemetry, [host])
    _run(f, [host])
    log = f.bus.messages(f.topics.fleet)
    models = _ids([a for a in reference if a["labels"].get("source") == "model"])  # the fleet stage's
    rng = random.Random(4)
    cuts = [list(range(1, len(log))), []] + [sorted(rng.sample(range(1, len(log)), 40)) for _ in range(3)]
    for cut in cuts:
        task = f.service("fleet")._new_part(0, 0.0).pipe
        alerts = []
        for a, b in zip([0, *cut], [*cut, len(log)]):
            alerts += task.handle_guarded(log[a:b]).alerts
        assert _ids([msgspec.to_builtins(x) for x in alerts]) == models, len(cut)


@pytest.mark.parametrize(("hosts", "fleets"), [(1, 1), (3, 4)])
def test_model_shards_on_every_fleet_partition_give_the_alerts_of_one_replay(telemetry, reference,
                                                                             reference_incidents, hosts, fleets):
    f = Fleet(telemetry, shard_models=True)
    services = [f.service("host") for _ in range(hosts)] + [f.service("fleet") for _ in range(fleets)]
    made: list = []
    for s in services[hosts:]:
        s._new_part = lambda p, now, new=s._new_part: made.append(new(p, now)) or made[-1]
    _run(f, services)
    got = f.alerts()
    assert _ids(got) == _ids(reference)
    assert len(got) == len(reference)      # no crash: each alert once
    assert _events(f.incidents()) == _events(reference_incidents)
    # Every fleet partition ran a shard of the models: its hosts' DCGM records, and shard 0 the
    # NCCL ones; no record reached two shards.
    released = {ps.partition: ps.pipe.stage.stats["released"] for ps in made}
    assert sorted(released) == [0, 1, 2, 3] and all(n > 0 for n in released.values()), released
    assert sum(released.values()) == sum(ps.pipe.stage.stats["fed"] for ps in made)
    assert any(m.value and msgspec.msgpack.decode(m.value)[0] == PEER_ENVELOPE for m in f.bus.messages(f.topics.fleet))


@pytest.mark.parametrize("shard_models", [False, True])
def test_columnar_telemetry_gives_the_alerts_of_the_json_replay(telemetry, reference, shard_models):
    # The DCGM rows stay columns from the decoder through the host stage's forward and the
    # fleet stage's buffer to its engine (pipeline/rows.py); the NCCL messages stay JSON.
    sim = Simulator(hosts=8, duration=600, seed=3, scenario="mixed")
    wire = [m for batch in sim.batches() if batch for m in per_host_wire(batch, COLUMNAR)]
    assert sum(h is not None for _, _, h in wire) > len(wire) // 2
    f = Fleet(wire, shard_models=shard_models)
    services = [f.service("host") for _ in range(2)] + [f.service("fleet") for _ in range(2)]
    _run(f, services)
    got = f.alerts()
    assert _ids(got) == _ids(reference) and len(got) == len(reference)


def test_rules_only_the_fleet_stage_runs_for_the_incidents_alone(telemetry):
    # No models: the host stage forwards its alerts and marks, and of the records only the
    # progress ones (none in this scenario); the fleet stage's incident events are the
    # replay's, through a crash of one replica of each stage.
    alerts, incidents = _replay(telemetry, "none")
    assert incidents and not any(a["labels"].get("source") == "model" for a in alerts)
    f = Fleet(telemetry, models="none")
    services = [f.service("host"), f.service("fleet"), f.service("host"), f.service("fleet")]

    def crash(svcs: list[Service]) -> None:
        for stage in ("host", "fleet"):
            victim = next(s for s in svcs if s.stage == stage)
            victim.consumer.crash()
            svcs.remove(victim)
    _run(f, services, events={60: crash})
    assert _ids(f.alerts()) == _ids(alerts)
    assert _events(f.incidents()) == _events(incidents)
    forwarded = [msgspec.msgpack.decode(m.value)[2] for m in f.bus.messages(f.topics.fleet)]
    assert forwarded and not any(body[:1] == b"[" for body in forwarded)      # no records
    assert any(body.startswith(b'{"alerts":') for body in forwarded)


def _rules_without_hang(tmp_path: Path) -> str:
    rules = tmp_path / "rules"
    rules.mkdir()
    for f in Path(RULES).glob("*.y*ml"):
        if f.name != "hang.yaml":
            (rules / f.name).write_bytes(f.read_bytes())
    return str(rules)


def test_incidents_off_the_host_stage_runs_alone_without_models_or_a_hang_yaml(tmp_path, telemetry):
    f = Fleet(telemetry[:2000], models="none")
    f.cfg.service.incidents = False
    f.cfg.service.rules = [_rules_without_hang(tmp_path)]
    host = f.service("host")
    assert not host.forwards
    for _ in range(20):
        f.step(host)
    assert f.bus.messages(f.topics.fleet) == [] and f.bus.messages(f.topics.incidents) == []


@pytest.fixture(scope="module")
def hung_job() -> list[tuple[bytes, bytes]]:
    # Four hosts of a job whose ranks report their progress (RAS every 30 s); one rank hangs
    # until its watchdogs time out.
    sim = Simulator(hosts=4, duration=900, seed=1, scenario="hang")
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


def _fleet_bodies(f: Fleet) -> list[bytes]:
    return [msgspec.msgpack.decode(m.value)[2] for m in f.bus.messages(f.topics.fleet)]


@pytest.mark.parametrize("incidents", [True, False])
def test_rules_only_the_host_stage_forwards_progress_records_and_the_fleet_stage_finds_the_hang(
        hung_job, incidents):
    # `serve --models none` with the hang.yaml beside the rules: the host stage forwards the
    # progress records alone (and its alerts and marks), the fleet stage's hang detector alerts
    # as `replay --models none` does, through a crash of one replica of each stage; with the
    # incidents off the fleet stage runs for the hang detector alone.
    alerts, incidents_ref = _replay(hung_job, "none")
    hang = [a for a in alerts if a["rule"] == "hang_collective"]
    assert [a["state"] for a in hang][:1] == ["firing"] and len({a["id"] for a in hang}) == 1
    f = Fleet(hung_job, models="none")
    f.cfg.service.incidents = incidents
    services = [f.service("host"), f.service("fleet"), f.service("host"), f.service("fleet")]
    assert services[0].forwards

    def crash(svcs: list[Service]) -> None:
        for stage in ("host", "fleet"):
            victim = next(s for s in svcs if s.stage == stage)
            victim.consumer.crash()
            svcs.remove(victim)
    _run(f, services, events={30: crash})
    assert _ids(f.alerts()) == _ids(alerts)
    if incidents:
        assert _events(f.incidents()) == _events(incidents_ref)
    else:
        assert f.bus.messages(f.topics.incidents) == []
    records = []
    for body in _fleet_bodies(f):
        if body[:1] == b"{":  # marks and alerts are JSON objects; records are columns
            continue
        cols = msgspec.msgpack.decode(body, type=Columns)
        assert cols.n == 0  # no DCGM row
        records += cols.other
    assert records and {type(r).__name__ for r in records} == {"ProgressRecord"}


def test_a_reload_bringing_a_rule_that_reads_a_score_is_refused_by_the_host_stage(tmp_path, telemetry):
    # The host stage's rules run without the models (they are in the fleet stage): a score()
    # rule there would read NaN for ever. A reload checks the files without models first, so
    # it is refused and the working rules stay (a restart puts such rules beside the models).
    rules = tmp_path / "rules"
    rules.mkdir()
    for f in Path(RULES).glob("*.y*ml"):
        (rules / f.name).write_bytes(f.read_bytes())
    f = Fleet(telemetry[:400])
    f.cfg.service.rules = [str(rules)]
    f.cfg.service.reload_check_s = 1
    host = f.service("host")
    for _ in range(4):
        f.step(host)
    n = host._n_rules
    (rules / "score.yaml").write_text(
        "rules:\n  - name: hot_model\n    fault: thermal_model_score\n    severity: info\n"
        "    condition: score(thermal_hotter_than_load) > 10\n")
    for _ in range(4):
        f.step(host)
    assert host.metrics.reload_failures._value.get() == 1 and host._n_rules == n


def test_a_fleet_checkpoint_resumes_at_the_records_it_holds_back(telemetry):
    # The fleet stage's snapshot leaves its buffered records out (pipeline/fleetstage.py,
    # FleetStage.snapshot): its checkpoint and commit sit at the oldest message it still holds
    # records of, so a new owner reads them again instead of a checkpoint carrying them all.
    f = Fleet(telemetry)
    host, fleet = f.service("host"), f.service("fleet")
    for _ in range(400):
        f.step(host, fleet)
        held = [ps for ps in fleet.parts.values() if ps.pipe.stage.resume_at() is not None]
        if held and held[0].pipe.stage.pending > 500:
            break
    else:
        raise AssertionError("the fleet stage never held records back")
    ps = held[0]
    resume = ps.pipe.stage.resume_at()
    assert resume < ps.next_offset
    assert fleet._checkpoint([ps], "interval")
    cp = fleet.state.load([ps.partition])[ps.partition]
    assert cp.next_offset == ps.saved_offset == resume
    assert f.bus._committed[(GROUP + ".fleet", f.topics.fleet)][ps.partition] == resume
    buffered = sum(len(c.records) for c in ps.pipe.stage._chunks)
    assert buffered > 500 and len(cp.engine) < len(ps.pipe.stage.snapshot(replayable=False)) - 100 * buffered
