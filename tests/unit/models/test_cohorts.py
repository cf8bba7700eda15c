"""The cohort parts' arithmetic against plain references (pipeline/models/cohorts.py): any split
of the rows gives the same sums and medians, and the exchanges hand out what the shards published."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.models.cohorts import (
    FIXED,
    LAG_EPOCHS,
    LocalExchange,
    SharedExchange,
    add,
    epoch_of,
    fixed,
    weighted_median,
)
from pipeline.models.detectors.halfspace import HalfSpaceForest

finite = st.floats(min_value=-1e5, max_value=1e5, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=0, max_size=60), st.lists(st.integers(0, 3), min_size=60, max_size=60))
def test_fixed_sums_are_the_same_for_any_split(rows, where):
    x = np.array(rows, dtype=float).reshape(-1, 2)
    whole = fixed(x)
    parts = [fixed(x[[i for i in range(len(x)) if where[i] == s]]) for s in range(4)]
    assert add(parts, 2) == whole
    # And each sum is the rows' sum to within the rounding of each row.
    for c in range(2):
        assert abs(whole[c] / FIXED - x[:, c].sum()) <= len(x) * 0.5 / FIXED + 1e-9 * max(1.0, abs(x[:, c]).sum())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50), st.lists(st.integers(0, 2), min_size=50, max_size=50))
def test_weighted_median_is_numpys_median_of_the_multiset(values, where):
    v = np.array(values)
    shards = []
    for s in range(3):
        mine = v[[i for i in range(len(v)) if where[i] == s]]
        u, c = np.unique(mine, return_counts=True)
        shards.append((u, c))
    got = weighted_median([u for u, _ in shards], [c for _, c in shards])
    assert got == float(np.median(v))


def test_weighted_median_of_nothing_is_nan():
    assert math.isnan(weighted_median([], []))


def test_forest_masses_add_up_across_shards_and_fill_a_window():
    """Masses counted in parts and added equal the masses of all rows learnt at once."""
    rng = np.random.default_rng(1)
    X = rng.random((300, 5))
    f = HalfSpaceForest(5, n_trees=3, height=4, window_size=1000, seed=3)
    whole = f.masses(X)
    split = f.masses(X[:100]) + f.masses(X[100:250]) + f.masses(X[250:])
    assert np.array_equal(whole, split)
    ref = HalfSpaceForest(5, n_trees=3, height=4, window_size=1000, seed=3)
    ref.learn(X)
    assert np.array_equal(ref.l_mass, whole.astype(np.int32))
    # A window the epoch fills past its size becomes the reference, scaled to window_size rows.
    g = HalfSpaceForest(5, n_trees=3, height=4, window_size=200, seed=3)
    g.add_window(whole, len(X))
    assert not g.first_window and g.counter == 0 and int(g.r_mass[0, 0]) == 200


def test_shared_exchange_waits_for_every_shard():
    ex = SharedExchange(["a", "b"])
    ex.publish("a", {"epoch": 10, "until": 10})
    assert ex.bound() is None and ex.parts(10) is None
    ex.publish("b", {"epoch": 12, "until": 12})  # b opened later: nothing of its own before 12
    ex.publish("a", {"epoch": 10, "until": 13})
    assert [p["epoch"] for p in ex.parts(11)] == [10, 11]
    assert ex.parts(12) is None  # b has not closed 12 yet
    assert ex.bound() == 12 + LAG_EPOCHS
    ex.forget("a", 11)
    assert len(ex.published["a"]) == 2  # b has not applied anything yet
    ex.forget("b", 11)
    assert [p["until"] for p in ex.published["a"]] == [13]  # the opening part ended before 11


def test_local_exchange_forgets_what_was_applied():
    ex = LocalExchange()
    ex.publish("", {"epoch": 3, "until": 3})
    ex.publish("", {"epoch": 3, "until": 4})
    ex.publish("", {"epoch": 4, "until": 9})
    assert ex.parts(2) == [] and ex.parts(9) is None
    ex.forget("", 4)
    assert ex.first() == 4 and [p["until"] for p in ex.parts(7)] == [9]


@pytest.mark.parametrize(("t", "epoch"), [(0.0, 0), (4.999, 0), (5.0, 1), (1764403200.0, 352880640)])
def test_epochs_are_whole_spans_of_event_time(t, epoch):
    assert epoch_of(t) == epoch
