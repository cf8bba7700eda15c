"""The host clock's release rule against a plain reference of what docs/architecture.md §4 says
it is: the marks, the watermark and each host's completeness, record by record; and the engine
it drives, with hosts sampled every 1, 5, 10 and 30 s that arrive late, run skewed clocks, miss
samples, join mid-run and vanish, clocks that step, one years off, non-finite times and many
hosts. What is looked for: a second never released (a stall), one released before a live
host's data (a sample lost as ``late``), buffers that grow without bound, crashes."""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass

import msgspec
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.engine import Engine, EngineConfig
from pipeline.engine.arrays import from_dict, to_dict
from pipeline.engine.hostclock import (
    JITTER_FADE,
    JITTER_TRUSTED_AFTER,
    HostClock,
    latest_steps,
)
from pipeline.errors import StateError
from pipeline.schema import DcgmRecord, dcgm
from tests.factories import T0, fuzz_examples
from tests.fleet_factories import no_hang
from tests.unit.engine.hostclock_factories import (
    CONFIG,
    RefClock,
    RefHost,
    batches,
    engine,
    feed,
    host_clock,
    message,
    ref_move,
)

STEPS = (1.0, 5.0, 10.0, 30.0)
YEARS = 10 * 365 * 86400.0


# -- the reference: docs/architecture.md §4, one record at a time, in plain Python ------------


def ref_margin(clock: HostClock, h: int, trusted: float) -> float:
    """The jitter margin the docs give a host: 5 % of its step (or of a tick) until it has shown
    its jitter over ten steps, then twice its largest deviation, within 0.5-5 %."""
    scale = max(trusted, clock.config.tick)
    if clock.jitter_n[h] < JITTER_TRUSTED_AFTER:
        return 0.05 * scale
    return min(max(2 * float(clock.jitter[h]), 0.005 * scale), 0.05 * scale)


# -- streams of (ts, host) the clock hears -----------------------------------------------------


