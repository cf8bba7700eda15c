"""PaneWindow against a brute-force reference: every aggregate, gaps, repeats, NaN, jumps, restore;
WindowStore leaving alone the windows no row of a tick feeds, against folding every one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.rules import load_rules
from pipeline.rules.windows import PaneWindow, WindowStore
from tests.factories import T0
from tests.unit.rules.factories import fields_in_spells, run_rules

RULES = Path(__file__).resolve().parents[3] / "rules"

AGGS = ("count", "first", "max", "min", "sum")


def reference(samples: list[tuple[int, int, float]], n: int, p: int, agg: str, ent: int) -> float:
    """``agg`` of entity ``ent`` over panes ``(p - n, p]`` from the raw (pane, entity, value) list."""
    vals = [(q, v) for q, e, v in samples if e == ent and p - n < q <= p and not math.isnan(v)]
    if not vals:
        return math.nan
    xs = [v for _, v in vals]
    if agg == "sum":
        return sum(xs)
    if agg == "avg":
        return sum(xs) / len(xs)
    if agg == "min":
        return min(xs)
    if agg == "max":
        return max(xs)
    oldest = min(q for q, _ in vals)
    return next(v for q, v in vals if q == oldest)   # "first": first value of the oldest pane


def _chunks(seed: int, n_ent: int, ticks: int):
    """Per tick: sorted entity rows (some missing, some repeated), values with NaN; time jumps."""
    rng = np.random.default_rng(seed)
    t = T0
    for _ in range(ticks):
        t += float(rng.choice([1, 1, 1, 2, 7, 40]))   # mostly one tick, sometimes a gap past the window
        ent = np.sort(rng.choice(n_ent, size=int(rng.integers(0, 2 * n_ent)), replace=True)).astype(np.int32)
        vals = rng.normal(50, 20, len(ent)).round(1)
        vals[rng.random(len(ent)) < 0.1] = np.nan
        yield t, ent, vals


@pytest.mark.parametrize("seed", range(6))
def test_pane_window_matches_brute_force(seed):
    n_ent, tick = 9, 1.0
    w = PaneWindow(24.0, tick, ("count", "first", "max", "min", "sum"))
    samples: list[tuple[int, int, float]] = []
    for i, (t, ent, vals) in enumerate(_chunks(seed, n_ent, 120)):
        if i == 60:   # a restore mid-stream continues with the same values
            st = w.to_state()
            w = PaneWindow(24.0, tick, ("count", "first", "max", "min", "sum"))
            w.load_state(st)
        w.update(ent, t, vals, n_ent)
        p = math.floor(t / w.pw)
        samples += [(p, int(e), float(v)) for e, v in zip(ent, vals)]
        ask = np.arange(n_ent, dtype=np.int32)
        for agg in ("sum", "avg", "min", "max", "first"):
            got = w.query(agg, ask, t)
            want = np.array([reference(samples, w.n, p, agg, e) for e in range(n_ent)])
            np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True, err_msg=f"{agg} at tick {i}")


@pytest.mark.parametrize("seed", range(6))
def test_late_chunks_into_older_panes_between_queries(seed):
    # Queries of the newest pane keep the older panes' part until the ring moves; a chunk
    # arriving late, into one of those panes, must be seen by the next query all the same.
    n_ent, rng = 7, np.random.default_rng(100 + seed)
    w = PaneWindow(24.0, 1.0, AGGS)
    samples: list[tuple[int, int, float]] = []
    t = T0
    for i in range(150):
        late = i > 5 and rng.random() < 0.3
        at = t - float(rng.integers(1, 20)) if late else (t := t + float(rng.choice([1, 1, 2, 3, 30])))
        ent = np.sort(rng.choice(n_ent, size=int(rng.integers(1, n_ent + 1)), replace=False)).astype(np.int32)
        vals = rng.normal(50, 20, len(ent)).round(1)
        vals[rng.random(len(ent)) < 0.1] = np.nan
        w.update(ent, at, vals, n_ent)
        q = math.floor(at / w.pw)
        if q > w.cur - w.n:   # what the window keeps (older than the whole window: dropped)
            samples += [(q, int(e), float(v)) for e, v in zip(ent, vals)]
        p = math.floor(t / w.pw)
        for agg in ("sum", "avg", "min", "max", "first"):
            got = w.query(agg, np.arange(n_ent, dtype=np.int32), t)
            want = np.array([reference(samples, w.n, p, agg, e) for e in range(n_ent)])
            np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True, err_msg=f"{agg} at step {i}")


@pytest.mark.parametrize("seed", range(4))
def test_whole_fleet_ids_as_a_slice_fold_and_read_like_the_id_array(seed):
    # A tick of every entity once, in id order, passes ``slice(0, n)`` (View.ids): views and
    # block stores instead of gathers and scatters, with the same windows and answers.
    n_ent, rng = 12, np.random.default_rng(seed)
    by_slice, by_ids = (PaneWindow(24.0, 1.0, AGGS) for _ in range(2))
    ids = np.arange(n_ent, dtype=np.int32)
    t = T0
    for i in range(80):
        t += float(rng.choice([1, 1, 1, 5, 30]))
        vals = rng.normal(50, 20, n_ent).round(1)
        if i % 3 == 0:
            vals[rng.random(n_ent) < 0.3] = np.nan    # some GPUs' field not reported
        by_slice.update(slice(0, n_ent), t, vals, n_ent)
        by_ids.update(ids, t, vals, n_ent)
        for agg in ("sum", "avg", "min", "max", "first"):
            np.testing.assert_array_equal(by_slice.query(agg, slice(0, n_ent), t), by_ids.query(agg, ids, t),
                                          err_msg=f"{agg} at tick {i}")
        for a in AGGS:
            np.testing.assert_array_equal(by_slice.data[a], by_ids.data[a], err_msg=a)


def test_query_of_an_earlier_pane_sees_only_that_window():
    w = PaneWindow(12.0, 1.0, ("count", "sum"))
    for k in range(30):
        w.update(np.array([0]), T0 + k, np.array([1.0]), 1)
    now = w.query("sum", np.array([0]), T0 + 29)
    before = w.query("sum", np.array([0]), T0 + 20)
    assert now[0] == 12.0
    assert before[0] == 3.0       # panes 18..20 are the only ones of that window still held
    assert math.isnan(w.query("sum", np.array([0]), T0)[0])   # long gone


def test_min_max_and_first_of_a_long_gone_pane_are_unknown():
    # No slot of the ring holds a pane of that window any more: nothing to reduce.
    w = PaneWindow(12.0, 1.0, ("first", "max", "min"))
    for k in range(30):
        w.update(np.array([0]), T0 + k, np.array([float(k)]), 1)
    for agg in ("min", "max", "first"):
        assert math.isnan(w.query(agg, np.array([0]), T0)[0]), agg
    assert w.query("min", np.array([0]), T0 + 29)[0] == 18.0


def test_restore_from_a_snapshot_with_per_entity_pane_ids():
    """Snapshots written before the ring was shared hold a pane id per entity and slot."""
    w = PaneWindow(12.0, 1.0, ("count", "sum"))
    p = int(T0)
    pane_id = np.full((2, 12), -1, dtype=np.int64)
    d_sum, d_count = np.zeros((2, 12)), np.zeros((2, 12))
    for q in range(p - 11, p + 1):            # entity 0: a sample of 1.0 in every pane
        pane_id[0, q % 12], d_sum[0, q % 12], d_count[0, q % 12] = q, 1.0, 1.0
    pane_id[1, (p - 30) % 12], d_sum[1, (p - 30) % 12], d_count[1, (p - 30) % 12] = p - 30, 5.0, 1.0  # expired
    w.load_state({"pane_id": pane_id, "d_sum": d_sum, "d_count": d_count})
    got = w.query("sum", np.array([0, 1]), float(p))
    assert got[0] == 12.0 and math.isnan(got[1])


def test_baselines_updated_together_equal_each_updated_alone():
    from pipeline.rules.windows import Baseline

    rng = np.random.default_rng(11)
    n_ent, taus = 40, (30.0, 60.0, 1800.0)
    alone = [Baseline(t, warmup=5) for t in taus]
    together = [Baseline(t, warmup=5) for t in taus]
    by_slice = [Baseline(t, warmup=5) for t in taus]
    ent = np.arange(n_ent, dtype=np.int32)
    for k in range(400):
        x = rng.normal(60, 2, (n_ent, len(taus)))
        x[rng.random(x.shape) < 0.15] = np.nan                 # not reported
        x[rng.random(x.shape) < 0.02] += 40                    # bursts (outliers)
        if k > 200:
            x[:5] += 25                                        # a new regime for a few entities
        ts = np.full(n_ent, T0 + k)
        for j, b in enumerate(alone):
            b.update(ent, ts, x[:, j], n_ent)
        Baseline.update_many(together, ent, ts, x, n_ent)
        Baseline.update_many(by_slice, slice(0, n_ent), ts, x, n_ent)   # View.ids of a whole-fleet tick
    for a, b, c in zip(alone, together, by_slice):
        np.testing.assert_array_equal(b.query(ent), c.query(slice(0, n_ent)))
        for name in ("mean", "var", "n", "last_ts", "out_since"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
            np.testing.assert_array_equal(getattr(b, name), getattr(c, name), err_msg=name)
        assert np.isfinite(a.query(ent)).sum() > n_ent // 2


@pytest.mark.parametrize("layout", ["equal_contiguous", "equal_interleaved", "unequal", "with_nan"])
def test_peer_median_fast_path_equals_the_general_one(layout):
    from pipeline.rules.windows import group_stat

    rng = np.random.default_rng(5)
    hosts = np.repeat(np.arange(50), 8)
    if layout == "equal_interleaved":
        hosts = np.tile(np.arange(50), 8)
    if layout == "unequal":
        hosts = np.sort(rng.integers(0, 50, 400))
    values = rng.normal(100, 10, len(hosts)).round(2)
    if layout == "with_nan":
        values[rng.random(len(values)) < 0.1] = np.nan
    got = group_stat(hosts, values, "median")
    want = np.array([np.nanmedian(values[hosts == h]) if np.isfinite(values[hosts == h]).any() else np.nan
                     for h in hosts])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(2))
def test_windows_of_fields_no_row_has_are_left_alone_with_the_same_alerts(seed, monkeypatch):
    # WindowStore.update skips a window whose column no row of the tick has; folding every
    # window every tick (the reference) must give the same alerts and the same answers.
    records = fields_in_spells(seed, 1800)

    def run():
        rs, diags = load_rules([RULES])
        assert rs is not None, diags
        alerts, _ = run_rules(rs, records, batch=97)
        answers = {k: [w.query(a, np.arange(6, dtype=np.int32), records[-1].ts).tolist() for a in ("sum", "first")
                       if a in w.aggs] for k, w in rs.windows.panes.items()}
        return alerts, answers

    skipped = run()
    monkeypatch.setattr(WindowStore, "_held", lambda self, view: np.ones(len(self.panes), dtype=bool))
    every = run()
    assert {a.rule for a in skipped[0]} & {"pcie_aer_fatal", "pcie_replay_rate"}, "the case tests nothing"
    assert skipped[0] == every[0]
    np.testing.assert_equal(skipped[1], every[1])
