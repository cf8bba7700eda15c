"""Arrays in snapshots are numbers only: anything else is a StateError at restore (issue 18)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.engine import Engine
from pipeline.engine.arrays import from_parts, numeric
from pipeline.errors import StateError


@pytest.mark.parametrize("a", [np.arange(6, dtype=np.int32).reshape(2, 3), np.array([1.5, np.nan]),
                               np.zeros(0, dtype=bool), np.zeros((0, 4))])
def test_numbers_round_trip(a):
    b = from_parts(a.dtype.str, list(a.shape), a.tobytes())
    np.testing.assert_array_equal(a, b)
    assert b.dtype == a.dtype and b.flags.writeable


@pytest.mark.parametrize("dtype,shape,raw", [
    ("|O", [1], b"\x00" * 8), ("<U1", [1], b"\x00" * 4), ("|V8", [1], b"\x00" * 8), ("<M8[s]", [1], b"\x00" * 8),
    ("object", [1], b"\x00" * 8), (5, [1], b"\x00" * 8), ("<f8", [2], b"\x00" * 8), ("<f8", "2", b"\x00" * 16),
    ("<f8", [True], b"\x00" * 8), ("<f8", [2], "not bytes"),
])
def test_anything_else_is_a_state_error(dtype, shape, raw):
    with pytest.raises(StateError):
        from_parts(dtype, shape, raw)


def test_numeric_checks_what_was_decoded():
    assert numeric(np.zeros(3), "x") is not None
    for bad in ([1, 2], np.array(["a"]), np.zeros((2, 2))):
        with pytest.raises(StateError):
            numeric(bad, "x")


def test_engine_restore_refuses_an_object_array():
    blob = Engine().snapshot()
    data = msgspec.msgpack.decode(blob)
    data["last"] = {"dtype": "|O", "shape": [1], "data": b"\x00" * 8}
    with pytest.raises(StateError, match="only numbers"):
        Engine().restore(msgspec.msgpack.encode(data))
