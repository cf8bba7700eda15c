"""screen_fleet against the screening as it was before a few hosts claiming jumps stopped
costing every record the fleet's size (``_ref_*``: that code, copied): the same codes, the same
reference time of every refused record, the same jumps claimed, over random fleets; and what a
batch costs with one host years ahead, counted in presents worked out."""

from __future__ import annotations

import bisect
import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine import screen
from pipeline.engine.config import EngineConfig
from pipeline.engine.hostclock import HostClock
from pipeline.engine.screen import AHEAD, LATE, Verdict, screen_fleet

YEAR = 365 * 86400.0


# -- the reference: pipeline/engine/screen.py as it was -------------------------------------------


def _ref_screen_fleet(clock: HostClock, n: int, ts: np.ndarray, hosts: np.ndarray, released: float) -> Verdict:
    """The replay engine's screen: against the fleet's clock (``n`` hosts known).

    Judged record by record in stream order, so the answer does not depend on the batching; the
    common case (nothing ahead, no jump claimed) is one vectorised comparison.
    """
    cfg = clock.config
    claimed = np.fmax(clock.hwm[:n], clock.jump[:n])
    alive = clock.alive(n)
    now = _ref_present(claimed, alive)
    k = (len(ts) - 1) // 2
    median = float(np.partition(ts, k)[k])
    if not np.isnan(clock.jump[:n]).all():
        return _ref_screen_in_order(clock, n, ts, hosts, claimed, median, released)
    # Not the present now but the lowest it can fall to within the batch: record by record a
    # host can come to count or one at the median stop, and the answer must not change.
    low = median if math.isnan(now) else lowest__ref_present(clock, ts, hosts, claimed, alive)
    if (ts > low + cfg.max_ahead).any():
        return _ref_screen_in_order(clock, n, ts, hosts, claimed, median, released)
    # Behind: against the stream's progress when the record came (a running max), which
    # nothing ahead can have inflated here, and which is the same whatever the batching.
    progress = np.maximum.accumulate(ts)
    np.maximum(progress, clock.newest(n), out=progress)
    behind = (ts < released) | (ts < progress - cfg.max_lag)
    if not behind.any():
        return None
    return np.where(behind, LATE, 0).astype(np.int8), progress


def _ref_present(claimed: np.ndarray, alive: np.ndarray) -> float:
    """The fleet's present: the lower median of what the live hosts claim (NaN: none yet)."""
    known = claimed[alive & ~np.isnan(claimed)]
    if not len(known):
        return math.nan
    k = (len(known) - 1) // 2
    return float(np.partition(known, k)[k])


