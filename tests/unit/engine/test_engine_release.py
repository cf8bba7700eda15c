"""Sub-second release (issue 17): a per-host message holds all of a host's GPUs for one second,
so a live engine releases second t once every live host has sent t, not t+1; per-GPU records
keep the old rule; a host that stops sending stops holding the others after ``idle_timeout``;
and the alerts do not depend on how the messages were batched."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.decode import Origins
from pipeline.engine import Engine, EngineConfig
from pipeline.schema import DcgmRecord
from tests.factories import T0, fuzz_examples, sample

HOSTS = ("a", "b", "c")
CONFIG = EngineConfig(idle_timeout=5.0)


def _message(t: float, host: str, gpus: int = 4, fault_at: float | None = None) -> list[DcgmRecord]:
    """One host's GPUs at one time; GPU 0 counts an NVLink replay from ``fault_at`` on."""
    return [sample(t, host, g, nvlink_replay_errors=(1 if g == 0 and fault_at is not None and t >= fault_at else 0))
            for g in range(gpus)]


def _stream(seconds: int, phase: float = 0.3, fault: tuple[str, float] | None = ("b", 40.3),
            silent: tuple[str, float] | None = None) -> list[tuple[str, list[DcgmRecord]]]:
    """Per-host messages, second by second, hosts in turn (``silent``: that host stops then)."""
    out = []
    for s in range(seconds):
        t = s + phase
        for h in HOSTS:
            if silent and h == silent[0] and t >= silent[1]:
                continue
            out.append((h, _message(t, h, fault_at=fault[1] if fault and h == fault[0] else None)))
    return out


def _feed(eng: Engine, messages: list[tuple[str, list[DcgmRecord]]], per_host_messages: bool = True,
          now: float | None = 0.0, as_strings: bool = False) -> list[DcgmRecord]:
    """One ``process`` call for these messages, as the decoder hands them over (``as_strings``:
    as its message-by-message path does, origins spelled out)."""
    recs = [r for _, m in messages for r in m]
    sizes = [len(m) if per_host_messages else -1 for _, m in messages]
    if not per_host_messages:   # one bare record per message
        sizes = [-1] * len(recs)
    origins = Origins.of_messages([f"t[0]@{i}" for i in range(len(sizes))], sizes)
    out = eng.process(recs, list(origins) if as_strings else origins, now=now)
    return out.alerts


def _firing_after(per_host_messages: bool, live: bool, as_strings: bool = False) -> list[str]:
    """After which host's message of which second the NVLink alert of second 40 came out."""
    eng = Engine(CONFIG)
    seen = []
    for i, (h, m) in enumerate(_stream(60)):
        wall = 100.0 + i / len(HOSTS)   # one second of wall clock per second of event time
        for a in _feed(eng, [(h, m)], per_host_messages, now=wall if live else None, as_strings=as_strings):
            if a.state == "firing":
                seen.append(f"{h}@{m[0].ts - T0:.1f}")
    return seen


@pytest.mark.parametrize("as_strings", [False, True])
@pytest.mark.parametrize("live", [True, False])
def test_per_host_messages_release_a_second_once_every_host_has_sent_it(live: bool, as_strings: bool) -> None:
    # Host c's message is the last of second 40: the alert on b's GPU comes out with it.
    assert _firing_after(per_host_messages=True, live=live, as_strings=as_strings) == ["c@40.3"]


@pytest.mark.parametrize("as_strings", [False, True])
@pytest.mark.parametrize("live", [True, False])
def test_per_gpu_records_keep_waiting_for_the_next_second(live: bool, as_strings: bool) -> None:
    # Second 40 goes once every host has sent 41: with c's message of 41.3.
    assert _firing_after(per_host_messages=False, live=live, as_strings=as_strings) == ["c@41.3"]


def test_a_message_with_several_hosts_is_not_taken_as_any_hosts_whole_second() -> None:
    eng = Engine(CONFIG)
    seen = []
    for s in range(60):
        t = s + 0.3
        both = [("ab", _message(t, "a") + _message(t, "b", fault_at=40.3))]
        seen += [f"ab@{s}" for a in _feed(eng, both + [("c", _message(t, "c"))], now=None) if a.state == "firing"]
    assert seen == ["ab@41"]


def _firing_of_second_40(phase: float, jitter: float = 0.0, fault_at: float = 40.0) -> list[str]:
    """Hosts at ``phase`` of each second, each sample ``jitter`` early or late in turn; after
    which message the NVLink alert of b's sample of second 40 came out. No sample may be late."""
    eng = Engine(CONFIG)
    seen = []
    for i, s in enumerate(range(60)):
        t = s + phase + (jitter if s % 2 else -jitter)
        for h in HOSTS:
            m = _message(t, h, fault_at=fault_at if h == "b" else None)
            seen += [f"{h}@{s}" for a in _feed(eng, [(h, m)], now=100.0 + s) if a.state == "firing"]
    assert not eng.stats["dead.late"]
    return seen


