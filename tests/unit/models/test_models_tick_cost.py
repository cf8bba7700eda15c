"""The models' per-tick fast paths give what the plain computation gives, to the last bit.

Each sampled tick scores a few dozen rows, so the models spare numpy calls there: grouping
without ``np.unique``'s wrappers, the statistics of one grouping together, the NCCL lanes' worst
records and merges without sorts or Python loops where a tick needs none, and one walk of the
Half-Space trees for a row's score and its masses. Each is checked here against the computation
it stands for; and a detector learns from the rows it scored, not scoring them again.
"""

from __future__ import annotations

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine.frame import NcclFrame
from pipeline.models.detectors.thermal import ThermalResidual
from pipeline.models.detectors.halfspace import SMALL, HalfSpaceForest
from pipeline.models.detectors.nccl import _group_keys
from pipeline.models.findings import Findings, _by_lane, lane_of, lanes, merge, worst_rows
from pipeline.numeric import group_stat, group_stats, groups
from pipeline.schema import DcgmRecord
from producers.sim import Simulator
from tests.unit.models.factories import one_model, records, run_scores

SETTINGS = settings(max_examples=150, deadline=None)
STATS = ("median", "count", "min", "max", "mean")


def _group_stat_before(keys: np.ndarray, values: np.ndarray, stat: str) -> np.ndarray:
    """``group_stat`` as it was before ``group_stats`` shared its work (a copy, with the equal
    groups' fast path taken on equal counts, as since 4b053ba)."""
    n = len(keys)
    if n == 0:
        return np.empty(0)
    uniq, inv = np.unique(keys, return_inverse=True)
    ok = ~np.isnan(values)
    cnt = np.bincount(inv, weights=ok.astype(float), minlength=len(uniq))
    if stat == "count":
        return cnt[inv]
    if stat == "mean":
        s = np.bincount(inv, weights=np.where(ok, values, 0.0), minlength=len(uniq))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, s / cnt, np.nan)[inv]
    if stat in ("min", "max"):
        out = np.full(len(uniq), np.inf if stat == "min" else -np.inf)
        (np.minimum if stat == "min" else np.maximum).at(out, inv[ok], values[ok])
        return np.where(np.isinf(out), np.nan, out)[inv]
    g = n // len(uniq)
    if g * len(uniq) == n and ok.all() and (cnt == g).all() and (np.diff(inv) >= 0).all():
        s = np.sort(values.reshape(len(uniq), g), axis=1)
        med = s[:, g // 2] if g % 2 else (s[:, g // 2 - 1] + s[:, g // 2]) / 2.0
        return np.repeat(med, g)
    order = np.lexsort((np.where(ok, values, np.inf), inv))
    starts = np.searchsorted(inv[order], np.arange(len(uniq)))
    c = cnt.astype(np.int64)
    lo, hi = starts + np.maximum(c - 1, 0) // 2, starts + c // 2
    sv = np.where(ok, values, np.inf)[order]
    return np.where(c > 0, (sv[np.minimum(lo, n - 1)] + sv[np.minimum(hi, n - 1)]) / 2.0, np.nan)[inv]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal arrays: dtype, shape and every bit (NaN where NaN, the sign of a zero)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


int_keys = st.sampled_from([np.int32, np.int64]).flatmap(
    lambda dt: st.lists(st.integers(-3, 6), max_size=40).map(lambda xs: np.array(xs, dtype=dt))
)


@SETTINGS
@given(int_keys, st.booleans())
def test_groups_is_np_unique(keys, in_order):
    keys = np.sort(keys) if in_order else keys
    assert all(_same(a, b) for a, b in zip(groups(keys), np.unique(keys, return_inverse=True), strict=True))
    want = np.unique(keys, return_index=True, return_inverse=True)
    assert all(_same(a, b) for a, b in zip(groups(keys, first=True), want, strict=True))


@st.composite
def keyed_values(draw):
    """Keys in runs or shuffled, equal runs or not (host x GPU ticks and NCCL groups alike),
    values with NaN, infinities, ties and signed zeros."""
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=7))
    if draw(st.booleans()):
        sizes = [sizes[0]] * len(sizes)
    keys = np.repeat(np.arange(len(sizes)) * 3, sizes).astype(np.int64)
    if draw(st.booleans()):
        keys = keys[np.random.default_rng(draw(st.integers(0, 99))).permutation(len(keys))]
    pool = st.sampled_from([0.0, -0.0, 1.0, 2.5, -4.0, 1e300, np.inf, -np.inf, np.nan])
    vals = draw(st.lists(st.one_of(pool, st.floats(-1e3, 1e3)), min_size=len(keys), max_size=len(keys)))
    return keys, np.array(vals, dtype=float)


