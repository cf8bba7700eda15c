"""Vectorised fast paths against plain references: each shortcut taken on "the usual tick" (every
GPU once, in id order; every host with as many GPUs; nothing missing) must give what a loop per
group or entity gives, on the unusual shapes a fleet also sends: hosts of different GPU counts,
a GPU missing, NaN values, repeated or unsorted keys, empty and one-row batches, negative and
huge values, one GPU at several times in a tick."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import numeric
from pipeline.engine.entities import Entities
from pipeline.engine.frame import DcgmFrame
from pipeline.engine.pending import in_time_order
from pipeline.engine.state import COUNTER_COLS, GpuState, advance
from pipeline.models.deciders import ThresholdDecider
from pipeline.models.detectors._util import last_per_entity, repeats
from pipeline.models.findings import Findings, merge, worst_rows
from pipeline.rules.windows import Baseline, PaneWindow, WindowStore
from tests.factories import fuzz_examples

EXAMPLES = fuzz_examples(100)

# Keys as a tick holds them: few distinct, repeated, sorted or not, sometimes negative or huge.
_KEY = st.one_of(st.integers(0, 6), st.integers(-3, 3), st.sampled_from([0, 2**40, 2**62, -(2**62)]))
_VALUE = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 2.5, np.nan, 1e300, -1e300, 5e-324]),
    st.floats(-1e6, 1e6, allow_nan=False),
)


def _keys(min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[np.ndarray]:
    """Keys in one of the layouts a tick has: grouped runs of unequal sizes (sorted), or any order."""
    runs = st.lists(st.tuples(_KEY, st.integers(1, 4)), min_size=0, max_size=6).map(
        lambda rs: np.repeat(
            np.array(sorted({k for k, _ in rs}), dtype=np.int64), [n for _, n in sorted(dict(rs).items())]
        )
    )
    anyorder = st.lists(_KEY, min_size=min_size, max_size=max_size).map(lambda xs: np.array(xs, dtype=np.int64))
    return st.one_of(runs, anyorder).filter(lambda a: min_size <= len(a) <= max_size)


# -- numeric ----------------------------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(keys=_keys(), first=st.booleans())
def test_groups_is_np_unique(keys, first):
    got = numeric.groups(keys, first=first)
    want = np.unique(keys, return_index=True, return_inverse=True) if first else np.unique(keys, return_inverse=True)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tolist() == w.reshape(-1).tolist()


@settings(max_examples=EXAMPLES, deadline=None)
@given(keys=_keys())
def test_distinct_is_np_unique(keys):
    u, once = numeric.distinct(keys)
    assert u.tolist() == np.unique(keys).tolist()
    assert once == (len(set(keys.tolist())) == len(keys))


def _stat_reference(keys: np.ndarray, values: np.ndarray, stat: str) -> np.ndarray:
    out = []
    for k in keys.tolist():
        v = [x for kk, x in zip(keys.tolist(), values.tolist()) if kk == k and not math.isnan(x)]
        if stat == "count":
            out.append(float(len(v)))
        elif not v:
            out.append(math.nan)
        else:
            out.append(float({"median": np.median, "mean": np.mean, "min": min, "max": max}[stat](v)))
    return np.array(out, dtype=float)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    hosts=st.integers(1, 5),
    gpus=st.integers(1, 8),
    drop=st.lists(st.integers(0, 39), max_size=3),
    nan_at=st.lists(st.integers(0, 39), max_size=2),
    data=st.data(),
)
def test_group_stats_of_a_tick_equal_a_per_host_reference(hosts, gpus, drop, nan_at, data):
    # The usual tick (every host with as many GPUs, consecutive, all known), and the same with a
    # GPU gone or a value unknown: those must leave the equal-groups median path.
    keys = np.repeat(np.arange(hosts, dtype=np.int64), gpus)
    keep = np.ones(len(keys), bool)
    keep[[d % len(keys) for d in drop]] = False
    keys = keys[keep] if keep.any() else keys
    # Huge values of one sign only: +1e300 and -1e300 in one group cancel differently in any two
    # summation orders, which says nothing of the fast paths.
    value = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 2.5, 1e300, 1e15, 5e-324]), st.floats(-1e6, 1e6))
    values = np.array(data.draw(st.lists(value, min_size=len(keys), max_size=len(keys))))
    values[[i % len(keys) for i in nan_at]] = np.nan
    stats = ("median", "mean", "min", "max", "count")
    for grouped in (None, numeric.groups(keys)):
        for stat, got in zip(stats, numeric.group_stats(keys, values, stats, grouped)):
            np.testing.assert_allclose(
                got, _stat_reference(keys, values, stat), rtol=1e-12, equal_nan=True, err_msg=stat
            )


def test_group_stats_of_no_rows_and_of_one():
    assert [len(a) for a in numeric.group_stats(np.empty(0, np.int64), np.empty(0), ("median", "count"))] == [0, 0]
    assert [a.tolist() for a in numeric.group_stats(np.array([5]), np.array([-2.0]), ("median", "count"))] == [
        [-2.0],
        [1.0],
    ]


# -- models: per-entity helpers -----------------------------------------------------------------


def _worst_reference(ent: np.ndarray, score: np.ndarray) -> list[int]:
    best: dict[int, int] = {}
    for i, e in enumerate(ent.tolist()):
        if e not in best or score[i] >= score[best[e]]:
            best[e] = i
    return [best[e] for e in sorted(best)]


@settings(max_examples=EXAMPLES, deadline=None)
@given(ent=_keys(), data=st.data())
def test_worst_rows_equal_a_per_entity_reference(ent, data):
    score = np.array(
        data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, -1.0, 1e9]), min_size=len(ent), max_size=len(ent)))
    )
    assert worst_rows(ent, score).tolist() == _worst_reference(ent, score)


@settings(max_examples=EXAMPLES, deadline=None)
@given(ent=_keys())
def test_last_per_entity_and_repeats_equal_references(ent):
    last = {e: i for i, e in enumerate(ent.tolist())}
    assert sorted(last_per_entity(ent).tolist()) == sorted(last.values())
    prev, seen, place = [], {}, []
    for i, e in enumerate(ent.tolist()):
        prev.append(seen.get(e, (-1, -1))[0])
        place.append(seen.get(e, (-1, -1))[1] + 1)
        seen[e] = (i, place[-1])
    rep = repeats(ent)
    if len(set(ent.tolist())) == len(ent):
        assert rep is None
    else:
        assert rep is not None
        assert rep[0].tolist() == prev
        assert [r.tolist() for r in rep[1]] == [
            [i for i, p in enumerate(place) if p == k] for k in range(max(place) + 1)
        ]


@settings(max_examples=EXAMPLES, deadline=None)
@given(ent=_keys(), on=st.sampled_from([1.0, 3.0]), data=st.data())
def test_threshold_decider_equals_a_row_by_row_reference(ent, on, data):
    ent = np.abs(ent) % 7
    rounds = data.draw(
        st.lists(
            st.lists(st.sampled_from([0.0, 0.7, 1.0, 2.0, 5.0]), min_size=len(ent), max_size=len(ent)),
            min_size=1,
            max_size=3,
        )
    )
    d = ThresholdDecider(on)
    up = [False] * 7
    for scores in rounds:
        want = []
        for e, s in zip(ent.tolist(), scores):
            up[e] = s >= (d.off if up[e] else d.on)
            want.append(up[e])
        assert d.decide(ent, np.array(scores), 7).tolist() == want


def _findings(lane: int, ents: list[int], scores: list[float], flags: list[bool], warm: bool) -> Findings:
    ev = {j: {"lane": lane, "row": j} for j, f in enumerate(flags) if f}
    n = len(ents)
    return Findings(
        "m",
        0.0,
        np.array(ents, np.int64),
        np.array(scores),
        np.array(flags, bool),
        np.full(n, float(lane)),
        ev,
        warm,
        lane=lane,
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    lanes=st.lists(
        st.tuples(
            st.lists(
                st.tuples(st.integers(0, 5), st.sampled_from([0.0, 1.0, 3.0]), st.booleans()),
                max_size=5,
                unique_by=lambda x: x[0],
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=4,
    ),
    data=st.data(),
)
def test_merge_equals_a_per_entity_reference_in_any_order(lanes, data):
    found = []
    for lane, (rows, warm) in enumerate(lanes):
        rows = sorted(rows)
        found.append(_findings(lane, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], warm))
    shuffled = data.draw(st.permutations(found))
    got = merge(shuffled)
    any_warm = any(f.warm for f in found)
    use = [f for f in found if f.warm or not any_warm]
    best: dict[int, tuple] = {}
    for f in use:
        for j, e in enumerate(f.ent.tolist()):
            k = (bool(f.flagged[j]), float(f.score[j]), -f.lane)
            if e not in best or k > best[e][0]:
                best[e] = (k, f, j)
    assert got.warm == any_warm
    assert got.ent.tolist() == sorted(best)
    assert got.score.tolist() == [float(best[e][1].score[best[e][2]]) for e in sorted(best)]
    assert got.flagged.tolist() == [bool(best[e][1].flagged[best[e][2]]) for e in sorted(best)]
    assert got.obs_ts.tolist() == [float(best[e][1].lane) for e in sorted(best)]
    want_ev = {
        i: best[e][1].evidence[best[e][2]] for i, e in enumerate(sorted(best)) if best[e][2] in best[e][1].evidence
    }
    assert got.evidence == want_ev


# -- engine: the tick's view --------------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    ts=st.lists(st.sampled_from([1.0, 2.0, 2.0, 3.0, -0.0, 0.0, np.nan, 1e300]), max_size=8),
    data=st.data(),
)
def test_in_time_order_is_what_a_stable_lexsort_leaves(ts, data):
    gpu = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(ts), max_size=len(ts))), np.int32)
    ts = np.array(ts)
    if np.isnan(ts).any():
        return  # NaN rows never reach the buffer (the decoder dead-letters them)
    order = np.lexsort((gpu, ts))
    assert in_time_order(ts, gpu) == (order.tolist() == list(range(len(ts))))


def _fleet(gpus_per_host: list[int]) -> Entities:
    ents = Entities()
    for h, k in enumerate(gpus_per_host):
        for i in range(k):
            ents.gpu(f"h{h}", i)
    return ents


_COLS = np.array(sorted({int(COUNTER_COLS[0]), int(COUNTER_COLS[1]), 0, 1}), dtype=np.intp)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    per_host=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    ticks=st.lists(
        st.tuples(st.sampled_from(["all", "some", "repeats"]), st.lists(st.integers(0, 20), max_size=12)),
        min_size=1,
        max_size=3,
    ),
    data=st.data(),
)
def test_advance_equals_a_row_by_row_reference(per_host, ticks, data):
    # Every GPU once in id order (the views-not-gathers path), one missing, or a GPU at several
    # times in the tick: the same filled/prev/increase as folding the rows one by one.
    ents = _fleet(per_host)
    n_gpus, k = ents.n_gpus, len(_COLS)
    state = GpuState()
    last = np.full((n_gpus, k), np.nan)
    seen = np.full((n_gpus, k), np.nan)
    is_counter = np.isin(_COLS, COUNTER_COLS)
    t = 100.0
    for shape, picks in ticks:
        if shape == "all":
            gpu = np.arange(n_gpus)
        elif shape == "some":
            gpu = np.unique(np.array(picks, dtype=np.int64) % n_gpus) if picks else np.arange(0)
        else:
            gpu = np.sort(np.array(picks, dtype=np.int64) % n_gpus)
        n = len(gpu)
        vals = np.array(
            data.draw(st.lists(st.sampled_from([0.0, 1.0, 5.0, 3.0, np.nan, 1e15]), min_size=n * k, max_size=n * k))
        ).reshape(n, k)
        ts = t + np.arange(n) * 0.01
        frame = DcgmFrame(ts, gpu.astype(np.int32), ents.gpu_host[gpu].astype(np.int32), vals.copy())
        view = advance(state, frame, ents, t, _COLS)
        for i in range(n):
            g = gpu[i]
            prev = last[g].copy()
            have = ~np.isnan(vals[i])
            last[g] = np.where(have, vals[i], last[g])
            seen[g] = np.where(have, ts[i], seen[g])
            for j, c in enumerate(_COLS.tolist()):
                assert np.array_equal(view.filled[i, c], last[g, j], equal_nan=True), ("filled", i, c)
                assert np.array_equal(view.prev[i, c], prev[j], equal_nan=True), ("prev", i, c)
                assert np.array_equal(view.seen[i, c], seen[g, j], equal_nan=True), ("seen", i, c)
                if is_counter[j]:
                    inc = vals[i, j] - prev[j]
                    want = 0.0 if inc < 0 else inc
                    got = view.increase[i, int(np.searchsorted(COUNTER_COLS, c))]
                    assert np.array_equal(got, want, equal_nan=True), ("inc", i, c)
        t += 1.0


# -- rules: windows and baselines ---------------------------------------------------------------

# Values whose sums are exact in any order (a window adds its newest pane last: in the last bit,
# not in what the fast paths decide, a sum of arbitrary floats may differ from a loop's).
_EXACT = st.one_of(st.integers(-1000, 1000).map(float), st.sampled_from([2.0**40, -(2.0**40), 0.5, -0.0, np.nan]))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    chunks=st.lists(
        st.tuples(st.integers(-1, 3), st.lists(st.tuples(st.integers(0, 5), _EXACT), max_size=8)),
        min_size=1,
        max_size=6,
    ),
    as_slice=st.booleans(),
)
def test_pane_window_equals_a_reference_over_kept_samples(chunks, as_slice):
    # One row per GPU (fancy indexing), a GPU at several times in the tick (ufunc.at), every
    # GPU once as a slice, NaN rows, a late chunk: each window aggregate as a loop over samples.
    n_ent, tick = 6, 1.0
    w = PaneWindow(3.0, tick, ("count", "first", "max", "min", "sum"))
    kept: list[tuple[int, int, float]] = []  # (pane, entity, value) in arrival order
    p = 10
    for step, rows in chunks:
        p = max(0, p + step)
        rows = sorted(rows, key=lambda r: r[0])  # a chunk comes grouped by GPU, in time order
        ent = np.array([e for e, _ in rows], dtype=np.int64)
        vals = np.array([v for _, v in rows], dtype=float)
        ids = ent
        if as_slice:
            ent, vals = np.arange(n_ent), np.array([dict(rows).get(e, np.nan) for e in range(n_ent)])
            ids = slice(0, n_ent)
        ts0 = p * tick
        cur = w.cur if w.cur is not None else p
        if p > max(cur, p) - w.n:
            kept += [(p, int(e), float(v)) for e, v in zip(ent.tolist(), vals.tolist()) if not math.isnan(v)]
        w.update(ids, ts0, vals, n_ent)
        now = w.cur
        live = [(q, e, v) for q, e, v in kept if now - w.n < q <= now]
        for agg in ("sum", "avg", "min", "max", "first"):
            got = w.query(agg, np.arange(n_ent), now * tick)
            want = []
            for e in range(n_ent):
                mine = [(q, v) for q, ee, v in live if ee == e]
                if not mine:
                    want.append(np.nan)
                elif agg == "first":
                    want.append(min(mine, key=lambda qv: qv[0])[1])
                else:
                    xs = [v for _, v in mine]
                    want.append({"sum": sum, "avg": lambda x: sum(x) / len(x), "min": min, "max": max}[agg](xs))
            np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True, err_msg=agg)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    ticks=st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.sampled_from([1.0, 2.0, 50.0, np.nan, -3.0])), max_size=7),
        min_size=1,
        max_size=14,
    ),
)
def test_baselines_of_a_tick_equal_each_baseline_alone(ticks):
    # update_baselines folds every baseline in one pass when each GPU has one row; a GPU at
    # several times, or one gone, must fold the same as Baseline.update of each alone.
    from types import SimpleNamespace

    store = WindowStore(1.0)
    keys = [store.baseline(0, 10.0), store.baseline(1, 30.0)]
    alone = {k: Baseline(k[2]) for k in keys}
    t = 0.0
    for rows in ticks:
        rows = sorted(rows, key=lambda r: r[0])
        gpu = np.array([g for g, _ in rows], dtype=np.int32)
        vals = np.full((len(rows), 2), np.nan)
        vals[:, 0] = [v for _, v in rows]
        vals[:, 1] = [v * 2 for _, v in rows]
        ts = t + np.arange(len(rows)) * 0.1
        whole = len(gpu) == 5 and gpu.tolist() == list(range(5))
        view = SimpleNamespace(frame=SimpleNamespace(gpu=gpu, ts=ts, values=vals), ids=slice(0, 5) if whole else gpu)
        store.update_baselines(view, 5)
        for j, k in enumerate(keys):
            alone[k].update(gpu, ts, vals[:, j], 5)
            for a in ("mean", "var", "n", "last_ts", "out_since"):
                np.testing.assert_array_equal(getattr(store.baselines[k], a)[:5], getattr(alone[k], a)[:5], err_msg=a)
        t += 1.0


# -- models: Half-Space trees -------------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    n_trees=st.integers(1, 3),
    height=st.integers(1, 6),
    window=st.sampled_from([4, 250, 1 << 20, (1 << 31) - 1]),
    learnt=st.lists(
        st.tuples(st.sampled_from([0.3, 0.31, 0.9, 0.0, 1.0, np.nan]), st.sampled_from([0.3, 0.7, -1e300])),
        min_size=1,
        max_size=6,
    ),
    n=st.sampled_from([0, 1, 8, 9, 20]),  # SMALL (8) rows and fewer walk in Python, more in numpy
    data=st.data(),
)
def test_half_space_scores_of_many_rows_equal_the_walk_of_each(n_trees, height, window, learnt, n, data):
    # More than SMALL rows are scored level by level in numpy, fewer (and score_paths) by the
    # walk's integer sums: one answer, also for a window of millions of rows gathered in one leaf
    # (a fleet whose telemetry holds still), where mass x 2**depth passes an int32.
    from pipeline.models.detectors.halfspace import HalfSpaceForest

    f = HalfSpaceForest(2, n_trees=n_trees, height=height, window_size=window, seed=7)
    L = np.array(learnt, dtype=float)
    k = -(-window // len(L))  # the learnt rows, each k times: a full window
    f.add_window(f.masses(L) * k, len(L) * k)
    cell = st.tuples(
        st.sampled_from([0.3, 0.31, 0.9, 0.0, 1.0, np.nan, 1e300]), st.sampled_from([0.3, 0.7, -1e300, np.nan])
    )
    X = np.array(data.draw(st.lists(cell, min_size=n, max_size=n)), dtype=float).reshape(-1, 2)
    walk = np.array([f._score_rows([x])[0] for x in X.tolist()]) if len(X) else np.empty(0)
    assert f.score(X).tolist() == walk.tolist()
    assert f.score_paths(f.paths(X)).tolist() == walk.tolist()
    one_by_one = [f.paths(X[i : i + 1])[0] for i in range(len(X))]
    assert f.paths(X).tolist() == [p.tolist() for p in one_by_one]
    assert f.path_masses(f.paths(X)).tolist() == f.masses(X).tolist()


# -- models: the fleet context ------------------------------------------------------------------


def _context_view(
    gpu: list[int], host: list[int], ts: list[float], reasons: list[float], lim: list[float], clock: list[float]
):
    from types import SimpleNamespace

    from pipeline.engine.state import N_FIELDS
    from pipeline.models.context import _CLOCK, _LIMIT, _REASONS

    n = len(gpu)
    filled = np.full((n, N_FIELDS), np.nan)
    filled[:, _REASONS], filled[:, _LIMIT], filled[:, _CLOCK] = reasons, lim, clock
    frame = DcgmFrame(np.array(ts, float), np.array(gpu, np.int32), np.array(host, np.int32), np.empty((n, 0)))
    return SimpleNamespace(frame=frame, filled=filled)


def _gpu_ticks(*cols):
    """Up to 3 ticks of up to 8 rows (GPU 0-3, then one value of each of ``cols``)."""
    return st.lists(st.lists(st.tuples(st.integers(0, 3), *cols), max_size=8), min_size=1, max_size=3)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    ticks=_gpu_ticks(
        st.sampled_from([0.0, 4.0, np.nan]),  # SW_POWER_CAP is bit 2 (4)
        st.sampled_from([700.0, 600.0, 400.0, np.nan]),
        st.sampled_from([1980.0, 1500.0, np.nan]),
    ),
    board=st.sampled_from([700.0, np.nan]),
)
def test_fleet_context_of_a_tick_equals_its_rows_one_at_a_time(ticks, board):
    # A GPU at several times in one tick (sampled faster than the tick): each row sees the
    # power limit the rows before it raised and leaves its own cap time, as row by row.
    from pipeline.models.context import FleetContext

    whole, by_row = FleetContext(), FleetContext()
    t = 1000.0
    for rows in ticks:
        rows = sorted(rows, key=lambda r: r[0])  # by GPU, in time order (the engine's chunk)
        ts = [t + 0.1 * i for i in range(len(rows))]
        cols = (
            [r[0] for r in rows],
            [r[0] // 2 for r in rows],
            ts,
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
        )
        whole.update(_context_view(*cols), 4, np.full(len(rows), board), t + 1.0)
        by_row.update(_context_view(*[c[:0] for c in cols]), 4, np.full(0, board), t + 1.0)
        for i in range(len(rows)):
            by_row.update(_context_view(*[c[i : i + 1] for c in cols]), 4, np.full(1, board), t + 1.0)
        for a in ("seen", "cap_ts", "lim_max", "clock", "host"):
            np.testing.assert_array_equal(getattr(whole, a)[:4], getattr(by_row, a)[:4], err_msg=a)
        assert np.array_equal(whole.now, by_row.now, equal_nan=True)
        t += 1.0


# -- models: NCCL communicators ---------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    comms=st.lists(
        st.lists(
            st.tuples(st.sampled_from([0.1, 0.2, 0.4]), st.sampled_from([10.0, 12.0, 20.0, 5.0])),
            min_size=1,
            max_size=3,
        ),
        min_size=3,
        max_size=5,
    ),
    mask_all=st.booleans(),
)
def test_comm_busbw_learns_each_judged_interval_as_row_by_row(comms, mask_all):
    # One-rank communicators on their own hosts, each judged at one or several intervals of a
    # tick (a collective more often than the tick): each judged row moves its communicator's own
    # ratio in turn, as learning one row at a time does.
    from pipeline.engine.frame import NcclFrame
    from pipeline.models.detectors.nccl import CommBusbw

    ts, comm, bw = [], [], []
    for i, rows in enumerate(comms):
        for t, b in dict(rows).items():  # one record per (communicator, interval)
            ts.append(1000.0 + t)
            comm.append(f"c{i}")
            bw.append(b)
    n = len(ts)
    frame = NcclFrame(
        ts=np.array(ts),
        host=np.array([int(c[1:]) for c in comm], np.int32),
        gpu=np.array([int(c[1:]) for c in comm], np.int32),
        comm=comm,
        rank=np.zeros(n, np.int32),
        nranks=np.ones(n, np.int32),
        bytes=np.full(n, 1 << 20, dtype=float),
        exec_time_us=np.full(n, 100.0),
        busbw_gbs=np.array(bw),
    )
    whole, by_row = CommBusbw(min_peers=2), CommBusbw(min_peers=2)
    for _ in range(2):  # twice: the second tick starts from what the first learnt
        # (Scores differ from the second tick on: the noise learns per call. The ratios learnt do not.)
        s = whole.score_frame(frame)
        by_row.score_frame(frame)
        assert np.array_equal(whole.last["ratio"], by_row.last["ratio"], equal_nan=True)
        mask = np.ones(n, bool) if mask_all else np.arange(n) % 2 == 0
        whole.learn_frame(frame, s, mask)
        for i in np.flatnonzero(mask).tolist():
            one = np.zeros(n, bool)
            one[i] = True
            by_row.learn_frame(frame, s, one)
        for a in ("own_m", "own_w", "own_t"):
            np.testing.assert_allclose(getattr(whole, a), getattr(by_row, a), rtol=1e-12, equal_nan=True, err_msg=a)
        frame = NcclFrame(**{**frame.__dict__, "ts": frame.ts + 60.0})


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    ticks=_gpu_ticks(
        st.sampled_from([400.0, 700.0, 300.0, np.nan]),
        st.sampled_from([62.0, 70.0, np.nan]),
        st.sampled_from([0.0, 0.25, 0.5]),  # (a row's time is never NaN: the decoder refuses it)
    ),
)
def test_thermal_lags_of_a_tick_equal_its_rows_one_at_a_time(ticks):
    # A GPU at several times in one tick: each row's power lags from the row before it (its
    # score and the lags kept after it), as scoring the rows one call each does. Nothing learnt
    # here (every row flagged): learning stays one sample per GPU and tick.
    from pipeline.models.detectors.thermal import ThermalResidual

    whole, by_row = ThermalResidual(), ThermalResidual()
    t = 1000.0
    for rows in ticks:
        rows = sorted(rows, key=lambda r: (r[0], r[3]))  # by GPU, in time order (the engine's chunk)
        if not rows:
            continue
        ent = np.array([r[0] for r in rows])
        ts = np.array([t + r[3] for r in rows])
        feats = {
            "power": np.array([r[1] for r in rows]),
            "gpu_temp": np.array([r[2] for r in rows]),
            "hostmean:power": np.array([500.0 + 10 * r[0] for r in rows]),
            "hostmean:gpu_temp": np.full(len(rows), 60.0),
        }
        got = whole.score_many(ent, ts, feats)
        whole.learn_many(ent, ts, feats, np.zeros(len(rows), bool))
        want = []
        for i in range(len(rows)):
            one = {k: v[i : i + 1] for k, v in feats.items()}
            want.append(float(by_row.score_many(ent[i : i + 1], ts[i : i + 1], one)[0]))
            by_row.learn_many(ent[i : i + 1], ts[i : i + 1], one, np.zeros(1, bool))
        np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
        for a in ("p_lag", "hp_lag", "last_ts"):
            np.testing.assert_allclose(
                getattr(whole, a)[:4], getattr(by_row, a)[:4], rtol=1e-12, equal_nan=True, err_msg=a
            )
        t += 1.0
