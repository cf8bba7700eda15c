"""The shared numpy helpers (pipeline/numeric.py), and their old names still answer."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import numeric
from pipeline.engine import entities
from pipeline.rules import windows
from tests.factories import fuzz_examples


def test_grow_doubles_and_fills():
    a = np.arange(3.0)
    g = numeric.grow(a, 5, np.nan)
    assert len(g) == 16 and list(g[:3]) == [0, 1, 2] and np.isnan(g[3:]).all()
    assert numeric.grow(g, 10, 0.0) is g
    f = numeric.grow(np.zeros((2, 3)), 40, -1.0, order="F")
    assert f.shape == (40, 3) and f.flags.f_contiguous and (f[2:] == -1).all()


def test_id_bound_and_distinct():
    assert numeric.id_bound(slice(0, 7)) == 7 and numeric.id_bound(np.array([3, 9])) == 10
    assert numeric.id_bound(np.array([], dtype=int)) == 0
    u, once = numeric.distinct(np.array([1, 1, 4]))
    assert list(u) == [1, 4] and not once
    u, once = numeric.distinct(np.array([5, 2]))
    assert list(u) == [2, 5] and once


def test_group_stat():
    keys = np.array([0, 0, 1, 1, 1])
    vals = np.array([1.0, 3.0, 2.0, np.nan, 6.0])
    assert list(numeric.group_stat(keys, vals, "median")) == [2, 2, 4, 4, 4]
    assert list(numeric.group_stat(keys, vals, "count")) == [2, 2, 2, 2, 2]
    assert list(numeric.group_stat(keys, vals, "max")) == [3, 3, 6, 6, 6]


def test_group_median_of_unequal_consecutive_groups_of_an_even_total():
    # 4 rows in 2 consecutive groups of 1 and 3: the shape of an equal-groups tick, not one.
    got = numeric.group_stat(np.array([0, 1, 1, 1]), np.array([1.0, 2.0, 3.0, 10.0]), "median")
    assert list(got) == [1.0, 3.0, 3.0, 3.0]


def _reference(keys, values, stat):
    out = []
    for k in keys:
        v = values[(keys == k) & ~np.isnan(values)]
        fn = {"median": np.median, "mean": np.mean, "min": np.min, "max": np.max}.get(stat)
        out.append(float(len(v)) if stat == "count" else (fn(v) if len(v) else np.nan))
    return np.array(out)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    order=st.sampled_from(["sorted", "shuffled"]),
    data=st.data(),
)
def test_group_stat_equals_a_per_group_reference(sizes, order, data):
    # Hosts report different GPU counts in one tick (a joining host, a lost GPU): every layout
    # of group sizes must give each group's own statistic.
    keys = np.repeat(np.arange(len(sizes)), sizes)
    if order == "shuffled":
        keys = np.array(data.draw(st.permutations(list(keys))))
    values = np.array(data.draw(st.lists(st.sampled_from([*map(float, range(-5, 6)), np.nan]),
                                         min_size=len(keys), max_size=len(keys))))
    for stat in ("median", "mean", "min", "max", "count"):
        np.testing.assert_allclose(numeric.group_stat(keys, values, stat), _reference(keys, values, stat),
                                   equal_nan=True, err_msg=stat)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-3, 3), st.sampled_from([0, 48_573, 1_048_576, 2**40]),
                               st.integers(0, 9)), min_size=1, max_size=30))
def test_combined_keys_meet_exactly_when_every_column_does(rows):
    cols = [np.array(c, dtype=np.int64) for c in zip(*rows)]
    k = numeric.combine(*cols)
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (k[i] == k[j]) == (rows[i] == rows[j])


def test_the_old_homes_re_export_them():
    assert entities.grow is numeric.grow and entities.id_bound is numeric.id_bound
    assert windows.group_stat is numeric.group_stat and windows.distinct is numeric.distinct


def test_numbers_from_text_are_ascii_and_bounded():
    from pipeline.numeric import ascii_float, ascii_int, finite

    assert ascii_int("1024") == 1024 and ascii_int("0") == 0
    # str.isdigit() and int() accept these; a tool never prints them.
    assert [ascii_int(t) for t in ("²", "٣", "", "-1", "1.0", " 1", "9" * 20, None)] == [None] * 8
    assert ascii_int("9" * 5000, max_digits=10_000) is None and ascii_int("9" * 400, max_digits=400) is not None
    assert ascii_float("0e+00") == 0.0 and ascii_float("-3") == -3.0 and ascii_float("1.5") == 1.5
    assert [ascii_float(t) for t in ("nan", "inf", "N/A", "٣", "1" * 400, "9" * 65, b"1")] == [None] * 7
    assert finite(5) == 5.0 and finite("2.5") == 2.5 and finite(1.0) == 1.0
    assert [finite(v) for v in (True, None, [], {}, float("nan"), 10**400, 1e300, "²")] == [None] * 8
