"""The service's commit protocol on the in-memory bus: process -> deliver -> checkpoint -> commit.

Every case runs the real ``Service`` (pipeline/service/app.py) on ``MemoryBus`` group members
and a ``MemoryStateStore`` with a test clock, crashes it at one point of the protocol (the
process is abandoned, its member leaves the group as kill -9 does) and lets a fresh one take
over; the alerts on the alerts topic must be an uninterrupted run's, repeats identical. The
same cases against a real broker and real processes are tests/faults/.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pipeline.bus import MemoryBus, Topics
from pipeline.bus.retry import Backoff
from pipeline.bus.telemetry import per_host_messages
from pipeline.errors import BusError, DeliveryError
from pipeline.service.app import Service
from pipeline.service.config import load_config_text
from pipeline.service.state import MemoryStateStore
from producers.sim.simulator import Simulator
from tests.factories import Clock

RULES = str(Path(__file__).resolve().parents[3] / "rules")
KEY = b"unit-test-state-key-0123456789ab"
GROUP = "svc"


class Crash(BaseException):
    """kill -9 at this point: nothing after it runs (not an Exception, so nothing catches it)."""


@pytest.fixture(scope="module")
def telemetry() -> list[tuple[bytes, bytes]]:
    sim = Simulator(hosts=6, duration=360, seed=4, scenario="mixed")
    return [m for batch in sim.batches() if batch for m in per_host_messages(batch)]


def config(**service: object):
    svc = {"rules": [RULES], "models": "none", "flush_idle_s": 3, "checkpoint_interval_s": 5,
           "checkpoint_records": 10**9, **service}
    return load_config_text(json.dumps({"kafka": {"prefix": "t", "max_poll_records": 12}, "service": svc}), env={})


class Harness:
    """A bus with the telemetry on it, and services that come and go on it."""

    def __init__(self, telemetry, **service: object) -> None:
        self.bus = MemoryBus(partitions=4)
        self.topics = Topics("t")
        p = self.bus.producer()
        for key, value in telemetry:
            p.send(self.topics.telemetry, value, key)
        self.n = len(telemetry)
        self.cfg = config(**service)
        self.clock = Clock()

    def service(self) -> Service:
        state = MemoryStateStore(self.bus, self.topics.state, GROUP, self.topics.telemetry, key=KEY)
        return Service(self.cfg, consumer=self.bus.group_consumer(self.topics.telemetry, GROUP),
                       producer=self.bus.producer(), state=state, clock=self.clock,
                       backoff=Backoff(sleep=lambda s: None))

    def step(self, *services: Service, dt: float = 0.5) -> None:
        for s in services:
            s.step()
        self.clock.t += dt

    def consumed(self, *services: Service) -> bool:
        return sum(s.consumer.end_offsets([p])[p] - (ps.next_offset or 0)
                for s in services for p, ps in s.parts.items()) == 0 and \
            sum(len(s.parts) for s in services) == 4

    def drain(self, *services: Service, limit: int = 5000) -> None:
        """Step until every message is processed and idle flushes are done, then shut down."""
        for _ in range(limit):
            self.step(*services)
            if self.consumed(*services) and not any(ps.pipe.pending for s in services
                                                   for ps in s.parts.values()):
                break
        else:
            raise AssertionError("did not drain")
        for s in services:
            s.shutdown()

    def alerts(self) -> list[dict]:
        return [msgspec.json.decode(m.value) for m in self.bus.messages(self.topics.alerts)]

    def checkpoints(self) -> list:
        return self.bus.messages(self.topics.state)


def ids(alerts: list[dict]) -> set[tuple[str, str]]:
    return {(a["id"], a["state"]) for a in alerts}


def same_repeats(alerts: list[dict]) -> None:
    seen: dict[tuple[str, str], dict] = {}
    for a in alerts:
        k = (a["id"], a["state"])
        assert seen.setdefault(k, a) == a, f"same id and state, different content: {a} vs {seen[k]}"


@pytest.fixture(scope="module")
def golden(telemetry) -> set[tuple[str, str]]:
    h = Harness(telemetry)
    s = h.service()
    h.drain(s)
    assert s.totals["messages"] == h.n
    got = h.alerts()
    assert len(got) == len(ids(got)) and got, "an uninterrupted run sends each alert event once"
    return ids(got)


def crash_after(obj, name: str, nth: int) -> list[int]:
    """Make ``obj.name`` raise ``Crash`` on its ``nth`` call (counting from 1)."""
    real, calls = getattr(obj, name), [0]

    def wrapper(*a, **k):
        calls[0] += 1
        if calls[0] == nth:
            raise Crash(name)
        return real(*a, **k)
    setattr(obj, name, wrapper)
    return calls


def run_until_crash(h: Harness, s: Service, limit: int = 5000) -> None:
    with pytest.raises(Crash):
        for _ in range(limit):
            h.step(s)
    s.consumer.crash()


def test_checkpoints_follow_the_cadence_and_commits_only_follow_checkpoints(telemetry, golden):
    h = Harness(telemetry)
    s = h.service()
    rounds: list[tuple[float, int, str]] = []
    real = s._checkpoint

    def checkpoint(parts, why, commit=True):
        for ps in parts:
            if ps.next_offset is not None:
                rounds.append((h.clock.t, ps.partition, why if isinstance(why, str) else why[ps.partition]))
        return real(parts, why, commit)
    s._checkpoint = checkpoint
    last: dict[int, int] = {}
    for _ in range(150):
        h.step(s)
        for m in h.checkpoints():
            p = int(m.key.rsplit(b"/", 1)[1])
            last[p] = s.state.decode(p, m.value).next_offset
        for p, committed in s.consumer.committed().items():
            # A committed offset is always one a checkpoint holds.
            assert committed == last.get(p, 0), (p, committed, last)
    assert s.batches > 100                            # many batches ...
    per_part: dict[int, list[float]] = {}
    for t, p, why in rounds:
        if why == "interval":
            per_part.setdefault(p, []).append(t)
    # Partitions fall due together (the grid): one round, one commit, for all of them.
    assert len({t for t, _, why in rounds if why == "interval"}) <= 150 * 0.5 / 5 + 1
    assert per_part                                   # ... few checkpoints, at most one per interval
    for p, times in per_part.items():
        assert all(b - a >= 5 for a, b in zip(times, times[1:])), (p, times)
        assert len(times) <= 150 * 0.5 / 5 + 1


def test_checkpoint_after_n_records_even_within_the_interval(telemetry):
    h = Harness(telemetry, checkpoint_interval_s=3600, checkpoint_records=2000)
    s = h.service()
    for _ in range(120):
        h.step(s)
    processed = s.metrics.records._value.get()
    assert processed > 10_000
    n = len(h.checkpoints())
    assert n >= processed // 2000 - 4 and n <= processed // 2000 + 4


def test_idle_flush_and_shutdown_always_checkpoint(telemetry, golden):
    h = Harness(telemetry, checkpoint_interval_s=3600)
    s = h.service()
    h.drain(s)
    whys = _samples(s, "gpuwarden_state_checkpoints_total")
    # Each of the 4 partitions ends checkpointed: by its idle flush where records were still
    # held then, else at shutdown (its hosts' last second went as soon as each host sent it).
    assert whys.get("idle", 0) >= 1 and whys.get("idle", 0) + whys.get("shutdown", 0) >= 4
    assert not whys.get("interval")
    assert ids(h.alerts()) == golden
    assert s.consumer.committed() == {p: len(part) for p, part in enumerate(h.bus._topic(h.topics.telemetry))}


def _samples(s: Service, name: str) -> dict[str, float]:
    return {smp.labels["why"]: smp.value for metric in s.metrics.registry.collect() for smp in metric.samples
            if smp.name == name}


def test_restart_restores_each_partition_from_its_checkpoint(telemetry, golden):
    h = Harness(telemetry)
    first = h.service()
    for _ in range(100):
        h.step(first)
    first.shutdown()                                  # SIGTERM: checkpoint, commit, leave
    committed = first.consumer.committed()
    second = h.service()
    h.step(second)
    restored = {p: offset for p, (_, offset) in second.state.seen.items()}
    assert restored == committed and all(o > 0 for o in restored.values())
    h.drain(second)
    assert first.totals["messages"] + second.totals["messages"] == h.n      # nothing seen twice
    assert ids(h.alerts()) == golden and len(h.alerts()) == len(golden)


def test_crash_between_deliver_and_checkpoint_replays_and_loses_nothing(telemetry, golden):
    h = Harness(telemetry)
    first = h.service()
    crash_after(first.state, "save", 9)               # deep into the run, after many deliveries
    run_until_crash(h, first)
    second = h.service()
    h.drain(second)
    got = h.alerts()
    assert ids(got) == golden
    same_repeats(got)
    assert first.totals["messages"] + second.totals["messages"] > h.n        # it replayed


def test_crash_between_checkpoint_and_commit_resumes_at_the_checkpoint(telemetry, golden):
    h = Harness(telemetry)
    first = h.service()
    crash_after(first.consumer, "commit", 6)
    run_until_crash(h, first)
    committed = first.consumer.committed()
    second = h.service()
    h.step(second)
    resumed = {p: offset for p, (_, offset) in second.state.seen.items()}
    # The checkpoints written just before the crash are newer than the committed offsets, and
    # the state and position restored are theirs, not the commit's.
    assert any(resumed[p] > committed[p] for p in resumed)
    h.drain(second)
    got = h.alerts()
    assert ids(got) == golden
    same_repeats(got)


def test_kill9_well_after_the_last_checkpoint_loses_no_alert(telemetry, golden):
    h = Harness(telemetry, checkpoint_interval_s=20)
    first = h.service()
    alerts_at_checkpoint = [0]
    real = first.state.flush

    def flush():
        alerts_at_checkpoint[0] = len(h.alerts())
        return real()
    first.state.flush = flush
    for _ in range(45):                               # the first checkpoints, a round at 20 s ...
        h.step(first)
    saved = len(h.checkpoints())
    for _ in range(30):                               # ... then 15 s more, well before the next
        h.step(first)
    assert len(h.checkpoints()) == saved
    assert any(ps.dirty and ps.since_saved > 0 for ps in first.parts.values())
    assert len(h.alerts()) > alerts_at_checkpoint[0]  # alerts went out after the last checkpoint
    first.consumer.crash()
    second = h.service()
    h.drain(second)
    got = h.alerts()
    assert ids(got) == golden
    same_repeats(got)
    assert first.totals["messages"] + second.totals["messages"] > h.n        # it replayed


def test_revoke_mid_cadence_checkpoints_before_the_new_owner_restores(telemetry, golden):
    h = Harness(telemetry, checkpoint_interval_s=3600)
    a = h.service()
    for _ in range(40):
        h.step(a)
    # Each partition was checkpointed once, after its first batch; everything since is not.
    assert a.parts and all(ps.dirty and ps.next_offset > ps.saved_offset for ps in a.parts.values())
    b = h.service()                                   # joins: the group rebalances
    h.step(b)                                         # B gets nothing until A has revoked
    assert not b.parts
    at_revoke = {p: ps.next_offset for p, ps in a.parts.items()}
    h.step(a)                                         # A: revoke (checkpoint), then its new share
    h.step(b)
    assert set(a.parts) | set(b.parts) == {0, 1, 2, 3} and not set(a.parts) & set(b.parts)
    assert b.parts
    for p in b.parts:                                 # B resumed exactly where A stopped
        assert b.state.seen[p][1] == at_revoke[p]
    h.drain(a, b)
    assert a.totals["messages"] + b.totals["messages"] == h.n     # nothing processed twice
    got = h.alerts()
    assert ids(got) == golden and len(got) == len(golden)


def test_a_lost_partition_is_not_checkpointed_over_its_new_owner(telemetry):
    h = Harness(telemetry, checkpoint_interval_s=3600)
    a = h.service()
    for _ in range(20):
        h.step(a)
    before = len(h.checkpoints())
    a._lost(sorted(a.parts))
    assert not a.parts and len(h.checkpoints()) == before


def test_delivery_is_retried_until_acknowledged_and_only_then_checkpointed(telemetry, golden):
    h = Harness(telemetry)
    s = h.service()
    real_flush, fails = s.producer.flush, [3]

    def flaky(timeout=None):
        if fails[0] and h.alerts():
            fails[0] -= 1
            raise DeliveryError("broker away", failed=1, retriable=True)
        return real_flush(timeout)
    s.producer.flush = flaky
    h.drain(s)
    assert fails[0] == 0 and s.metrics.delivery_retries._value.get() == 3
    assert ids(h.alerts()) == golden


def test_a_refused_checkpoint_commits_nothing_and_is_tried_again(telemetry):
    h = Harness(telemetry)
    s = h.service()
    real = s.state.flush

    def refuse():
        if h.clock.t < 1008:
            raise DeliveryError("too large", failed=1, retriable=False)
        return real()
    s.state.flush = refuse
    for _ in range(12):                               # every checkpoint of the first 8 s is refused
        h.step(s)
    assert s.consumer.committed() == dict.fromkeys(range(4), 0)
    for _ in range(30):
        h.step(s)
    assert all(o > 0 for o in s.consumer.committed().values())


def test_poll_failures_back_off_and_the_service_goes_on(telemetry):
    h = Harness(telemetry)
    s = h.service()
    waits: list[float] = []
    s.backoff = Backoff(sleep=waits.append)
    real, fails = s.consumer.poll, [3]

    def poll(*a):
        if fails[0]:
            fails[0] -= 1
            raise BusError("broker restarting")
        return real(*a)
    s.consumer.poll = poll
    f = 0
    for _ in range(6):
        f = s.step(f)
    assert waits == [0.5, 1.0, 2.0] and s.batches > 0


def test_rule_reload_without_an_engine_reaches_every_partition(tmp_path, telemetry):
    rules = tmp_path / "rules"
    rules.mkdir()
    src = Path(RULES)
    for f in src.glob("*.y*ml"):
        (rules / f.name).write_bytes(f.read_bytes())
    h = Harness(telemetry, rules=[str(rules)], reload_check_s=1)
    s = h.service()
    for _ in range(4):
        h.step(s)
    n = s._n_rules
    victim = sorted(rules.glob("*.y*ml"))[0]
    victim.write_text("groups: [[[")                  # broken: refused, the old set keeps running
    for _ in range(4):
        h.step(s)
    assert s.metrics.reload_failures._value.get() == 1 and s._n_rules == n
    victim.unlink()                                   # a smaller valid set: every engine takes it
    for _ in range(4):
        h.step(s)
    assert s._n_rules < n
    assert all(len(ps.pipe.engine.rules) == s._n_rules for ps in s.parts.values())
