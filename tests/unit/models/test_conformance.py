"""Every registered detector passes the same suite (docs/models.md: one protocol for all)."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from river import anomaly

from pipeline.models.detectors.halfspace import SMALL, HalfSpaceForest
from pipeline.models.detectors.hst import KEYS, CohortHalfSpaceTrees, _normalise
from pipeline.models.statecodec import decode_state, pack
from pipeline.models.protocol import Detector
from pipeline.models.registry import REGISTRY, build
from tests.unit.models.factories import HOSTS, TARGETS, auc, one_model, run_scores

NAMES = sorted(REGISTRY)


def stream(name: str, n: int = 120, seed: int = 0) -> list[dict]:
    """A plausible single-entity stream for the detector's kind of input."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = 1000.0 + i
        if REGISTRY[name].source == "nccl":
            for rank in range(4):
                out.append({"ts": t, "comm": "c1", "rank": rank, "entity": rank, "host": rank // 2, "nranks": 4,
                            "bytes": 1 << 20, "exec_time_us": 1000.0 * (1 + rng.normal(0, 0.01)),
                            "busbw_gbs": 400.0 * (1 + rng.normal(0, 0.01))})
            continue
        p = 600 + 20 * rng.normal()
        out.append({"ts": t, "entity": 0, "gpu_temp": 60 + 0.06 * (p - 600) + rng.normal(0, 0.5),
                    "memory_temp": 65.0, "power": p, "sm_clock": 1980.0, "gpu_util": 99.0,
                    "hostmean:gpu_temp": 60.0, "hostmean:memory_temp": 65.0, "hostmean:power": 600.0,
                    "hostmean:sm_clock": 1980.0, "hostmean:gpu_util": 99.0,
                    "inc:ecc_sbe_volatile": float(rng.random() < 0.01)})
    return out


def fresh(name: str):
    return build(name, dict(REGISTRY[name].example))


@pytest.mark.parametrize("name", NAMES)
def test_speaks_rivers_protocol(name):
    det = fresh(name)
    assert isinstance(det, Detector)
    for x in stream(name, 30):
        s = det.score_one(x)
        assert isinstance(s, float) and math.isfinite(s)
        det.learn_one(x)


@pytest.mark.parametrize("name", NAMES)
def test_clone_is_fresh_with_same_params(name):
    det = fresh(name)
    xs = stream(name, 60)
    for x in xs[:50]:
        det.learn_one(x)
    clone = det.clone()
    assert type(clone) is type(det) and clone.params == det.params
    ref = fresh(name)
    for x in xs[50:]:
        assert clone.score_one(x) == ref.score_one(x)
        clone.learn_one(x)
        ref.learn_one(x)


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trip_through_the_snapshot_format_scores_identically(name):
    # What the engine snapshot holds (msgpack of numbers and arrays, no pickle) is all there is
    # to a detector: a fresh one loaded from it continues exactly.
    det = fresh(name)
    xs = stream(name, 100)
    for x in xs[:80]:
        det.learn_one(x)
    copy = fresh(name)
    copy.load_state(decode_state(msgspec.msgpack.encode(pack(det.to_state()))))
    for x in xs[80:]:
        assert copy.score_one(x) == det.score_one(x)
        copy.learn_one(x)
        det.learn_one(x)


@pytest.mark.parametrize("name", NAMES)
def test_features_appearing_and_disappearing(name):
    det = fresh(name)
    xs = stream(name, 90)
    keys = [k for k in xs[0] if k not in ("ts", "entity")]
    for i, x in enumerate(xs):
        if 30 <= i < 60:   # half the features vanish for a while, an unknown one appears
            x = {k: v for j, (k, v) in enumerate(x.items()) if k in ("ts", "entity") or j % 2}
            x["brand_new_feature"] = 1.0
        s = det.score_one(x)
        assert math.isfinite(s), (i, x)
        det.learn_one(x)
    assert keys  # the stream had features to lose


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [{}, "nan", "none", "text", "inf"])
def test_finite_scores_on_blank_or_missing_input(name, bad):
    det = fresh(name)
    for x in stream(name, 40):
        det.learn_one(x)
    x = dict(stream(name, 41)[-1])
    if bad == {}:
        x = {"ts": x["ts"]}
    else:
        val = {"nan": float("nan"), "none": None, "text": "n/a", "inf": float("inf")}[bad]
        x = {k: (v if k in ("ts", "entity", "comm") else val) for k, v in x.items()}
    s = det.score_one(x)
    assert isinstance(s, float) and math.isfinite(s)
    det.learn_one(x)
    assert math.isfinite(det.score_one(stream(name, 42)[-1]))


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_with_a_seed(name):
    a, b = fresh(name), fresh(name)
    sa, sb = [], []
    for x in stream(name, 80, seed=5):
        sa.append(a.score_one(x))
        a.learn_one(x)
        sb.append(b.score_one(x))
        b.learn_one(x)
    assert sa == sb


