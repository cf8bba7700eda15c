"""Early release of a host's rows (``Engine.release_hosts``, the service's host stage): a host's
rows of the next tick go as soon as that host is complete for it, not once every host of the
partition is; the alerts are the one-batch replay's whatever the batching, the hosts' phases or
a restore; what a host sends of a tick it was released for is ``late`` (DCGM samples only)."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.deadletters import Origins
from pipeline.engine import Engine, EngineConfig
from pipeline.engine.stage import StageBase
from pipeline.errors import StateError
from pipeline.schema import DcgmRecord, NcclRecord
from tests.factories import T0, fuzz_examples, sample

CONFIG = EngineConfig(idle_timeout=5.0)
Message = tuple[str, list[DcgmRecord]]


def _message(t: float, host: str, fault_at: float | None = None, gpus: int = 4) -> list[DcgmRecord]:
    """One host's GPUs at ``T0 + t``; GPU 0 counts an NVLink replay from ``fault_at`` on."""
    return [sample(t, host, g, nvlink_replay_errors=int(g == 0 and fault_at is not None and t >= fault_at))
            for g in range(gpus)]


def _engine(early: bool, config: EngineConfig = CONFIG, stages: tuple = ()) -> Engine:
    eng = Engine(config, stages=stages)
    eng.release_hosts = early
    return eng


def _feed(eng: Engine, messages: list[Message], now: float | None = None):
    """One ``process`` call for these per-host messages, origins as the decoder gives them."""
    recs = [r for _, m in messages for r in m]
    origins = Origins.of_messages([f"t[0]@{i}" for i in range(len(messages))], [len(m) for _, m in messages])
    return eng.process(recs, origins, now=now)


def _key(a) -> tuple:
    return (a.ts, a.id, a.state, a.rule, a.host, a.gpu, a.started_at, a.summary,
            msgspec.json.encode(a.evidence))


def _phased(seconds: int, phases: dict[str, float], fault: tuple[str, float] | None) -> list[Message]:
    """1 Hz per-host messages, each host at its own phase of the second, in event-time order."""
    out = [(s + p, h) for s in range(seconds) for h, p in phases.items()]
    return [(h, _message(t, h, fault_at=fault[1] if fault and h == fault[0] else None)) for t, h in sorted(out)]


def _firing_after(eng: Engine, msgs: list[Message], live: bool) -> list[str]:
    seen = []
    for h, m in msgs:
        now = 100.0 + (m[0].ts - T0) if live else None
        seen += [f"{h}@{m[0].ts - T0:.1f}" for a in _feed(eng, [(h, m)], now=now).alerts if a.state == "firing"]
    return seen


@pytest.mark.parametrize("live", [False, True])
def test_a_hosts_second_goes_once_that_host_has_sent_it(live: bool) -> None:
    # b samples at .3 of the second and c at .8: b's fault of second 40 is out with b's own
    # message, not half a second later with c's (which the engine without early release waits for).
    msgs = _phased(60, {"a": 0.1, "b": 0.3, "c": 0.8}, fault=("b", 40.3))
    assert _firing_after(_engine(early=True), msgs, live) == ["b@40.3"]
    assert _firing_after(_engine(early=False), msgs, live) == ["c@40.8"]


def test_a_stage_that_is_not_host_local_keeps_the_tick_together() -> None:
    class Peers(StageBase):
        """A stage of one's own that says nothing of host-locality (a fleet-wide model, say)."""

        kind, checks, columns = "peers", [], set()

        def run(self, view, entities, outputs):
            return []

    eng = _engine(early=True, stages=(Peers(),))
    assert not eng.host_local
    msgs = _phased(60, {"a": 0.1, "b": 0.3, "c": 0.8}, fault=("b", 40.3))
    assert _firing_after(eng, msgs, live=False) == ["c@40.8"]
    assert eng.stats["early_releases"] == 0


class _Tally(StageBase):
    """A host-local stage with one deferred check: what each call saw, ("run" or "late", the
    hosts of its rows), and whether the view said early."""

    kind, checks, columns, host_local = "tally", [], set(), True
    deferred = frozenset({"tally"})

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, list[str], bool]] = []

    def run(self, view, entities, outputs):
        self.calls.append(("run", view.ts0, sorted({entities.hosts[h] for h in view.frame.host}), view.early))
        return []

    def run_deferred(self, view, entities):
        self.calls.append(("late", view.ts0, sorted({entities.hosts[h] for h in view.frame.host}), view.early))
        return []