def test_a_host_sampled_just_after_a_tick_starts_is_complete_once_it_has_shown_little_jitter() -> None:
    # Samples at .02 of a second from a steady clock: after ten steps without jitter the
    # margin is 0.5 % of the step, not 5 %, so second 40 goes with c's message of 40.
    assert _firing_of_second_40(0.02) == ["c@40"]


def test_a_host_sampled_within_its_jitter_of_a_tick_start_is_complete_for_its_sample_s_tick() -> None:
    # Within the first 0.5 % of the second, or 1.5 % of jitter around .02: its next sample may
    # fall in the same second, but then in its last tenth, and moves to the next second
    # (HostClock.one_per_tick), so second 40 goes with c's message of 40 all the same.
    assert _firing_of_second_40(0.003) == ["c@40"]
    assert _firing_of_second_40(0.02, jitter=0.015) == ["c@40"]


def test_samples_jittering_across_a_tick_start_are_one_to_a_tick() -> None:
    # At .99 and .01 of a second in turn: second 40's sample (39.99) shares second 39 with
    # 39.01 and moves to 40, so b's fault of 39.99 is second 40's, out with c's message of 40.
    assert _firing_of_second_40(0.0, jitter=0.01, fault_at=39.9) == ["c@40"]
    eng = Engine(CONFIG)
    for s in range(20):
        _feed(eng, [("a", _message(s + (0.03 if s % 2 else -0.03), "a"))], now=100.0 + s)
    assert eng.stats["records.moved"] == 4 * 9  # 2, 4, .. 18: four GPUs each


def test_a_host_whose_steps_wander_past_the_move_waits_for_its_next_sample() -> None:
    # At .01 and .09 in turn: steps of 0.92 s, so its next sample may fall early in the same
    # second, which no move puts right: the per-record rule, and the alert waits a second. So
    # too at .97 and .03 in turn (steps of 0.94 s, less a margin of 5 % for its jitter): the
    # samples are moved to one a second all the same, and each second waits for the next.
    assert _firing_of_second_40(0.05, jitter=0.04) == ["c@41"]
    assert _firing_of_second_40(0.0, jitter=0.03, fault_at=39.9) == ["c@41"]


def test_a_silent_host_stops_holding_the_others_after_idle_timeout() -> None:
    eng = Engine(CONFIG)
    msgs = _stream(80, fault=("b", 50.3), silent=("c", 45.0))
    when = {}
    for i, (h, m) in enumerate(msgs):
        wall = 100.0 + (m[0].ts - T0)
        for a in _feed(eng, [(h, m)], now=wall):
            if a.state == "firing":
                when[a.rule] = (m[0].ts - T0, wall)
        eng.process([], now=wall + 0.5)   # the consumer's idle poll between messages
        if "builtin_nvlink_replay" in when:
            break
    # c went silent at event time 45 (wall 145); b's fault at 50.3 (wall 150.3) is out within
    # the second, once c's last arrival is idle_timeout (5 s) behind: not held for lateness (30 s).
    t, wall = when["builtin_nvlink_replay"]
    assert t == pytest.approx(50.3) and wall <= 151.0
    assert eng.watermark(now=wall) >= T0 + 50


def test_a_silent_host_holds_the_others_until_idle_timeout() -> None:
    eng = Engine(CONFIG)
    for i, (h, m) in enumerate(_stream(44)):
        _feed(eng, [(h, m)], now=100.0 + (m[0].ts - T0))
    # c sent 43.3 at wall 143.3; a and b go on to 46.3: within idle_timeout c still holds.
    for s in (44.3, 45.3, 46.3):
        _feed(eng, [("a", _message(s, "a")), ("b", _message(s, "b"))], now=100.0 + s)
    assert eng.watermark(now=146.5) <= T0 + 44
    assert eng.watermark(now=149.0) >= T0 + 46


def _alerts(eng: Engine, batches: list[list[tuple[str, list[DcgmRecord]]]], live: bool) -> list[tuple]:
    out = []
    for b in batches:
        # Live: the batch comes when its newest message was sent, in real time.
        out += _feed(eng, b, now=1000.0 + max(m[0].ts for _, m in b) - T0 if live else None)
    out += eng.flush().alerts
    return [(a.id, a.state, a.rule, a.host, a.gpu, a.ts) for a in out]