@st.composite
def heard(draw, backwards: bool = False) -> tuple[list[tuple[float, int]], list[bool], list[int]]:
    """Records as they arrive: hosts sampled every 1-30 s at their own phase, some with jitter,
    each host's clock skewed (one years off, ahead or behind), arriving with their own delay,
    some joining late and some vanishing, samples missed; ``backwards``: clocks may also step
    back. Each host's records in its own time order otherwise. And a batching."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 6))
    span = draw(st.sampled_from([40.0, 200.0, 600.0]))
    out: list[tuple[float, float, int]] = []  # (arrival, ts, host)
    for h in range(n):
        step = rnd.choice(STEPS)
        skew = rnd.choice([0.0, 0.0, rnd.uniform(-60, 60), rnd.choice([YEARS, -2 * YEARS])])
        jitter = rnd.choice([0.0, 0.002, 0.02]) * step
        lag = rnd.choice([0.0, 0.3, 5.0, 45.0])
        join = 0.0 if rnd.random() < 0.6 else rnd.uniform(0, span)
        vanish = span if rnd.random() < 0.7 else rnd.uniform(join, span)
        jump = rnd.choice([0.0, 0.0, 20.0, 400.0] + ([-3.0, -100.0] if backwards else []))
        jump_at = rnd.uniform(join, span)
        t = join + rnd.random() * step
        while t < vanish:
            if rnd.random() > 0.1:
                ts = T0 + t + skew + rnd.uniform(-jitter, jitter) + (jump if t >= jump_at else 0.0)
                out.append((t + lag, ts, h))
            t += step
    out.sort()
    recs = [(ts, h) for _, ts, h in out]
    assume(recs)
    if not backwards:  # each host's own records in time order, as the reference's steps assume
        last: dict[int, float] = {}
        for ts, h in recs:
            assume(ts >= last.get(h, -math.inf))
            last[h] = ts
    whole = [rnd.random() < 0.7 for _ in range(n)]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(recs) - 1)), max_size=30))))
    return recs, whole, cuts


def _hear(clock: HostClock, batch: list[tuple[float, int]], n: int) -> None:
    ts = np.array([t for t, _ in batch])
    hosts = np.array([h for _, h in batch], np.int64)
    clock.one_per_tick(ts, hosts, np.ones(len(ts), bool))  # each a DCGM sample; heard as sent
    clock.hear(ts, hosts, n)
    clock.accepted(ts[~np.isnan(ts)])


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(heard())
def test_the_marks_and_the_watermark_are_the_references_whatever_the_batching(case) -> None:
    # Marks, stream progress, steps and the shortest step are the same however the records were
    # batched (each host's own in order), and the watermark and each host's completeness are
    # what the docs' rule gives from them, after every batch.
    recs, whole, cuts = case
    n = len(whole)
    ref = RefClock(CONFIG)
    for h in range(n):
        ref.hosts[h] = RefHost(whole=whole[h])
    clock = host_clock(CONFIG, n, whole)
    released = -math.inf
    for batch in batches(recs, cuts):
        _hear(clock, batch, n)
        ref.batch()
        for t, h in batch:
            ref_move(ref.hosts[h], t, CONFIG.tick)
            ref.hear(t, h)
            ref.accept(t)
        marks = (("hwm", clock.hwm), ("seen", clock.seen), ("step", clock.step), ("lead", clock.lead))
        for name, got in marks:
            want = [getattr(ref.hosts[h], name) for h in range(n)]
            assert np.allclose(got[:n], want, rtol=1e-12, atol=0, equal_nan=True), name
        for name, got in (("min_step", clock.min_step), ("trusted", clock.trusted_step)):
            want = [getattr(ref.hosts[h], name) for h in range(n)]
            assert np.allclose(got[:n], want, rtol=1e-9, atol=0, equal_nan=True), name
        assert clock.first_ts == ref.first_ts
        margin = {h: ref_margin(clock, h, float(clock.trusted_step[h])) for h in range(n)}
        wm, complete = clock.watermark(n, released, None, 0)
        want_wm, want_complete = ref.watermark(released, margin)
        assert wm == pytest.approx(want_wm, rel=1e-15, abs=1e-9)
        if want_complete is None:
            assert complete is None
        else:
            assert complete is not None
            got = {h: float(complete[h]) for h in range(n) if complete[h] != -math.inf}
            assert got.keys() == want_complete.keys()
            for h in got:
                assert got[h] == pytest.approx(want_complete[h], rel=1e-15, abs=1e-9), h
        released = math.floor(wm) if math.isfinite(wm) else released


@settings(max_examples=fuzz_examples(80), deadline=None)
@given(heard(backwards=True))
def test_clocks_that_step_back_keep_the_marks_and_progress_whatever_the_batching(case) -> None:
    # A clock stepping back: each host's newest time and the stream's progress stay the
    # reference's, and the watermark is a number that never goes back.
    recs, whole, cuts = case
    n = len(whole)
    ref = RefClock(CONFIG)
    clock = host_clock(CONFIG, n, whole)
    released = -math.inf
    for batch in batches(recs, cuts):
        _hear(clock, batch, n)
        for t, h in batch:
            ref.hear(t, h)
        assert np.array_equal(clock.hwm[:n], [ref.hosts.get(h, RefHost()).hwm for h in range(n)], equal_nan=True)
        assert np.array_equal(clock.seen[:n], [ref.hosts.get(h, RefHost()).seen for h in range(n)], equal_nan=True)
        wm, _ = clock.watermark(n, released, None, 0)
        assert not math.isnan(wm) and wm >= released
        released = wm


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(st.lists(st.floats(0.5, 40.0), min_size=2, max_size=80), st.integers(1, 3))
def test_jitter_is_the_largest_deviation_from_whole_multiples_of_the_trusted_step(gaps, hosts) -> None:
    # Heard one record at a time: each step forward's deviation from the nearest whole multiple
    # (one to three) of the step the host is trusted with, a running maximum fading by 1 % a
    # measured step; steps past three multiples say nothing.
    clock = host_clock(CONFIG, hosts, [True] * hosts)
    jitter, count = [math.nan] * hosts, [0] * hosts
    trusted, hwm = [math.nan] * hosts, [math.nan] * hosts
    ref = RefClock(CONFIG)
    t = T0
    for i, g in enumerate(gaps):
        h = i % hosts
        t_h = t if math.isnan(hwm[h]) else hwm[h] + g
        if not math.isnan(hwm[h]) and trusted[h] > 0:
            gap = t_h - hwm[h]
            k = round(gap / trusted[h])
            if k <= 3:
                dev = abs(gap - max(k, 1) * trusted[h])
                jitter[h] = dev if math.isnan(jitter[h]) else max(jitter[h] * JITTER_FADE, dev)
                count[h] += 1
        clock.hear(np.array([t_h]), np.array([h]), hosts)
        ref.hear(t_h, h)
        hwm[h], trusted[h] = t_h, ref.hosts[h].trusted
    assert np.allclose(clock.jitter[:hosts], jitter, rtol=1e-9, atol=1e-12, equal_nan=True)
    assert clock.jitter_n[:hosts].tolist() == count


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=30),
       st.lists(st.integers(0, 3), min_size=30, max_size=30))
@settings(max_examples=fuzz_examples(150), deadline=None)
def test_any_times_at_all_raise_nothing_and_a_nan_says_nothing(times, hosts) -> None:
    # NaN, infinities, negatives, 1e308: hearing them and asking for the watermark raise
    # nothing (an infinite newest time raised OverflowError in whole_bound, batch after batch),
    # the watermark is never NaN, and a record whose time is NaN leaves every mark as the batch
    # without it would: before, one NaN first in a batch kept the stream's progress from every
    # record after it, so the hosts that sent them could count as silent.
    ts = np.array(times)
    hs = np.array(hosts[: len(ts)], np.int64)
    with np.errstate(invalid="ignore"):  # (inf - inf on the way: a warning, as numpy has it)
        clock = host_clock(CONFIG, 4, [True, False, True, False])
        clock.hear(ts, hs, 4)
        clock.accepted(ts[~np.isnan(ts)])
        wm, _ = clock.watermark(4, -math.inf, None, 0)
        assert not math.isnan(wm)
        clock.watermark(4, -math.inf, 100.0, 0)
        without = host_clock(CONFIG, 4, [True, False, True, False])
        ok = ~np.isnan(ts)
        without.hear(ts[ok], hs[ok], 4)
    for a in ("hwm", "seen", "step", "min_step", "trusted_step", "jitter", "jitter_n"):
        assert np.array_equal(getattr(clock, a)[:4], getattr(without, a)[:4], equal_nan=True), a


# -- the engine: no sample lost, no second held for ever, bounded buffers ---------------------


def _steady(step: float, phase: float, missed: set[int], lag: float, end: float,
            others: float = 0.3) -> list[tuple[str, list[DcgmRecord]]]:
    """Hosts a and b every second at ``others``; c every ``step`` s at ``phase`` from a steady
    clock, its samples numbered ``missed`` never sent, its messages ``lag`` s behind the
    others'; all as they arrive."""
    sent = [(t, t, h) for h in ("a", "b") for t in np.arange(others, end, 1.0).tolist()]
    sent += [(phase + k * step + lag, phase + k * step, "c") for k in range(int(end / step)) if k not in missed]
    sent.sort()
    return [(h, message(T0 + ts, h)) for _, ts, h in sent]