def test_deferred_checks_judge_the_rows_that_ran_early_once_the_tick_is_whole() -> None:
    # a (at .1) and b (at .3) run early each second; c at .8 completes it: only then are a's and
    # b's rows of that second judged late, before the second after it runs.
    tally = _Tally()
    eng = _engine(early=True, stages=(tally,))
    assert eng.host_local
    for h, m in _phased(40, {"a": 0.1, "b": 0.3, "c": 0.8}, fault=None):
        _feed(eng, [(h, m)])
        if h == "b" and m[0].ts == T0 + 35.3:
            assert eng.awaiting_deferred == 8  # a's and b's GPUs of second 35, c's still to come
    at = tally.calls.index(("run", T0 + 35, ["a"], True))
    assert tally.calls[at:at + 5] == [
        ("run", T0 + 35, ["a"], True),
        ("run", T0 + 35, ["b"], True),
        ("run", T0 + 35, ["c"], False),
        ("late", T0 + 35, ["a", "b"], True),
        ("run", T0 + 36, ["a"], True),
    ]
    eng.flush()
    assert tally.calls[-1][0] == "late" and eng.awaiting_deferred == 0


def test_a_deferred_judgement_that_raises_costs_those_rows_only() -> None:
    class Broken(_Tally):
        def run_deferred(self, view, entities):
            raise RuntimeError("boom")

    eng = _engine(early=True, stages=(Broken(),))
    dead = []
    for h, m in _phased(40, {"a": 0.1, "b": 0.3, "c": 0.8}, fault=None):
        dead += _feed(eng, [(h, m)]).dead
    # Each closed second: one internal dead letter for a's rows and one for b's, none for c's.
    assert dead and {d.reason for d in dead} == {"internal"}
    hosts = [d.origin.split("@")[0] for d in dead]
    assert set(hosts) == {"a", "b"} and hosts.count("a") == hosts.count("b") >= 5 and "boom" in dead[0].detail
    # The engine went on: every second closed, nothing left waiting.
    assert eng.awaiting_deferred == 0 and eng.stats["rows.deferred"] == 0 and eng.released == T0 + 40


def test_a_snapshot_with_rows_awaiting_judgement_is_checked() -> None:
    eng = _engine(early=True, stages=(_Tally(),))
    for h, m in _phased(40, {"a": 0.1, "b": 0.3, "c": 0.8}, fault=None)[:-1]:   # all but c's 39.8
        _feed(eng, [(h, m)])
    assert eng.awaiting_deferred == 8
    again = _engine(early=True, stages=(_Tally(),))
    again.restore(eng.snapshot())
    assert again.awaiting_deferred == 8
    data = msgspec.msgpack.decode(eng.snapshot())
    for bad in ([["x"]], [[data["early"][0][0], data["early"][0][1]]],
                [[data["early"][0][0], data["early"][0][0], data["early"][0][2]]]):
        with pytest.raises(StateError):
            _engine(early=True, stages=(_Tally(),)).restore(msgspec.msgpack.encode({**data, "early": bad}))


def test_a_stage_reading_a_deferred_score_keeps_the_tick_together() -> None:
    class Reader(StageBase):
        kind, checks, columns, host_local = "reader", [], set(), True
        reads_scores = frozenset({"tally"})

        def run(self, view, entities, outputs):
            return []

    assert not _engine(early=True, stages=(_Tally(), Reader())).host_local


def _late_after_early_release(eng: Engine) -> tuple[list, list]:
    """a at .1, b at .8: a's second 40 goes early; then a sends another sample in that second,
    and an NCCL record of it. The dead letters of each."""
    for h, m in _phased(41, {"a": 0.1, "b": 0.8}, fault=None)[:-1]:   # all but b's 40.8
        _feed(eng, [(h, m)])
    again = _feed(eng, [("a", _message(40.5, "a"))]).dead
    nccl = NcclRecord(ts=T0 + 40.6, host="a", gpu=0, comm="0x1", rank=0, nranks=8, coll="AllReduce",
                      bytes=1 << 30, exec_time_us=4000.0, busbw_gbs=460.0)
    return again, eng.process([nccl]).dead


def test_a_sample_of_a_tick_its_host_was_released_for_is_late_an_nccl_record_is_not() -> None:
    eng = _engine(early=True)
    again, nccl = _late_after_early_release(eng)
    assert eng.stats["early_releases"] > 0 and eng.released == T0 + 40
    assert [d.reason for d in again] == ["late"] * 4
    assert "host 'a'" in again[0].detail and f"{T0 + 41}" in again[0].detail and again[0].origin == "t[0]@0#0"
    assert nccl == []   # NCCL rows are never released early: it waits for the tick as before
    # Without early release the tick had not gone yet: the same sample is taken.
    again, _ = _late_after_early_release(_engine(early=False))
    assert again == []