@pytest.mark.parametrize("seed", range(8))
def test_alerts_do_not_depend_on_how_per_host_messages_are_batched(seed: int) -> None:
    rnd = random.Random(seed)
    msgs = _stream(90, phase=rnd.choice([0.0, 0.3, 0.6]), fault=(rnd.choice(HOSTS), 30 + rnd.randrange(40) + 0.3))
    # Hosts' messages of one second interleave in any order (a consumer reads partitions so).
    for s in range(0, len(msgs), len(HOSTS)):
        part = msgs[s:s + len(HOSTS)]
        rnd.shuffle(part)
        msgs[s:s + len(HOSTS)] = part
    golden = _alerts(Engine(CONFIG), [msgs], live=False)
    assert any(a[1] == "firing" for a in golden)
    for _ in range(4):
        cuts = sorted(rnd.sample(range(1, len(msgs)), rnd.randrange(1, 60)))
        batches = [msgs[i:j] for i, j in zip([0] + cuts, cuts + [len(msgs)])]
        for live in (False, True):
            eng = Engine(CONFIG)
            assert _alerts(eng, batches, live=live) == golden
            assert eng.stats["dead.late"] == 0


def _sampled(seconds: float, step: float, rnd: random.Random, jitter: float, miss: float,
             hosts: int = 4) -> list[tuple[str, list[DcgmRecord]]]:
    """Per-host messages of ``hosts`` hosts, each at its own phase of ``step``, each sample
    within ``jitter`` of its schedule, a share ``miss`` of them never sent; one host doubles its
    step halfway (an operator changing the interval); in arrival (event-time) order."""
    out = []
    for k in range(hosts):
        h = f"h{k}"
        phase = rnd.random() * step
        t = phase
        while t < seconds:
            s = step if not (k == 1 and t > seconds / 2) else 2 * step
            if rnd.random() >= miss:
                ts = t + rnd.uniform(-jitter, jitter)
                out.append((ts, h, _message(ts, h, fault_at=seconds * 0.6 if k == 0 else None)))
            t += s
    out.sort(key=lambda m: m[0])
    return [(h, m) for _, h, m in out]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("step,tick", [(1.0, 1.0), (5.0, 1.0), (30.0, 1.0), (1.0, 0.1), (1.0, 0.25)])
def test_a_host_trusted_to_keep_its_step_loses_no_sample_whatever_the_batching(seed, step, tick) -> None:
    # A host sending per-host messages counts as complete up to just before its next sample is
    # due (_whole_bound): with jitter within the margin, a missed sample, or a step that changes,
    # no sample of any host may come out late, and the alerts are the one-batch replay's.
    rnd = random.Random(seed)
    msgs = _sampled(60 * step, step, rnd, jitter=0.02 * step, miss=0.1)
    config = EngineConfig(idle_timeout=5.0, tick=tick)
    golden = _alerts(Engine(config), [msgs], live=False)
    assert any(a[1] == "firing" for a in golden)
    for _ in range(3):
        cuts = sorted(rnd.sample(range(1, len(msgs)), min(len(msgs) - 1, rnd.randrange(1, 80))))
        batches = [msgs[i:j] for i, j in zip([0] + cuts, cuts + [len(msgs)])]
        eng = Engine(config)
        assert _alerts(eng, batches, live=False) == golden
        assert eng.stats["dead.late"] == 0, f"{eng.stats['dead.late']} samples late"
    # And across a restore: the shortest step travels in the snapshot.
    k = rnd.randrange(1, len(msgs))
    first = Engine(config)
    head = [(a.id, a.state, a.rule, a.host, a.gpu, a.ts) for a in _feed(first, msgs[:k], now=None)]
    second = Engine(config)
    second.restore(first.snapshot())
    assert np.array_equal(second.host_min_step, first.host_min_step, equal_nan=True)
    assert head + _alerts(second, [msgs[k:]], live=False) == golden
    assert second.stats["dead.late"] == 0


def test_with_a_tick_shorter_than_the_step_a_sample_goes_within_a_tick() -> None:
    # 1 Hz hosts at phases spread over the second: with a 1 s tick a sample waits for the
    # partition's latest-phase host of its second; with a 0.1 s tick, for one tick at most.
    def lag(tick: float) -> float:
        eng = Engine(EngineConfig(idle_timeout=5.0, tick=tick))
        phases = {f"h{i}": 0.01 + i / 10 for i in range(10)}
        worst = 0.0
        for t, h in sorted((s + p, h) for s in range(60) for h, p in phases.items()):
            for a in _feed(eng, [(h, _message(t, h, fault_at=45 + phases[h] if h == "h0" else None))], now=None):
                if a.state == "firing":
                    worst = max(worst, t - (a.ts - T0))
        return worst

    assert lag(1.0) >= 0.8
    assert lag(0.1) <= 0.1 + 1e-6