@pytest.mark.parametrize("step,phase", [(1.0, 0.997), (5.0, 0.98), (10.0, 0.96), (30.0, 0.9)])
def test_a_steady_host_that_misses_a_sample_loses_none_of_the_samples_after(step, phase) -> None:
    # c misses one sample after it has shown a steady clock, and its messages come half a second
    # behind the others'. Its shortest step had grown by 1 % over the missed one, beyond the
    # 0.5 % margin a steady clock is given: its next sample was promised not to come before the
    # tick after it, the others completed that tick first, and the sample was dead-lettered
    # late. What it is trusted with is a step it sampled at, not one grown by forgetting.
    trusted = 40 if step == 1.0 else 20
    msgs = _steady(step, phase, missed={trusted}, lag=0.5, end=step * (trusted + 10))
    for size in (1, 7):
        eng = engine()
        lost = []
        for i in range(0, len(msgs), size):
            lost += [(d.host, d.ts - T0) for d in feed(eng, msgs[i:i + size]).dead]
        assert lost == []
        assert eng.clock.trusted_step[eng.entities.host_id["c"]] == pytest.approx(step)


def test_a_snapshot_from_before_the_trusted_step_restores_with_the_shortest_step() -> None:
    eng = engine()
    for h, m in _steady(5.0, 0.5, set(), 0.0, 200.0):
        feed(eng, [(h, m)])
    data = msgspec.msgpack.decode(eng.snapshot())
    assert "host_trusted_step" in data
    del data["host_trusted_step"]
    back = engine()
    back.restore(msgspec.msgpack.encode(data))
    assert np.array_equal(back.clock.trusted_step, eng.host_min_step, equal_nan=True)
    assert back.clock.trusted_step is not back.host_min_step


@dataclass
class Host:
    name: str
    step: float
    phase: float
    jitter: float  # uniform, as a share of the step
    lag: float  # how long its messages take, next to the others'
    skew: float  # how far its clock is off
    join: float
    vanish: float | None
    leap: float = 0.0  # how far its clock steps ahead at ``leap_at`` (within max_ahead)
    leap_at: float = math.inf


