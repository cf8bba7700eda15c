"""One DCGM sample a tick (``HostClock.one_per_tick``, docs/architecture.md §4): the moves are
a plain record-by-record reference's whatever the batching and across a snapshot; a host
sampling at the tick with jitter around a tick's start sends one sample a tick; and through the
engine such hosts lose no sample as ``late`` while each counts as complete for its newest
sample's tick."""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine import EngineConfig
from pipeline.engine.hostclock import SAMPLE_SHIFT, HostClock
from tests.factories import T0, fuzz_examples
from tests.unit.engine.hostclock_factories import RefHost, batches, engine, feed, message, ref_move

TICKS = (1.0, 0.5, 5.0)


def ref_moved(recs: list[tuple[float, int, bool]], tick: float) -> list[float]:
    """Where each record goes, record by record (``ref_move``); only DCGM samples move."""
    hosts: dict[int, RefHost] = {}
    return [ref_move(hosts.setdefault(h, RefHost()), t, tick) if d else t for t, h, d in recs]


@st.composite
def streams(draw) -> tuple[list[tuple[float, int, bool]], list[int], int | None, float]:
    """Hosts sampled at 0.5-30 ticks, at phases at and around a tick's start, with jitter,
    several GPUs a sample, missed samples, NCCL records between, a clock that steps back, a
    NaN; arriving interleaved. And a batching, a cut to snapshot at, and the tick."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    tick = draw(st.sampled_from(TICKS))
    out: list[tuple[float, float, int, bool]] = []  # (arrival, ts, host, dcgm)
    for h in range(draw(st.integers(1, 5))):
        step = rnd.choice([0.5, 1.0, 1.0, 1.0, 2.0, 5.0, 30.0]) * tick
        phase = rnd.choice([0.0, 0.003, 0.02, 0.9, 0.95, 0.97, 0.99, rnd.random()]) * tick
        jitter = rnd.choice([0.0, 0.005, 0.02, 0.04, 0.15]) * tick
        gpus = rnd.choice([1, 3])
        lag = rnd.choice([0.0, 0.4, 3.0]) * tick
        back = rnd.random() < 0.1
        t = phase
        for i in range(rnd.randrange(5, 60)):
            if rnd.random() > 0.1:
                ts = T0 + t + rnd.uniform(-jitter, jitter) - (2.5 * tick if back and i > 20 else 0.0)
                out += [(t + lag + g * 1e-6, ts, h, True) for g in range(gpus)]
            if rnd.random() < 0.2:
                out.append((t + lag + 0.5 * step, T0 + t + rnd.uniform(0, step), h, False))
            t += step
    if rnd.random() < 0.1:
        out.append((out[0][0], math.nan, 0, True))
    out.sort(key=lambda r: r[0])
    recs = [(ts, h, d) for _, ts, h, d in out]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(recs) - 1)), max_size=20))))
    snap = draw(st.none() | st.sampled_from(cuts)) if cuts else None
    return recs, cuts, snap, tick


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(streams())
def test_the_moves_are_the_references_whatever_the_batching_and_across_a_snapshot(case) -> None:
    recs, cuts, snap, tick = case
    n = 1 + max(h for _, h, _ in recs)
    clock = HostClock(EngineConfig(tick=tick))
    clock.grow(n)
    got: list[float] = []
    done = 0
    for batch in batches(recs, cuts):
        if snap is not None and done == snap:  # a restored clock moves as the one it was
            restored = HostClock(EngineConfig(tick=tick))
            restored.load_state(clock.to_state())
            clock = restored
        ts = np.array([t for t, _, _ in batch])
        hosts = np.array([h for _, h, _ in batch], np.int64)
        new, moved = clock.one_per_tick(ts, hosts, np.array([d for _, _, d in batch], bool))
        assert np.array_equal(moved, ~((new == ts) | np.isnan(ts)))
        got += new.tolist()
        done += len(batch)
    want = ref_moved(recs, tick)
    assert np.array_equal(np.array(got), np.array(want), equal_nan=True)
    # A move is forward, into the next tick, by at most a tenth of a tick.
    raw = np.array([t for t, _, _ in recs])
    with np.errstate(invalid="ignore"):
        shift = np.array(got) - raw
    moved = shift > 0
    assert (shift[moved] <= SAMPLE_SHIFT * tick + 1e-9).all()
    assert not (shift < 0).any()


@st.composite
def at_the_tick(draw) -> tuple[list[tuple[str, float]], list[int], list[float]]:
    """Hosts sampled every tick (1 s) within 5 % of a tick's start, before or after it, with up
    to 2.5 % of jitter; some miss samples. Their messages in arrival order, and a batching."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 4))
    phases = [rnd.uniform(-0.05, 0.05) for _ in range(n)]
    jitters = [rnd.choice([0.0, 0.002, 0.01, 0.025]) for _ in range(n)]
    msgs = []
    for s in range(1, 80):
        for h in range(n):
            if rnd.random() < 0.05:
                continue
            msgs.append((s + phases[h] + rnd.uniform(-jitters[h], jitters[h]), f"h{h}"))
    msgs.sort()
    cuts = sorted(set(draw(st.lists(st.integers(1, len(msgs) - 1), max_size=40))))
    return msgs, cuts, jitters


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(at_the_tick())
def test_hosts_sampling_at_the_tick_around_its_start_send_one_sample_a_tick_and_lose_none(case) -> None:
    msgs, cuts, jitters = case
    eng = engine()
    ticks: dict[str, list[int]] = {}
    for batch in batches(msgs, cuts):
        out = feed(eng, [(h, message(T0 + t, h)) for t, h in batch])
        assert not out.dead  # nothing late: a second goes only once each host is complete for it
        for t, h in batch:
            ticks.setdefault(h, [])
    # Where each sample went, as the engine forwards it: one a tick, in the order they came.
    moved = HostClock(EngineConfig())
    moved.grow(len(ticks))
    for t, h in msgs:
        new, _ = moved.one_per_tick(np.array([T0 + t]), np.array([int(h[1:])]), np.ones(1, bool))
        ticks[h].append(math.floor(float(new[0])))
    for h, ks in ticks.items():
        assert all(b > a for a, b in zip(ks, ks[1:])), h
    # A steady host (at most 1 % of jitter) counts as complete for its newest sample's tick, the
    # one that sample went to.
    n = eng.entities.n_hosts
    _, complete = eng.clock.watermark(n, eng.released, None, 0)
    steady = [eng.entities.host_id[h] for h in ticks if jitters[int(h[1:])] <= 0.01]
    assert complete is not None
    for i in steady:
        assert complete[i] >= math.floor(eng.clock.dcgm_at[i]) + 1.0, i