def test_a_hosts_shortest_step_is_its_running_minimum_forgotten_by_one_percent_a_step() -> None:
    import warnings

    from pipeline.engine.hostclock import STEP_RECOVERY, latest_steps

    def run(batches: list[np.ndarray]) -> float:
        step, shortest = np.full(1, np.nan), np.full(1, np.nan)
        before = np.full(1, np.nan)
        for ts in batches:
            latest_steps(step, ts, np.zeros(len(ts), np.int64), before, 300.0, shortest=shortest)
            before[0] = ts[-1]
        return float(shortest[0])

    ts = np.cumsum([0.0, 1.0, 5.0, 5.0, 5.0])  # steps 1, 5, 5, 5
    expect = min(5.0, 1.0 * STEP_RECOVERY**3)
    assert run([ts]) == pytest.approx(expect)
    assert run([ts[:2], ts[2:3], ts[3:]]) == pytest.approx(expect)  # whatever the batching
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a backlog of one host in one batch: no overflow
        assert run([np.arange(100_000, dtype=float)]) == 1.0


@st.composite
def jittered_fleets(draw) -> tuple[list[tuple[str, list[DcgmRecord]]], EngineConfig, list[int], int]:
    """Hosts each with its own steady jitter (none to 2 % of the step, uniform), many at phases
    near the start of a tick, a tenth of the samples missed (never two in a row: at 30 s that
    is a host gone for longer than 2.5 steps); a batching and a restore point."""
    step = draw(st.sampled_from([1.0, 5.0, 30.0]))
    tick = draw(st.sampled_from([1.0, 1.0, 0.25]))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))  # the samples' noise, from one drawn seed
    msgs = []
    for k in range(4):
        h = f"h{k}"
        jitter = rnd.choice([0.0, 0.0005, 0.002, 0.005, 0.01, 0.02]) * step
        phase = rnd.choice([rnd.random(), rnd.uniform(0.0, 0.06)]) * step
        t, missed = phase, False
        while t < 80 * step:
            if missed or rnd.random() >= 0.1:
                ts = t + rnd.uniform(-jitter, jitter)
                msgs.append((ts, h, _message(ts, h, fault_at=48 * step if k == 0 else None)))
                missed = False
            else:
                missed = True
            t += step
    msgs.sort(key=lambda m: m[0])
    msgs = [(h, m) for _, h, m in msgs]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(msgs) - 1), max_size=80))))
    return msgs, EngineConfig(idle_timeout=5.0, tick=tick), cuts, draw(st.integers(1, len(msgs) - 1))


@pytest.mark.slow
@settings(max_examples=fuzz_examples(25), deadline=None)
@given(jittered_fleets())
def test_a_hosts_own_jitter_margin_loses_no_sample_whatever_the_batching(case) -> None:
    # The margin a host is given (twice the largest deviation of its steps, 0.5-5 % of the
    # step) covers its next sample: fed message by message or in any batches, across a restore,
    # no sample is late and the alerts are the one-batch replay's.
    msgs, config, cuts, cut = case
    golden = _alerts(Engine(config), [msgs], live=False)
    assert any(a[1] == "firing" for a in golden)
    for batches in ([[m] for m in msgs], [msgs[i:j] for i, j in zip([0] + cuts, cuts + [len(msgs)])]):
        eng = Engine(config)
        assert _alerts(eng, batches, live=False) == golden
        assert eng.stats["dead.late"] == 0, f"{eng.stats['dead.late']} samples late"
    first = Engine(config)
    head = [(a.id, a.state, a.rule, a.host, a.gpu, a.ts) for m in msgs[:cut] for a in _feed(first, [m], now=None)]
    second = Engine(config)
    second.restore(first.snapshot())
    assert np.array_equal(second.host_jitter, first.host_jitter, equal_nan=True)
    assert head + _alerts(second, [[m] for m in msgs[cut:]], live=False) == golden
    assert second.stats["dead.late"] == 0


def test_a_host_sampled_every_30_s_that_misses_a_sample_still_counts_when_its_next_comes() -> None:
    # a misses its sample of 61.9 and sends 91.97 just after b's 91.95: 60 s of silence, more
    # than allowed_lateness (30 s) and one step. Counted gone, a was not waited for, b completed
    # the tick of 91 and a's sample came late; a host counts for 2.5 steps, as absence has it.
    eng = Engine(CONFIG)
    times = [("a", 1.9), ("b", 1.95), ("a", 31.9), ("b", 31.95), ("b", 61.95), ("b", 91.95), ("a", 91.97),
             ("b", 121.95), ("a", 121.9)]
    for h, t in times:
        _feed(eng, [(h, _message(t, h))], now=None)
    eng.flush()
    assert eng.stats["dead.late"] == 0
    assert eng.state.last_ts[eng.entities.gpu("a", 0)] == pytest.approx(T0 + 121.9)