@st.composite
def fleets(draw):
    """A few hosts, each sampled every 1, 5, 10 or 30 s at a phase anywhere in the second (the
    first and last half percent included), from a steady or a jittery clock (up to 2 %), with
    its own delay and skew, some joining mid-run, some vanishing (before any clock steps
    ahead), one whose clock may step 45 or 150 s ahead; a tenth of the samples missed
    once the host has shown its step (a host's second sample missed as it joins is a question
    for the report, not this test). In arrival order; and a batching."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    hosts = []
    count = draw(st.integers(2, 5))
    leaper = rnd.randrange(count)
    for k in range(count):
        step = draw(st.sampled_from(STEPS))
        frac = draw(st.sampled_from([0.002, 0.3, 0.9, 0.96, 0.997]))
        hosts.append(Host(
            name=f"h{k}", step=step, phase=rnd.randrange(int(step)) + frac,
            jitter=draw(st.sampled_from([0.0, 0.0005, 0.002, 0.02])),
            lag=draw(st.sampled_from([0.0, 0.05, 0.5, 2.0])),
            skew=draw(st.sampled_from([0.0, 0.0, -12.0, 7.0])),
            join=0.0 if k == 0 or rnd.random() < 0.6 else rnd.uniform(60, 300),
            vanish=None if k == 0 or rnd.random() < 0.7 else rnd.uniform(350, 450),
            # (One clock leaping at most: two leaping in the same second is a documented limit.)
            leap=draw(st.sampled_from([0.0, 0.0, 45.0, 150.0])) if k == leaper else 0.0, leap_at=rnd.uniform(100, 500),
        ))
    # Hosts that stop while another's clock is ahead hold the release that lead longer, past
    # this test's bound: the strict xfail test_hostclock_leaps.py::
    # test_hosts_vanishing_while_one_is_ahead_count_as_gone_after_their_wait, not drawn here.
    leap_at = min((h.leap_at for h in hosts if h.leap), default=math.inf)
    for h in hosts:
        if h.vanish is not None and h.vanish > leap_at:
            h.vanish = None
    end = 700.0
    sent = []
    for h in hosts:
        t, i, missed = h.join + h.phase, 0, False
        while t < end and (h.vanish is None or t < h.vanish):
            if i >= 12 and not missed and rnd.random() < 0.1:
                missed = True
            else:
                ts = t + rnd.uniform(-h.jitter, h.jitter) * h.step
                sent.append((ts + h.lag, h.name, ts + h.skew + (h.leap if t >= h.leap_at else 0.0)))
                missed = False
            i, t = i + 1, t + h.step
    sent.sort()
    msgs = [(name, message(T0 + ts, name)) for _, name, ts in sent]
    if draw(st.booleans()):
        cuts = list(range(1, len(msgs)))
    else:
        cuts = sorted(set(draw(st.lists(st.integers(1, len(msgs) - 1), max_size=60))))
    return hosts, msgs, cuts


@settings(max_examples=fuzz_examples(20), deadline=None)
@given(fleets(), st.sampled_from([1.0, 1.0, 0.25]))
def test_no_sample_is_lost_no_second_is_held_and_the_buffer_stays_bounded(case, tick) -> None:
    # Lost: the only records dead-lettered are a joining host's from before it was first heard
    # (docs §4: "only what it sent before it was seen is lost"). Held: once every vanished host
    # has been silent longer than it counts, every second before the oldest newest sample of
    # the hosts still sending is released. Bounded: nothing waits from further back than
    # max_lag plus the start-up hold.
    hosts, msgs, cuts = case
    config = EngineConfig(tick=tick)
    eng = engine(config)
    heard_at: dict[str, float] = {}
    lost = []
    newest = -math.inf
    bounds = [0, *cuts, len(msgs)]
    bound = config.max_lag + config.allowed_lateness + max(STEPS) + tick
    for i, j in zip(bounds, bounds[1:]):
        out = feed(eng, msgs[i:j])
        for name, m in msgs[i:j]:
            heard_at.setdefault(name, eng.released)
            newest = max(newest, m[0].ts)
        lost += [(d.host, d.ts) for d in out.dead]
        if eng._chunks:
            assert min(c.tmin for c in eng._chunks) >= newest - bound
    bad = [(h, round(t - T0, 3)) for h, t in lost if t >= heard_at[h]]
    assert bad == [], [h for h in hosts if h.name in {b[0] for b in bad}]
    sending = [h.name for h in hosts if h.vanish is None]
    hwm = eng.host_hwm
    oldest = min(float(hwm[eng.entities.host_id[n]]) for n in sending)
    assert eng.released >= math.floor(oldest / tick) * tick - 1e-6


# -- clocks that step, a clock years off -------------------------------------------------------


def _fleet_with(bad: str, shift, seconds: int = 900, hosts: int = 4) -> tuple[Engine, list, list]:
    """``hosts`` hosts at 1 Hz, per-host messages, one batch a second; host ``bad``'s times
    moved by ``shift(t)``. What the engine dead-lettered, and how far it had released after each
    second."""
    eng = engine()
    dead, released = [], []
    for s in range(seconds):
        msgs = []
        for k in range(hosts):
            name = f"h{k}"
            t = s + 0.1 * k
            msgs.append((name, message(T0 + t + (shift(t) if name == bad else 0.0), name)))
        dead += feed(eng, msgs).dead
        released.append(eng.released - T0)
    return eng, dead, released


@pytest.mark.parametrize(
    "jump,stall",
    [(-2.0, 2.0), (-50.0, 51.0), (-1000.0, 300.0), (-2 * YEARS, 300.0), (20.0, 1.0), (YEARS, 31.0)],
)
def test_one_clock_that_steps_costs_only_its_own_records_and_holds_the_others_a_bounded_time(jump, stall) -> None:
    # h3's clock steps at 400 s, back or forward, by seconds, minutes or years. The other hosts
    # lose nothing; what h3 loses is its own. The others' release is held back at most: as far
    # as h3 lags, while it keeps sending, up to max_lag (300 s), its late records still saying
    # it is there; as long as a silent host counts (30 s and its step) when its records are
    # refused as ahead; not at all when it is ahead by less than that.
    # (Ahead by more than that and less than max_ahead: see the review's report.)
    eng, dead, released = _fleet_with("h3", lambda t: jump if t >= 400 else 0.0)
    assert {d.host for d in dead} <= {"h3"}
    worst = max(s - r for s, r in enumerate(released) if s > 60)
    assert worst <= stall
    assert released[-1] >= 899 - stall


@pytest.mark.parametrize("ahead", [35.0, 45.0, 100.0, 299.0])
@pytest.mark.parametrize("bad", ["h0", "h3"])
def test_a_clock_stepping_minutes_ahead_costs_the_others_nothing(ahead, bad) -> None:
    # One host's clock steps ahead by more than the others' wait and less than max_ahead, so
    # its records are taken. Measured from its time the others used to count as gone at once,
    # the release jumped to it and their samples of those seconds were late (4 hosts, 299 s:
    # 1,794 records). Whether it comes first or last in each batch, nothing is lost now and
    # the release keeps pace with the others.
    eng, dead, released = _fleet_with(bad, lambda t: ahead if t >= 400 else 0.0)
    assert dead == []
    assert max(s - r for s, r in enumerate(released) if s > 60) <= 1.0
    assert eng.clock.lead[eng.entities.host_id[bad]] == pytest.approx(ahead, abs=1.0)


def test_the_last_host_sending_holds_the_release_no_longer_than_its_wait() -> None:
    # The mirror image of a clock ahead: three of four hosts stop and one goes on alone at the
    # front, walking its own steps. It leaps nowhere, so the others count as gone after their
    # wait as before, and the release follows it.
    eng = engine()
    released = []
    for s in range(900):
        names = ["h0"] if s >= 400 else ["h0", "h1", "h2", "h3"]
        feed(eng, [(h, message(T0 + s + 0.1 * k, h)) for k, h in enumerate(names)])
        released.append(eng.released - T0)
    assert max(s - r for s, r in enumerate(released) if s > 60) <= 31.0
    assert not eng.clock.lead.any()


def test_a_clock_years_off_from_the_start_moves_nothing() -> None:
    eng, dead, released = _fleet_with("h2", lambda t: YEARS, seconds=200)
    assert {d.host for d in dead} == {"h2"} and {d.reason for d in dead} == {"ts_out_of_range"}
    assert released[-1] >= 197
    assert eng.stats["records.dcgm"] >= 3 * 2 * 196


# -- many hosts: cost linear in them ------------------------------------------------------------


def test_a_batch_of_a_million_hosts_is_heard_and_released_in_linear_time() -> None:
    # Quadratic in hosts this is 10^12 steps: hours. Linear, about a second.
    n = 1_000_000
    rng = np.random.default_rng(0)
    clock = host_clock(CONFIG, n, [True] * n)
    with no_hang(120):
        for k in range(3):
            ts = T0 + k + rng.random(n)
            clock.hear(ts, rng.permutation(n), n)
            clock.accepted(ts)
        wm, complete = clock.watermark(n, -math.inf, None, 0)
        clock.watermark(n, -math.inf, 1000.0, 0)
    assert math.isfinite(wm) and complete is None  # (the start-up hold: 3 s of a stream)


def test_one_hosts_backlog_of_a_million_records_in_one_batch_keeps_finite_steps() -> None:
    step, shortest, sampled = np.full(1, np.nan), np.full(1, np.nan), np.full(1, np.nan)
    ts = np.concatenate([[0.0, 0.5], 1.0 + np.arange(1_000_000, dtype=float)])
    with warnings.catch_warnings(), no_hang(60):
        warnings.simplefilter("error")
        latest_steps(step, ts, np.zeros(len(ts), np.int64), np.full(1, np.nan), 300.0, shortest=shortest,
                     sampled=sampled)
    assert step[0] == 1.0 and shortest[0] == 1.0 and sampled[0] == 1.0


def test_a_hundred_thousand_hosts_through_the_engine_in_linear_time() -> None:
    # The engine's per-batch work over its hosts (screening, marks, watermark, release): a
    # hundred thousand hosts in each batch. Quadratic in hosts that is 10^10 steps a batch
    # (an n-by-n array would not even fit in memory); linear, seconds in all.
    n = 100_000
    eng = engine(EngineConfig(max_hosts=n))
    names = [f"n{i}" for i in range(n)]
    with no_hang(120):
        for s in range(6):
            eng.process([dcgm(T0 + s + 0.5, h, 0, {"gpu_temp": 60}) for h in names])
    assert eng.entities.n_hosts == n and eng.stats["dead.late"] == 0
    assert eng.released == T0 + 5 - 30 - 1  # (still the start-up hold: 30 s and the step)


# -- snapshots: rows and marks that cannot be used are refused at restore ----------------------


def _snapshot() -> dict:
    eng = Engine()
    for s in range(5):
        eng.process([dcgm(T0 + s + 0.1 * h, f"h{h}", g, {"gpu_temp": 60}) for h in range(3) for g in range(2)])
    data = msgspec.msgpack.decode(eng.snapshot())
    assert data["pending_columns"]
    return data


def _chunk_with(data: dict, **changes) -> dict:
    chunk = dict(data["pending_columns"][0], **changes)
    return {**data, "pending_columns": [chunk]}


def _shorter(data: dict, key: str) -> dict:
    a = from_dict(data["pending_columns"][0][key])
    return _chunk_with(data, **{key: to_dict(a[:-1])})


@pytest.mark.parametrize(
    "hostile",
    [
        lambda d: _shorter(d, "ts"),
        lambda d: _shorter(d, "host"),
        lambda d: _shorter(d, "gpu"),
        lambda d: _shorter(d, "values"),
        lambda d: _chunk_with(d, host=to_dict(from_dict(d["pending_columns"][0]["host"]).astype(np.float64))),
        lambda d: _chunk_with(d, gpu=to_dict(from_dict(d["pending_columns"][0]["gpu"]) - 5)),
        lambda d: _chunk_with(d, values=to_dict(np.zeros(3))),
        lambda d: _chunk_with(d, cols=[0]),
        lambda d: {**d, "first_ts": None},
        lambda d: {**d, "first_ts": "soon"},
    ],
    ids=["ts-short", "host-short", "gpu-short", "values-short", "host-float", "gpu-negative", "values-1d",
         "cols-narrow", "first_ts-none", "first_ts-text"],
)
def test_a_snapshot_whose_rows_or_start_cannot_be_used_is_a_state_error_not_a_later_crash(hostile) -> None:
    # Before: each restored, then the next batch raised in numpy (broadcast, index, compare).
    with pytest.raises(StateError):
        Engine().restore(msgspec.msgpack.encode(hostile(_snapshot())))


def test_a_snapshots_rows_and_clock_restore_as_they_were() -> None:
    data = _snapshot()
    eng = Engine()
    eng.restore(msgspec.msgpack.encode(data))
    assert eng.pending == sum(len(from_dict(c["ts"])) for c in data["pending_columns"])
    assert eng.clock.first_ts == data["first_ts"]
