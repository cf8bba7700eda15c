"""Lifecycle against a per-row reference: for:, keep_firing_for:, repeats, restore."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine.lifecycle import Lifecycle, Transition
from tests.factories import T0, fuzz_examples


class Reference:
    """The lifecycle as a plain per-entity state machine, one row at a time."""

    def __init__(self, for_s: float, keep_s: float) -> None:
        self.for_s, self.keep_s = for_s, keep_s
        self.st: dict[int, list] = {}   # entity: [since, last_true, firing, started]

    def step(self, ts, ent, cond) -> list[Transition]:
        out = []
        order = sorted(range(len(ent)), key=lambda i: int(ent[i]))   # stable: rows in time order
        for i in order:
            e, t = int(ent[i]), float(ts[i])
            since, last_true, firing, started = self.st.get(e, [math.nan, math.nan, False, math.nan])
            if cond[i]:
                since = t if math.isnan(since) else since
                last_true = t
                if not firing and t - since >= self.for_s:
                    firing, started = True, since
                    out.append(Transition("firing", e, t, since, i))
            else:
                since = math.nan
                if firing and t - last_true >= self.keep_s:
                    firing = False
                    out.append(Transition("resolved", e, t, started, i))
            self.st[e] = [since, last_true, firing, started]
        return out


@pytest.mark.parametrize("seed", range(5))
def test_lifecycle_matches_the_per_row_reference(seed):
    rng = np.random.default_rng(seed)
    n_ent, for_s, keep_s = 12, 2.0, 4.0
    lc, ref = Lifecycle(for_s, keep_s), Reference(for_s, keep_s)
    hot = rng.random(n_ent) < 0.4          # entities whose condition flickers on often
    fired = 0
    for k in range(300):
        t = T0 + k
        if rng.random() < 0.7:             # the usual tick: every entity once, in id order
            ent = np.arange(n_ent, dtype=np.int32)
        else:                               # some entities missing, some twice
            ent = np.sort(rng.choice(n_ent, size=int(rng.integers(1, 2 * n_ent)))).astype(np.int32)
        ts = t + np.zeros(len(ent))
        on = (k // 15) % 2 == 0               # spells of trouble, then quiet: fire, resolve
        cond = hot[ent] & on & (rng.random(len(ent)) < 0.9)
        if k == 150:                        # a restore mid-stream continues exactly
            st = {key: v.copy() for key, v in lc.to_state().items()}
            lc = Lifecycle(for_s, keep_s)
            lc.load_state(st)
        got, want = lc.step(ts, ent, cond, n_ent), ref.step(ts, ent, cond)
        assert got == want, f"tick {k}"
        fired += len(got)
    assert fired >= 10   # firing and resolving both happened, several times
    for e, (since, last_true, firing, started) in ref.st.items():
        assert bool(lc.firing[e]) == firing
        np.testing.assert_array_equal([lc.since[e], lc.last_true[e], lc.started[e]], [since, last_true, started])


def test_a_quiet_fleet_visits_nothing():
    lc = Lifecycle(5.0, 10.0)
    ent = np.arange(1000, dtype=np.int32)
    assert lc.step(np.full(1000, T0), ent, np.zeros(1000, dtype=bool), 1000) == []
    assert not (~np.isnan(lc.since) | lc.firing).any()   # nothing pending, nothing firing


def test_a_step_without_rows_of_the_active_entities_leaves_their_state_alone():
    # Sampling slower than the tick: an entity with an active alert has no row in most steps.
    # Such a step must not touch any entity's state (it once wrote the defaults into the last
    # slot of the arrays -- the last-registered entity when the arrays are full -- so that
    # entity's alert re-fired under a new id and its `for:` never held).
    n = 16   # arrays grow by doubling from 16: entity 15 is in the last slot
    lc = Lifecycle(0.0, 0.0)
    assert [t.state for t in lc.step(np.array([T0]), np.array([15], np.int32), np.array([True]), n)] == ["firing"]
    assert lc.step(np.array([T0 + 1]), np.array([0], np.int32), np.array([False]), n) == []
    assert bool(lc.firing[15]) and lc.started[15] == T0
    assert lc.step(np.array([T0 + 10]), np.array([15], np.int32), np.array([True]), n) == []   # the same alert
    held = Lifecycle(5.0, 0.0)
    held.step(np.array([T0]), np.array([15], np.int32), np.array([True]), n)
    held.step(np.array([T0 + 3]), np.array([0], np.int32), np.array([False]), n)
    got = held.step(np.array([T0 + 10]), np.array([15], np.int32), np.array([True]), n)
    assert [(t.state, t.started_at) for t in got] == [("firing", T0)]   # for: 5 s held from T0


@pytest.mark.parametrize("seed", range(3))
def test_quiet_says_true_only_when_a_step_would_do_nothing(seed):
    """``quiet`` lets the engine skip a host-level check's step: it must be true only where the
    step would return nothing and change no state, and leave the arrays as long as step does."""
    rng = np.random.default_rng(seed)
    n_ent = 6
    lc, twin = Lifecycle(2.0, 3.0), Lifecycle(2.0, 3.0)
    said_quiet = 0
    for k in range(200):
        ent = np.arange(n_ent, dtype=np.int32)
        cond = ((k // 10) % 3 == 0) & (rng.random(n_ent) < 0.5)
        ts = T0 + k + np.zeros(n_ent)
        before = {key: v.copy() for key, v in lc.to_state().items()}
        if lc.quiet(cond, n_ent):
            said_quiet += 1
            got = twin.step(ts, ent, cond, n_ent)       # what the skipped step would have done
            assert got == []
            for key, v in twin.to_state().items():
                assert np.array_equal(v, before[key], equal_nan=True), key
        else:
            assert lc.step(ts, ent, cond, n_ent) == twin.step(ts, ent, cond, n_ent)
        assert len(lc.since) == len(twin.since) >= n_ent
    assert said_quiet > 20, "the case never went quiet"


@settings(max_examples=fuzz_examples(40), deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([0.0, 1.0, math.nan]), min_size=4, max_size=4).map(np.array),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([(0.0, 0.0), (3.0, 0.0), (2.0, 4.0)]),
)
def test_skipping_quiet_steps_as_the_engine_does_changes_nothing(ticks, hold):
    # The engine steps a check's lifecycle only where its condition holds somewhere or an alert
    # of it is pending or firing (alerts.held); the rest only reserve room. That must leave
    # the same transitions and the same state as stepping every tick.
    from pipeline.engine.alerts import held as _held

    for_s, keep_s = hold
    every, skipping = Lifecycle(for_s, keep_s), Lifecycle(for_s, keep_s)
    ent = np.arange(4, dtype=np.int32)
    for i, cond in enumerate(ticks):
        ts = np.full(4, T0 + i)
        want = every.step(ts, ent, cond == 1, 4)
        held, holds = _held([(None, cond)])
        if not holds[0] and skipping.idle:
            skipping.reserve(4)
            got: list[Transition] = []
        else:
            got = skipping.step(ts, ent, held[0], 4)
        assert got == want
        for k, v in every.to_state().items():
            np.testing.assert_array_equal(skipping.to_state()[k], v, err_msg=k)
