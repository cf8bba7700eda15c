"""Helpers of the service tests: a host and a fleet service on one in-memory bus, fed telemetry."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.retry import Backoff
from pipeline.bus.telemetry import per_host_messages
from pipeline.service.app import Service
from pipeline.service.config import load_config_text
from pipeline.service.state import MemoryStateStore
from producers.sim.simulator import Simulator
from tests.factories import Clock

RULES = str(Path(__file__).resolve().parents[3] / "rules")
KEY = b"unit-test-state-key-0123456789ab"


def services(telemetry, clock: Clock, **service: object) -> tuple[MemoryBus, Service, Service]:
    bus = MemoryBus(partitions=2)
    topics = Topics("t")
    p = bus.producer()
    for key, value in telemetry:
        p.send(topics.telemetry, value, key)
    cfg = load_config_text(
        json.dumps(
            {
                "kafka": {"prefix": "t", "max_poll_records": 20, "partitions": 2},
                "http": {"host": "127.0.0.1", "port": 0},
                "service": {"rules": [RULES], "models": "auto", "flush_idle_s": 3, **service},
            }
        ),
        env={},
    )

    def make(stage: str) -> Service:
        group, topic = ("svc", topics.telemetry) if stage == "host" else ("svc.fleet", topics.fleet)
        state = MemoryStateStore(bus, topics.state, group, topic, key=KEY)
        return Service(
            cfg,
            consumer=bus.group_consumer(topic, group),
            producer=bus.producer(),
            state=state,
            clock=clock,
            backoff=Backoff(sleep=lambda s: None),
            stage=stage,
        )

    return bus, make("host"), make("fleet")


def sim_services(duration: float) -> tuple[MemoryBus, Service, Service, Clock]:
    """A simulated two-host fleet's telemetry (``duration`` s, the mixed scenario) on the bus of
    ``services``, and the clock they run on."""
    sim = Simulator(hosts=2, duration=duration, seed=5, scenario="mixed")
    telemetry = [m for batch in sim.batches() if batch for m in per_host_messages(batch)]
    clock = Clock()
    bus, host, fleet = services(telemetry, clock)
    return bus, host, fleet, clock
