"""The detectors' small helpers: the same answers as the numpy calls they stand in for."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.models.detectors._util import nan_to_num

CASES = [
    np.array([1.0, np.nan, np.inf, -np.inf]),
    np.array([1e308, 1e308]),  # finite, though their sum is not
    np.array([0.5, -2.0, 3.0]),
    np.zeros((3, 2)),
    np.array([np.nan]).reshape(1, 1),
    np.array([]),
    np.array([1, 2]),
    np.array([1.0, np.inf], dtype=np.float32),
    np.float64(np.nan),
]


@pytest.mark.parametrize("x", CASES, ids=range(len(CASES)))
@pytest.mark.parametrize("kw", [{}, {"nan": 0.0}, {"nan": 0.0, "posinf": 1e6, "neginf": 0.0}, {"nan": np.inf}])
def test_nan_to_num_is_numpys(x: np.ndarray, kw: dict) -> None:
    want, got = np.nan_to_num(x, **kw), nan_to_num(x, **kw)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert np.array_equal(got, want, equal_nan=True)


def test_nan_to_num_returns_a_copy() -> None:
    x = np.array([1.0, 2.0])
    y = nan_to_num(x)
    y[0] = 5.0
    assert x[0] == 1.0


def test_median_is_numpys() -> None:
    from pipeline.models.detectors.counters import _median

    rng = np.random.default_rng(3)
    for trial in range(2000):
        x = rng.random(int(rng.integers(1, 60))) * 10.0 ** float(rng.integers(-12, 12))
        if trial % 3 == 0:
            x = np.round(x, 2)  # ties
        if trial % 5 == 0:
            x[0] = np.nan if trial % 2 else np.inf
        want, got = float(np.median(x)), _median(x)
        assert got == want or (got != got and want != want)


def test_normalise_all_at_once_is_one_at_a_time() -> None:
    from pipeline.models.detectors.hst import NORMALISED, CohortHalfSpaceTrees, _normalise

    rng = np.random.default_rng(4)
    n = 64
    F = {k: rng.normal(50.0, 40.0, n) for k in CohortHalfSpaceTrees.features}
    F["gpu_temp"][:5] = [np.nan, np.inf, -np.inf, 1e300, -1e300]
    F["hostmean:power"][5:8] = [0.0, -0.0, np.nan]
    got = _normalise(F, n)
    assert list(got) == list(NORMALISED)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for k, (expr, lo, hi) in NORMALISED.items():
            a, op, b = expr.split()
            v = F[a] - F[b] if op == "-" else F[a] / F[b]
            want = np.clip(np.where(np.isfinite(v), (v - lo) / (hi - lo), 0.5), 0.0, 1.0)
            assert np.array_equal(got[k], want), k