def lowest__ref_present(
    clock: HostClock, ts: np.ndarray, hosts: np.ndarray, claimed: np.ndarray, alive: np.ndarray
) -> float:
    """The lowest the present can fall to while ``screen_in_order`` judges this batch, as long
    as none of its records is ahead (its premise: it is the check of that).

    Claims only rise then, so the present falls only as the set of live hosts changes: a host
    comes to count (one heard in the batch, or one seen once, whose wait the fleet's longest
    step can lengthen) or stops (one alive now that the batch's newest record can outrun).
    The lowest lower median over those sets keeps every host sure to stay alive and adds
    the others' lowest claims from the bottom while they pull it down."""
    cfg = clock.config
    n = len(claimed)
    newest = max(clock.newest(n), float(ts.max()))
    hwm, seen = clock.hwm[:n], clock.seen[:n]
    sending = np.zeros(n, bool)
    sending[hosts] = True
    first = np.full(n, np.inf)
    np.minimum.at(first, hosts, ts)
    low = np.where(np.isnan(claimed), first, claimed)  # a new host claims at least its first record
    with np.errstate(invalid="ignore"):
        # Alive through to the batch's newest record whatever comes (wait >= allowed_lateness).
        sure = alive & ((hwm >= newest - cfg.allowed_lateness) | (seen >= newest - cfg.allowed_lateness))
    may = (alive | sending | np.isnan(clock.step[:n])) & ~sure & np.isfinite(low)
    if not may.any():
        return _ref_present(claimed, sure)
    counted = np.sort(low[sure]).tolist()
    for c in np.sort(low[may]).tolist():
        if counted and c > counted[(len(counted) - 1) // 2]:
            break  # this one and every one after it would only raise the median
        bisect.insort(counted, c)
    return counted[(len(counted) - 1) // 2]


def _ref_screen_in_order(
    clock: HostClock,
    n: int,
    ts: np.ndarray,
    hosts: np.ndarray,
    claimed: np.ndarray,
    first: float,
    released: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``screen_fleet`` one record at a time (a host or the fleet claims a jump: rare).

    Each record is judged on the state the engine would have left had the records before it
    come one batch each: marks, stream progress and sampling steps are kept up to date here as
    ``HostClock.hear`` keeps them, on copies (the engine reads the state before the batch).
    Only ``clock.jump`` is kept in place."""
    cfg = clock.config
    claimed = claimed.copy()
    hwm, seen, jump = clock.hwm[:n].copy(), clock.seen[:n].copy(), clock.jump
    step = clock.step[:n].copy()
    wait = clock.wait(n)
    why = np.zeros(len(ts), np.int8)
    ref = np.empty(len(ts))
    newest = clock.newest(n)
    for i, (t, h) in enumerate(zip(ts.tolist(), hosts.tolist())):
        # Aliveness as HostClock.alive has it (a host that went silent in the middle of this
        # batch stops counting for the present); the sending host counts only if it did already.
        with np.errstate(invalid="ignore"):
            alive = (hwm >= newest - cfg.allowed_lateness) | (newest - seen <= wait)
        now = _ref_present(claimed, alive)
        start = math.isnan(now)  # no host yet: the batch's median judges what is ahead
        ref[i] = now = first if start else now
        if t > now + cfg.max_ahead:
            why[i] = AHEAD
            jump[h] = t
            claimed[h] = t if math.isnan(claimed[h]) else max(t, claimed[h])
            continue  # a record refused as ahead says nothing of its host (see Engine.process)
        if t < released or t < newest - cfg.max_lag:
            why[i] = LATE
            ref[i] = newest
        else:
            jump[h] = np.nan
        # Heard, late or not: as HostClock.hear has it, the host's mark, step and progress move.
        if math.isnan(hwm[h]) or t > hwm[h]:
            if not math.isnan(hwm[h]):
                step[h] = min(t - hwm[h], cfg.max_lag)
                wait = clock.wait(n, step)
            hwm[h] = t
        claimed[h] = hwm[h] if math.isnan(jump[h]) else max(hwm[h], jump[h])
        newest = max(newest, t)
        seen[h] = newest if math.isnan(seen[h]) else max(seen[h], newest)
    return why, ref


# -- random fleets ----------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> tuple[tuple[float, float, float], list[tuple[float, int]], list[int], list[float]]:
    """The engine's knobs (allowed lateness, max lag, max ahead), a stream (time, host) in
    arrival order, where it is cut into batches, and a fraction of each batch's progress the
    watermark has reached (released values)."""
    knobs = draw(st.sampled_from([(30.0, 300.0, 300.0), (5.0, 60.0, 120.0), (30.0, 300.0, 20.0), (2.0, 40.0, 8.0)]))
    n = draw(st.integers(3, 14))
    seconds = draw(st.integers(20, 160))
    rnd = draw(st.randoms(use_true_random=False))
    stream: list[tuple[float, float, int]] = []
    for h in range(n):
        step = rnd.choice((1.0, 5.0, 10.0, 30.0))
        begin = rnd.choice((0.0, 0.0, 0.0, rnd.uniform(0, seconds)))  # joiners
        end = rnd.choice((seconds, seconds, rnd.uniform(begin, seconds)))  # vanishing hosts
        off = 0.0
        kind = rnd.random()
        if kind < 0.25:  # ahead: 10 s .. 10 years, maybe only from some point on
            near = knobs[2] * rnd.uniform(0.7, 1.6)  # about max ahead
            off = rnd.choice((near, near, 10.0, 60.0, 301.0, 3600.0, 86400.0, YEAR, 10 * YEAR))
        elif kind < 0.4:  # behind
            off = -rnd.choice((10.0, 60.0, 400.0, 3600.0))
        from_t = rnd.choice((begin, rnd.uniform(begin, seconds)))
        t = begin + rnd.uniform(0, step)
        while t < end:
            ts = t + (off if t >= from_t else 0.0) + rnd.uniform(-0.05, 0.05)
            if rnd.random() < 0.02:
                ts = rnd.choice((ts + 20 * YEAR, ts - 1000.0, math.nan))  # one record far off
            if rnd.random() > 0.05:  # missed samples
                stream.append((t + rnd.expovariate(2.0), ts, h))
            t += step
    stream.sort(key=lambda r: r[0])
    records = [(ts, h) for _, ts, h in stream]
    cuts = sorted(set(draw(st.lists(st.integers(0, len(records)), max_size=8))) | {len(records)})
    released = [rnd.choice((-math.inf, 0.0, 0.5, 0.9, 1.0)) for _ in cuts]
    return knobs, records, cuts, released


def _hear(clock: HostClock, n: int, ts: np.ndarray, hosts: np.ndarray, why: np.ndarray | None) -> None:
    if why is not None:
        heard = why != AHEAD
        ts, hosts = ts[heard], hosts[heard]
    if len(ts):
        clock.hear(ts, hosts, n)


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_the_same_verdicts_as_record_by_record(fleet: tuple) -> None:
    knobs, records, cuts, released_at = fleet
    lateness, lag, ahead = knobs
    clock = HostClock(EngineConfig(allowed_lateness=lateness, max_lag=lag, max_ahead=ahead))
    n, at, released = 0, 0, -math.inf
    for cut, fraction in zip(cuts, released_at):
        batch = records[at:cut]
        at = cut
        if not batch:
            continue
        ts = np.array([t for t, _ in batch])
        hosts = np.array([h for _, h in batch], np.int64)
        n = max(n, int(hosts.max()) + 1)
        clock.grow(n)
        newest = clock.newest(n)
        if math.isfinite(newest) and fraction != -math.inf:
            released = max(released, newest - lateness * (1 - fraction))
        ref_clock = copy.deepcopy(clock)
        got = screen_fleet(clock, n, ts, hosts, released)
        want = _ref_screen_fleet(ref_clock, n, ts, hosts, released)
        np.testing.assert_array_equal(clock.jump[:n], ref_clock.jump[:n])
        if want is None:
            assert got is None
        else:
            assert got is not None
            np.testing.assert_array_equal(got[0], want[0])
            bad = want[0] != 0
            np.testing.assert_array_equal(got[1][bad], want[1][bad])  # a kept record's: read by nothing
        _hear(clock, n, ts, hosts, None if want is None else want[0])
        _hear(ref_clock, n, ts, hosts, None if want is None else want[0])


# -- what it costs ------------------------------------------------------------------------------


def test_one_host_years_ahead_costs_its_own_records_not_the_fleet_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: every record of every batch after the host's first worked out the present over
    # the whole fleet (an np.partition of 2,000 claims, 2,000 records a batch: quadratic).
    n, batches = 2000, 6
    calls = 0
    real = screen.present

    def counted(claimed: np.ndarray, alive: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        if calls > 10 * batches:
            raise AssertionError("the present worked out record by record")
        return real(claimed, alive)

    monkeypatch.setattr(screen, "present", counted)
    clock = HostClock(EngineConfig())
    clock.grow(n)
    hosts = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(7)
    dead = 0
    for b in range(batches):
        ts = 1000.0 + b + rng.uniform(0, 0.5, n)
        ts[n - 1] += 10 * YEAR
        verdict = screen_fleet(clock, n, ts, hosts, -math.inf)
        why = np.zeros(n, np.int8) if verdict is None else verdict[0]
        dead += int((why != 0).sum())
        assert (why == AHEAD).tolist() == [False] * (n - 1) + [True]
        _hear(clock, n, ts, hosts, why)
    assert dead == batches and not math.isnan(clock.jump[n - 1])
    assert calls <= 4 * batches
    assert LATE not in why


def test_hosts_that_fall_silent_in_the_batch_lower_the_floor() -> None:
    # Three hosts at the front stop sending: once the stream is past their wait, the present
    # is the lower median of the two still sending, one of them 10 s behind, and a record
    # 8.5 s past that is ahead, though not past what the present was when the batch began.
    clock = HostClock(EngineConfig(allowed_lateness=2.0, max_lag=40.0, max_ahead=8.0))
    clock.grow(6)
    clock.hwm[:5] = [100.0, 100.0, 100.0, 90.0, 99.0]
    clock.seen[:5] = [100.0, 100.0, 100.0, 100.0, 99.5]
    clock.step[:5] = 1.0
    clock.jump[5] = 1e9  # a host heard only ahead: the batch is judged record by record
    ts = np.array([101.0, 91.0, 102.0, 92.0, 103.0, 93.0, 104.0, 94.0, 102.5])
    hosts = np.array([4, 3, 4, 3, 4, 3, 4, 3, 3])
    ref_clock = copy.deepcopy(clock)
    got = screen_fleet(clock, 6, ts, hosts, -math.inf)
    want = _ref_screen_fleet(ref_clock, 6, ts, hosts, -math.inf)
    assert want is not None and got is not None
    assert want[0].tolist() == [0] * 8 + [AHEAD] and want[1][-1] == 94.0
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1][-1] == want[1][-1]
    np.testing.assert_array_equal(clock.jump, ref_clock.jump)
