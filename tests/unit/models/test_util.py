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
