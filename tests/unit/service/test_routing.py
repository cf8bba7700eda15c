"""Hosts split between telemetry partitions (pipeline/service/routing.py): a producer that does
not key its messages by host is named by the host stage, which cannot see it in any one message."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.retry import Backoff
from pipeline.bus.telemetry import per_host_messages
from pipeline.engine import Engine
from pipeline.schema import dcgm
from pipeline.service.app import Service
from pipeline.service.config import load_config_text
from pipeline.service.routing import split_hosts
from pipeline.service.state import MemoryStateStore
from pipeline.service.upkeep import ROUTING_CHECK_S
from tests.factories import HEALTHY, T0, Clock

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


def test_the_host_stage_names_a_host_whose_messages_are_not_keyed_by_it(caplog):
    bus = MemoryBus(partitions=4)
    topics = Topics("t")
    p = bus.producer()
    for t in range(40):
        for h in ("keyed", "unkeyed"):
            recs = [dcgm(T0 + t, h, g, HEALTHY) for g in range(8)]
            for key, value in per_host_messages(recs):
                if h == "keyed":
                    p.send(topics.telemetry, value, key)
                else:  # one message per GPU, keyed by GPU as a third-party producer might
                    for g, r in enumerate(recs):
                        p.send(topics.telemetry, json.dumps([json.loads(value)[g]]).encode(), f"{h}/GPU-{g}".encode())
    cfg = load_config_text(json.dumps({"kafka": {"prefix": "t"}, "service": {"rules": [RULES], "models": "none"}}),
                           env={})
    clock = Clock()
    svc = Service(cfg, consumer=bus.group_consumer(topics.telemetry, "g"), producer=bus.producer(),
                  state=MemoryStateStore(bus, topics.state, "g", topics.telemetry, key=b"k" * 32), clock=clock,
                  backoff=Backoff(sleep=lambda s: None))
    with caplog.at_level(logging.WARNING, logger="gpuwarden.service"):
        for _ in range(40):
            svc.step()
            clock.t += ROUTING_CHECK_S / 10
    warned = [r for r in caplog.records if "more than one telemetry partition" in r.getMessage()]
    assert len(warned) == 1 and "'unkeyed'" in warned[0].getMessage() and "'keyed'" not in warned[0].getMessage()
    assert svc.metrics.split_hosts._value.get() == 1
    svc.shutdown()
