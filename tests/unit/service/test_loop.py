"""The service loop's waits (pipeline/service/app.py ``Service.run`` and ``_flush_idle``): a stage
never sits in a poll's timeout while a stage beside it has input, and the idle check asks the
broker for end offsets at most once a second, however fast the loop turns."""

from __future__ import annotations

import pytest

from pipeline.bus.telemetry import per_host_messages
from pipeline.service.app import SHARED_POLL_TIMEOUT_S, Service
from producers.sim.simulator import Simulator
from tests.factories import Clock
from tests.unit.service.service_factories import services


@pytest.fixture(scope="module")
def telemetry() -> list[tuple[bytes, bytes]]:
    sim = Simulator(hosts=4, duration=120, seed=5, scenario="mixed")
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


class Recorder:
    """Wraps a service's consumer: what each poll was asked to wait, and whether it got input."""

    def __init__(self, svc: Service, log: list, limit: int, stop) -> None:
        self.svc, self.log, self.limit, self.stop = svc, log, limit, stop
        self.inner = svc.consumer
        svc.consumer = self

    def poll(self, timeout_s: float, max_records: int):
        got = self.inner.poll(timeout_s, max_records)
        self.log.append((self.svc.stage, timeout_s, bool(got)))
        if len(self.log) >= self.limit:
            self.stop()
        return got

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_no_stage_waits_in_a_poll_while_another_has_input(telemetry):
    clock = Clock()
    _, host, fleet = services(telemetry, clock)
    polls: list[tuple[str, float, bool]] = []

    def stop() -> None:
        host.request_stop()
        fleet.request_stop()

    for s in (host, fleet):
        Recorder(s, polls, 400, stop)
    host.run(fleet)
    rounds = [polls[i:i + 2] for i in range(0, len(polls) - 1, 2)]
    assert any(got for r in rounds for _, _, got in r), "the stages had input"
    quiet = SHARED_POLL_TIMEOUT_S
    for before, now in zip(rounds, rounds[1:]):
        busy = any(got for _, _, got in before)
        # After a round with input, nobody waits; after a quiet one, each waits a short while
        # (blocked in its poll, a stage cannot see the other's input).
        assert [t for _, t, _ in now] == ([0.0, 0.0] if busy else [quiet, quiet]), (before, now)
    assert any(t == quiet for _, t, _ in polls), "the loop went quiet once the input was read"


def test_the_idle_check_asks_for_end_offsets_at_most_once_a_second(telemetry):
    clock = Clock()
    _, host, _ = services(telemetry, clock, flush_idle_s=2)
    asked: list[float] = []
    inner = host.consumer.end_offsets

    def end_offsets(partitions):
        asked.append(clock.t)
        return inner(partitions)

    host.consumer.end_offsets = end_offsets
    host._last_lag = float("inf")    # the lag metric's own (5 s) query is not the one counted here
    host.step()                       # a first batch: both partitions now have records pending
    # Nothing more is read (the partitions hold far more than one poll's worth, so the answer is
    # always "not idle"); the loop turns ten times a second.
    host.consumer.poll = lambda timeout_s, max_records: {}
    for _ in range(80):
        clock.t += 0.1
        host.step()
    assert len(asked) >= 4, asked                # idle candidates from 2 s on: asked, not every turn
    assert all(b - a >= 1.0 - 1e-9 for a, b in zip(asked, asked[1:])), asked
