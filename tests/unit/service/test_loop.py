"""The service loop's waits (pipeline/service/app.py ``Service.run`` and ``_flush_idle``): a stage
never sits in a poll's timeout while a stage beside it has input, the idle check asks the broker
for end offsets at most once a second, however fast the loop turns, and after an outage a
partition's idle time counts from the broker's return."""

from __future__ import annotations

import pytest

from pipeline.bus.telemetry import per_host_messages
from pipeline.errors import BusError
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



def _read_everything(host: Service) -> None:
    """Steps ``host`` (its clock standing still, so nothing goes idle) until it has read all."""
    def read_all() -> bool:
        end = host.consumer.end_offsets(list(host.parts))
        return bool(host.parts) and all((host.parts[p].next_offset or 0) == e for p, e in end.items())

    for _ in range(1000):
        host.step()
        if read_all():
            return
    raise AssertionError("the host stage never read its partitions to the end")


def _holding(host: Service) -> list[int]:
    """The partitions that have yet to tell the fleet stage they hold nothing back."""
    return sorted(p for p, ps in host.parts.items() if ps.pipe.pending or ps.holds_fleet())


@pytest.mark.parametrize("outage", ["fails", "waits", "lag query waits", "poll fails", "turn stalls"])
def test_after_an_outage_idle_time_counts_from_the_brokers_return(telemetry, outage):
    clock = Clock()
    _, host, _ = services(telemetry, clock, flush_idle_s=2)
    host._last_lag = float("inf")     # the lag query asks end offsets too: not in this test's way
    _read_everything(host)
    assert _holding(host) == [0, 1]
    inner = host.consumer.end_offsets

    def unreachable(partitions):
        raise BusError("end offsets of t.telemetry: KafkaTimeoutError")

    def waited_out(partitions):       # kafka-python's query retries through an outage
        clock.t += 6.0
        return inner(partitions)

    if outage == "fails":
        host.consumer.end_offsets = unreachable
        for _ in range(60):           # a 6 s outage: idle by the clock, but the broker cannot say
            clock.t += 0.1
            host.step()
        assert _holding(host) == [0, 1]
        host.consumer.end_offsets = inner
    elif outage in ("poll fails", "turn stalls"):
        inner_poll = host.consumer.poll

        def poll(timeout_s, max_records):
            if outage == "poll fails":
                raise BusError("poll of t.telemetry: KafkaConnectionError")
            clock.t += 6.0            # a turn that stood still (a delivery waiting for the broker)
            return {}

        host.consumer.poll = poll
        if outage == "poll fails":
            for _ in range(60):
                clock.t += 0.1
                host.step()
        else:
            host.step()
        host.consumer.poll = inner_poll
        assert _holding(host) == [0, 1]
    elif outage == "lag query waits":     # the consumer-lag gauge's query was the one that waited
        host.consumer.end_offsets = waited_out
        host._last_lag = -float("inf")
        host._update_lag()
        host.consumer.end_offsets = inner
        host._last_lag = float("inf")
    else:
        host.consumer.end_offsets = waited_out
        while host.consumer.end_offsets is waited_out:
            clock.t += 0.1
            asked = clock.t
            host.step()
            if clock.t > asked:       # the query waited out the outage and answered
                host.consumer.end_offsets = inner
        assert _holding(host) == [0, 1]
    back = clock.t
    # The broker answers again: what the producers buffered may still be on its way, so each
    # partition has the whole idle time from now, not from its last record before the outage.
    while clock.t < back + 2 - 0.15:
        clock.t += 0.1
        host.step()
        assert _holding(host) == [0, 1], f"flushed {clock.t - back:.1f}s after the broker came back"
    for _ in range(15):
        clock.t += 0.1
        host.step()
    assert _holding(host) == [], "idle 2 s after the broker's return and nothing left to read: flushed"


def test_a_broker_that_always_answers_slowly_still_lets_idle_partitions_go(telemetry):
    clock = Clock()
    _, host, _ = services(telemetry, clock, flush_idle_s=2)
    host._last_lag = float("inf")
    _read_everything(host)
    inner = host.consumer.end_offsets

    def slow(partitions):
        clock.t += 1.5
        return inner(partitions)

    host.consumer.end_offsets = slow
    flushed_at = None
    start = clock.t
    while flushed_at is None and clock.t < start + 30:
        clock.t += 0.1
        host.step()
        if not _holding(host):
            flushed_at = clock.t - start
    # The first slow answer restarts idle time once; the next one flushes.
    assert flushed_at is not None and 2 + 1.5 + 2 <= flushed_at < 2 * (2 + 1.5) + 2, flushed_at