@SETTINGS
@given(keyed_values(), st.lists(st.sampled_from(STATS), min_size=1, max_size=4))
def test_group_stats_are_group_stat_as_it_was(kv, stats):
    keys, values = kv
    with np.errstate(invalid="ignore", over="ignore"):
        got = group_stats(keys, values, tuple(stats), groups(keys))
        for stat, g in zip(stats, got, strict=True):
            want = _group_stat_before(keys, values, stat)
            assert _same(g, want) and _same(group_stat(keys, values, stat), want), stat


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 1.0, 2.0]) | st.floats(0, 3)), max_size=20))
def test_worst_rows_is_the_last_of_a_sort(rows):
    e = np.array([r[0] for r in rows], dtype=np.int32)
    s = np.array([r[1] for r in rows], dtype=float)
    order = np.lexsort((s, e))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = e[order][1:] != e[order][:-1]
    assert _same(worst_rows(e, s), order[last].astype(np.intp))
    ordered = np.arange(len(e), dtype=np.int32) * 2  # one row per entity, in order
    assert _same(worst_rows(ordered, s), np.arange(len(e)))


@st.composite
def lane_findings(draw):
    """A model's findings of one tick from a few lanes: entities, scores with ties, flags,
    evidence on flagged rows, warm or still learning, named or not."""
    named = draw(st.booleans())
    out = []
    for lane in draw(st.lists(st.integers(0, 63), min_size=2, max_size=4, unique=True)):
        ent = np.array(draw(st.lists(st.integers(0, 9), max_size=8, unique=True)), dtype=np.int64)
        n = len(ent)
        score = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 5.0]), min_size=n, max_size=n)))
        flagged = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        ev = {int(j): {"score": float(score[j]), "lane": lane} for j in np.flatnonzero(flagged)}
        keys = [("h", int(x)) for x in ent] if named else []
        f = Findings("m", 5.0, ent, score, flagged, np.full(n, float(lane)), ev, draw(st.booleans()), keys, lane)
        out.append(f)
    return out


def _merge_before(found):
    """``merge`` as it was (a verbatim copy of its body)."""
    warm = any(f.warm for f in found)
    use = sorted((f for f in found if f.warm or not warm), key=lambda f: f.lane)
    ent = np.concatenate([f.ent for f in use])
    score = np.concatenate([f.score for f in use])
    flagged = np.concatenate([f.flagged for f in use])
    src = np.concatenate([np.full(len(f.ent), i) for i, f in enumerate(use)])
    row = np.concatenate([np.arange(len(f.ent)) for f in use])
    order = np.lexsort((-src, score, flagged, ent))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ent[order][1:] != ent[order][:-1]
    pick = order[last]
    evidence = {}
    for j, p in enumerate(pick.tolist()):
        ev = use[int(src[p])].evidence.get(int(row[p]))
        if ev is not None:
            evidence[j] = ev
    keyed = all(len(f.keys) == len(f.ent) for f in use)
    keys = [use[int(src[p])].keys[int(row[p])] for p in pick.tolist()] if keyed else []
    obs = np.concatenate([f.obs_ts for f in use])[pick]
    return ent[pick], score[pick], flagged[pick], obs, evidence, warm, keys


@SETTINGS
@given(lane_findings())
def test_merge_is_merge_as_it_was(found):
    m = merge(found)
    ent, score, flagged, obs, evidence, warm, keys = _merge_before(found)
    assert _same(m.ent, ent) and _same(m.score, score) and _same(m.flagged, flagged) and _same(m.obs_ts, obs)
    assert (m.evidence, m.warm, m.keys, m.lane) == (evidence, warm, keys, -1)