@pytest.mark.parametrize("name", NAMES)
def test_better_than_chance_on_a_labelled_simulator_stream(name, sim_streams):
    """Rows of the faulty GPU (its host, for host-level models) after onset rank above the rest."""
    fault, cfg = TARGETS[name]
    sim, batches = sim_streams(fault, hosts=HOSTS.get(name, 2))
    lab = next(lb for lb in sim.labels() if lb["fault"])
    ms = one_model(name, **cfg)
    eng, seen, _ = run_scores(ms, batches)
    target_gpu = eng.entities.gpu_id[(lab["host"], lab["gpu"])]
    target_host = eng.entities.host_id[lab["host"]]
    host_level = REGISTRY[name].level == "host"
    pos, neg = [], []
    for ts, gpu, host, score in seen:
        if ts[0] < lab["onset"] - 120:     # warm-up: not judged
            continue
        hit = (host == target_host) if host_level else (gpu == target_gpu)
        after = ts >= lab["onset"] + 30
        ok = ~np.isnan(score)
        pos.append(score[hit & after & ok])
        neg.append(score[~hit & ok])
    p, n = np.concatenate(pos), np.concatenate(neg)
    assert len(p) > 10 and len(n) > 10
    assert auc(p, n) > 0.75, auc(p, n)


# -- Half-Space Trees: numpy state, river's numbers -------------------------------------------------

def _river(n_trees: int = 10, height: int = 8, window_size: int = 250, seed: int = 42) -> anomaly.HalfSpaceTrees:
    return anomaly.HalfSpaceTrees(n_trees=n_trees, height=height, window_size=window_size, seed=seed,
                                  limits={k: (0.0, 1.0) for k in KEYS})


@pytest.mark.parametrize("n_trees,height,window_size,seed", [(10, 8, 250, 42), (5, 3, 3, 1), (3, 5, 50, 7)])
def test_half_space_forest_scores_exactly_as_rivers(n_trees, height, window_size, seed):
    """Same seed and parameters, same stream: the same score to the last bit, whether the rows
    come in batches walked in numpy (more than SMALL rows) or in Python (SMALL or fewer)."""
    ref = _river(n_trees, height, window_size, seed)
    forest = HalfSpaceForest(len(KEYS), n_trees=n_trees, height=height, window_size=window_size, seed=seed)
    rng = np.random.default_rng(seed)
    sizes = [0, 1, SMALL, SMALL + 1, 3 * window_size + 5, 40, 2, 17]
    n = 0
    for step in range(120):
        X = np.clip(rng.normal(0.5, 0.1, (sizes[step % len(sizes)], len(KEYS))), 0.0, 1.0)
        if len(X) and step % 5 == 0:
            X[0] = rng.random(len(KEYS))            # an outlier now and then
        rows = [dict(zip(KEYS, r)) for r in X.tolist()]
        want = np.array([ref.score_one(r) for r in rows], dtype=float)
        np.testing.assert_array_equal(forest.score(X), want)
        for r in rows:
            ref.learn_one(r)
        forest.learn(X)
        n += len(X)
    assert n > 10 * window_size and not forest.first_window


def test_half_space_forest_draws_rivers_trees():
    ref = _river(seed=3)
    ref.learn_one(dict.fromkeys(KEYS, 0.5))        # river draws its trees on the first sample
    forest = HalfSpaceForest(len(KEYS), seed=3)
    for t, tree in enumerate(ref.trees):
        node, i = tree, 0
        for _ in range(forest.height):             # the left-most path of each tree
            assert (KEYS[forest.feature[t, i]], forest.threshold[t, i]) == (node.feature, node.threshold)
            node, i = node.children[0], 2 * i + 1


def test_a_seeded_forest_drawn_again_is_rivers_and_its_own(monkeypatch):
    """Forests of one seed are drawn once a process: each later one is a copy of the same splits
    (river's still), which learning or a restore in one forest does not change in another."""
    first, second = HalfSpaceForest(len(KEYS), seed=11), HalfSpaceForest(len(KEYS), seed=11)
    np.testing.assert_array_equal(first.feature, second.feature)
    np.testing.assert_array_equal(first.threshold, second.threshold)
    assert first.feature is not second.feature and first.threshold is not second.threshold
    first.threshold[:] = 0.0
    np.testing.assert_array_equal(HalfSpaceForest(len(KEYS), seed=11).threshold, second.threshold)
    monkeypatch.setattr("pipeline.models.detectors.halfspace.CACHED_SPLITS", 0)   # drawn anew
    np.testing.assert_array_equal(HalfSpaceForest(len(KEYS), seed=11).threshold, second.threshold)
    assert not np.array_equal(HalfSpaceForest(len(KEYS), seed=12).threshold, second.threshold)


def test_cohort_hst_scores_as_rivers_half_space_trees_on_a_stream():
    """The detector (features normalised against the host, then the forest) gives river's scores."""
    det = CohortHalfSpaceTrees(period=1, window_size=50, warmup=0)
    ref = _river(window_size=50)
    for x in stream("cohort_hst", 400, seed=2):
        F = {k: np.array([float(x[k])]) for k in det.features}
        z = {k: float(v[0]) for k, v in _normalise(F, 1).items()}
        assert det.score_one(x) == float(ref.score_one(z))
        det.learn_one(x)
        ref.learn_one(z)