def test_how_far_each_host_went_survives_a_restore() -> None:
    eng = _engine(early=True)
    for h, m in _phased(41, {"a": 0.1, "b": 0.8}, fault=None)[:-1]:
        _feed(eng, [(h, m)])
    blob = eng.snapshot()
    back = _engine(early=True)
    back.restore(blob)
    assert np.array_equal(back.host_done, eng.host_done) and back.host_done[0] == T0 + 41
    assert [d.reason for d in _feed(back, [("a", _message(40.5, "a"))]).dead] == ["late"] * 4
    # A snapshot from before early release has no such marks: no host was released early.
    data = msgspec.msgpack.decode(blob)
    del data["host_done"]
    old = _engine(early=True)
    old.restore(msgspec.msgpack.encode(data))
    assert (old.host_done == -np.inf).all() and len(old.host_done) == len(old.host_hwm)


@st.composite
def fleets(draw) -> tuple[list[Message], EngineConfig, list[int], int]:
    """A few hosts at their own phases and steps (1, 5, 10 or 30 s), with jitter, missed
    samples, a host that joins late and one that goes silent, faults on some; any batching of
    the messages in arrival order, and a point at which the engine is snapshotted and restored."""
    step = draw(st.sampled_from([1.0, 5.0, 10.0, 30.0]))
    tick = draw(st.sampled_from([1.0, 1.0, 0.25]))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))        # the samples' noise, from one drawn seed
    seconds = 50 * step
    msgs = []
    for k in range(draw(st.integers(2, 5))):
        h = f"h{k}"
        start = seconds * 0.3 if k == 1 else 0.0                  # joins late
        stop = seconds * 0.6 if k == 2 else seconds               # goes silent
        fault = seconds * rnd.uniform(0.2, 0.9) if rnd.random() < 0.6 else None
        t = start + rnd.random() * step                           # its own phase
        while t < stop:
            if rnd.random() < 0.9:                                # a tenth of the samples missed
                ts = t + rnd.uniform(-0.02, 0.02) * step
                msgs.append((ts, h, _message(ts, h, fault_at=fault)))
            t += step
    msgs.sort(key=lambda m: m[0])
    msgs = [(h, m) for _, h, m in msgs]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(msgs) - 1), max_size=60))))
    cut = draw(st.integers(1, len(msgs) - 1))
    return msgs, EngineConfig(idle_timeout=5.0, tick=tick), cuts, cut


def _run(early: bool, config: EngineConfig, batches: list[list[Message]], cut: int | None = None):
    """Alerts (sorted) and late count of feeding ``batches``; ``cut``: snapshot and restore
    into a fresh engine before that batch."""
    eng, got = _engine(early, config), []
    for i, b in enumerate(batches):
        if i == cut:
            fresh = _engine(early, config)
            fresh.restore(eng.snapshot())
            eng = fresh
        got += _feed(eng, b).alerts
    got += eng.flush().alerts
    return sorted(map(_key, got)), eng.stats["dead.late"]


@pytest.mark.slow
@settings(max_examples=fuzz_examples(30), deadline=None)
@given(fleets())
def test_early_release_gives_the_same_alerts_whatever_the_batching(case) -> None:
    # The same alerts (ids, times, evidence) and dead letters as without early release, fed the
    # same way: message by message (as early as the engine can go), in the drawn batches, and
    # message by message across a snapshot and restore. (A host that joins in the middle can
    # lose its first sample to a tick that went before it was seen, with or without.)
    msgs, config, cuts, cut = case
    one_by_one = [[m] for m in msgs]
    for batches, at in ((one_by_one, None), ([msgs[i:j] for i, j in zip([0] + cuts, cuts + [len(msgs)])], None),
                        (one_by_one, cut)):
        want, late = _run(False, config, batches, at)
        assert _run(True, config, batches, at) == (want, late)


def test_message_by_message_a_spread_fleet_is_released_early() -> None:
    # The property above holds trivially if nothing goes early: here something must.
    # Each second after the start-up hold (allowed_lateness and a step, 31 s), every host's
    # message but the latest-phase one's goes early.
    eng = _engine(early=True)
    for h, m in _phased(60, {f"h{i}": 0.07 + i / 10 for i in range(8)}, fault=None):
        _feed(eng, [(h, m)])
    assert eng.stats["early_releases"] >= (60 - 32) * 7