def _frame(comm, nranks, host=None):
    n = len(comm)
    return NcclFrame(
        ts=np.full(n, 100.0) + np.arange(n) % 2,
        host=np.zeros(n, dtype=np.int32) if host is None else np.asarray(host, dtype=np.int32),
        gpu=np.arange(n, dtype=np.int32),
        comm=list(comm),
        rank=np.arange(n, dtype=np.int32),
        nranks=np.asarray(nranks, dtype=np.int32),
        bytes=np.full(n, 1024.0),
        exec_time_us=np.arange(n, dtype=float) + 1.0,
        busbw_gbs=np.full(n, 50.0),
    )


@SETTINGS
@given(st.lists(st.sampled_from("abcdef"), max_size=20), st.sets(st.sampled_from("abcdef")))
def test_group_keys_number_new_communicators_by_first_row(comm, known):
    codes = {c: i for i, c in enumerate(sorted(known))}
    want_codes = dict(codes)
    got = [want_codes.get(c) for c in comm]
    for i, x in enumerate(got):  # the loop this replaced
        if x is None:
            got[i] = want_codes.setdefault(comm[i], len(want_codes))
    fr = _frame(comm, [8] * len(comm))
    key = _group_keys(fr, codes)
    assert codes == want_codes and list(codes) == list(want_codes)
    assert (key >> 32).tolist() == got


@SETTINGS
@given(st.lists(st.sampled_from([1, 2, 6, 8, 16, 64, 72]), max_size=30))
def test_lanes_and_by_lane_are_per_distinct_size(nranks):
    nr = np.array(nranks, dtype=np.int32)
    assert _same(lanes(nr), np.array([lane_of(int(x)) for x in nranks], dtype=np.int64))
    fr = _frame([f"c{i}" for i in range(len(nr))], nr)
    lane = lanes(nr)
    got = _by_lane(fr)
    if not len(nr) or (lane == lane[0]).all():
        assert len(got) == 1 and got[0][1] is fr
        return
    want = [(int(k), np.flatnonzero(lane == k)) for k in np.unique(lane).tolist()]
    assert [k for k, _ in got] == [k for k, _ in want]
    for (_, part), (_, rows) in zip(got, want, strict=True):
        assert part.comm == [fr.comm[i] for i in rows] and _same(part.rank, fr.rank[rows])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3 * SMALL), st.integers(0, 2**31 - 1), st.sampled_from([0, 100, 600]))
def test_one_walk_scores_and_masses_as_two(n, seed, learnt):
    rng = np.random.default_rng(seed)
    f = HalfSpaceForest(5, n_trees=4, height=5, window_size=50, seed=7)
    f.learn(rng.random((learnt, 5)))
    X = rng.random((n, 5))
    X[rng.random((n, 5)) < 0.1] = np.nan  # NaN goes right, in both walks
    P = f.paths(X)
    assert P.shape == (n, f.n_trees, f.height + 1)
    assert _same(f.score_paths(P), f.score(X))
    ok = rng.random(n) < 0.7
    assert _same(f.path_masses(P[ok]), f.masses(X[ok]))


def test_two_cohorts_each_scored_once_a_tick(monkeypatch):
    """A cohort's rows (``ts[rows]``, a new array each time it is picked) are learnt from as
    scored: ``learn_many`` finds what ``score_many`` left, and does not score them again."""
    batches = [
        [msgspec.structs.replace(r, model="NVIDIA H200") if isinstance(r, DcgmRecord) and r.gpu % 2 else r for r in b]
        for b in records(Simulator(hosts=2, duration=30, seed=3))
    ]
    calls = []
    score_many = ThermalResidual.score_many

    def counted(self, ent, ts, F):
        calls.append(len(ent))
        return score_many(self, ent, ts, F)

    monkeypatch.setattr(ThermalResidual, "score_many", counted)
    ms = one_model("thermal_residual")
    _, seen, _ = run_scores(ms, batches)
    assert len(ms.cohort_names) == 2 and len(seen) > 10
    assert sum(calls) == sum(len(gpus) for _, gpus, _, _ in seen) and len(calls) == 2 * len(seen)
