"""Hosts split between telemetry partitions (pipeline/service/routing.py): a producer that does
not key its messages by host is named by the host stage, which cannot see it in any one message,
and by the fleet stage, which sees it across host-stage replicas."""

from __future__ import annotations

import json
import logging

import msgspec
from pathlib import Path

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.retry import Backoff
from pipeline.bus.telemetry import per_host_messages
from pipeline.engine import Engine, EngineConfig
from pipeline.schema import NcclRecord, dcgm
from pipeline.service.app import Service
from pipeline.service.config import load_config_text
from pipeline.service.fleet import FleetTask
from pipeline.service.routing import SenderLog, split_hosts
from pipeline.service.state import MemoryStateStore
from pipeline.service.upkeep import ROUTING_CHECK_S
from tests.factories import HEALTHY, T0, Clock
from tests.fleet_factories import FLEET_KEY, GROUP, TOPIC, envelope, fleet_message, json_records_body, records_body

RULES = str(Path(__file__).resolve().parents[3] / "rules")


def _engine(*records) -> Engine:
    e = Engine(row_checks=[], tick_checks=[])
    e.process(list(records))
    return e


def test_a_host_heard_lately_on_two_partitions_is_split_and_one_that_moved_is_not():
    a = _engine(dcgm(T0 + 100, "n1", 0, HEALTHY), dcgm(T0 + 100, "n2", 0, HEALTHY), dcgm(T0, "old", 0, HEALTHY))
    b = _engine(dcgm(T0 + 99, "n1", 1, HEALTHY), dcgm(T0 + 100, "old", 0, HEALTHY))
    c = _engine(dcgm(T0 + 98, "n1", 2, HEALTHY))
    # "old" was last on partition 0 100 s ago: partitions were added and it moved to 1.
    assert split_hosts({2: c, 0: a, 1: b}, 30.0) == {"n1": [0, 1, 2]}
    assert split_hosts({0: a}, 30.0) == {} and split_hosts({}, 30.0) == {}


def _two_hosts(seconds: int) -> tuple[MemoryBus, Topics]:
    """A 4-partition bus holding ``seconds`` of two hosts' telemetry: ``keyed``'s messages keyed by
    its host, ``unkeyed``'s one a GPU keyed by the GPU, as a third-party producer might."""
    bus = MemoryBus(partitions=4)
    topics = Topics("t")
    p = bus.producer()
    for t in range(seconds):
        for h in ("keyed", "unkeyed"):
            recs = [dcgm(T0 + t, h, g, HEALTHY) for g in range(8)]
            for key, value in per_host_messages(recs):
                if h == "keyed":
                    p.send(topics.telemetry, value, key)
                else:
                    for g in range(8):
                        p.send(topics.telemetry, json.dumps([json.loads(value)[g]]).encode(), f"{h}/GPU-{g}".encode())
    return bus, topics


def test_the_host_stage_names_a_host_whose_messages_are_not_keyed_by_it(caplog):
    bus, topics = _two_hosts(seconds=40)
    cfg = load_config_text(
        json.dumps({"kafka": {"prefix": "t"}, "service": {"rules": [RULES], "models": "none"}}), env={}
    )
    clock = Clock()
    svc = Service(
        cfg,
        consumer=bus.group_consumer(topics.telemetry, "g"),
        producer=bus.producer(),
        state=MemoryStateStore(bus, topics.state, "g", topics.telemetry, key=b"k" * 32),
        clock=clock,
        backoff=Backoff(sleep=lambda s: None),
    )
    with caplog.at_level(logging.WARNING, logger="gpuwarden.service"):
        for _ in range(40):
            svc.step()
            clock.t += ROUTING_CHECK_S / 10
    warned = [r for r in caplog.records if "more than one telemetry partition" in r.getMessage()]
    assert len(warned) == 1 and "'unkeyed'" in warned[0].getMessage() and "'keyed'" not in warned[0].getMessage()
    assert svc.metrics.split_hosts._value.get() == 1
    svc.shutdown()


def test_a_sender_log_forgets_a_host_that_moved_and_is_bounded():
    log = SenderLog(max_hosts=2)
    log.note(["n1", "moved"], 0, T0)
    log.note(["moved"], 1, T0 + 100)  # partitions were added: it moved from 0 to 1 long ago
    log.note(["n1"], 2, T0 + 100)
    log.note(["n1"], 0, T0 + 90)
    log.note(["n3"], 0, T0 + 100)  # a third host: past the bound, counted, not kept
    assert log.split(30.0) == {"n1": [0, 2]}
    assert log.seen["moved"] == {1: T0 + 100} and log.untracked == 1


def test_a_fleet_partition_notes_the_partitions_of_each_hosts_dcgm_records():
    task = FleetTask(
        lambda: Engine(EngineConfig(), row_checks=[], tick_checks=[], screened=True),
        4,
        topic=TOPIC,
        group=GROUP,
        key=FLEET_KEY,
    )
    nccl = NcclRecord(ts=T0, host="n1", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=1, exec_time_us=1.0)
    msgs = [
        envelope(records_body([dcgm(T0, "n1", 0, HEALTHY), dcgm(T0, "n2", 0, HEALTHY)]), 0),
        envelope(records_body([dcgm(T0 + 1, "n1", 1, HEALTHY)]), 3),  # n1's GPU 1 on another partition
        # A collective's records name the ranks' hosts from wherever the tool ran: not a split.
        envelope(records_body([nccl.__class__(**{**msgspec.structs.asdict(nccl), "host": "n2"})]), 1),
        envelope(json_records_body([dcgm(T0 + 1, "n3", 0, HEALTHY)]), 0),  # an earlier build's JSON body
        envelope(json_records_body([dcgm(T0 + 2, "n3", 1, HEALTHY)]), 2),
    ]
    dead = task.handle_guarded([fleet_message(v, i) for i, v in enumerate(msgs)]).dead
    assert dead == []
    assert task.senders.split(30.0) == {"n1": [0, 3], "n3": [0, 2]}


def test_the_fleet_stage_names_a_host_split_between_host_stage_replicas(caplog):
    # Two host-stage replicas, two partitions each: no one process need see both halves of the
    # host whose messages are keyed by GPU; the fleet stage, which both forward to, does.
    bus, topics = _two_hosts(seconds=90)
    cfg = load_config_text(
        json.dumps({"kafka": {"prefix": "t", "partitions": 4}, "service": {"rules": [RULES], "models": "auto"}}), env={}
    )
    clock = Clock()

    def service(stage: str) -> Service:
        group, topic = ("g", topics.telemetry) if stage == "host" else ("g.fleet", topics.fleet)
        return Service(
            cfg,
            consumer=bus.group_consumer(topic, group),
            producer=bus.producer(),
            state=MemoryStateStore(bus, topics.state, group, topic, key=b"k" * 32),
            clock=clock,
            backoff=Backoff(sleep=lambda s: None),
            stage=stage,
        )

    hosts, fleet = [service("host"), service("host")], service("fleet")
    with caplog.at_level(logging.WARNING, logger="gpuwarden.service"):
        for _ in range(120):
            for s in (*hosts, fleet):
                s.step()
            clock.t += ROUTING_CHECK_S / 10
    assert sorted(len(h.parts) for h in hosts) == [2, 2]
    warned = [r.getMessage() for r in caplog.records if "their host stages all forwarded it" in r.getMessage()]
    assert len(warned) == 1 and "'unkeyed'" in warned[0] and "'keyed'" not in warned[0]
    assert fleet.metrics.fleet_split_hosts._value.get() == 1
    for s in (*hosts, fleet):
        s.shutdown()
