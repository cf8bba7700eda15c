"""Arrays in engine and model snapshots: numbers only, checked before they are used.

A snapshot comes back from the state topic, which is outside the process (docs/models.md#model-state,
docs/architecture.md §5): every array is rebuilt from (dtype, shape, raw bytes) only if the dtype
is a plain number type and the bytes are exactly what the shape says, so a forged or damaged
snapshot is a ``StateError``, never an object array or a crash later in a tick.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from pipeline.errors import StateError

#: what a snapshot may hold: booleans, integers and floats in the byte order this build writes
DTYPES = frozenset(
    np.dtype(t).str
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float32,
        np.float64,
    )
)
MAX_NDIM = 4


def from_parts(dtype: Any, shape: Any, raw: Any) -> np.ndarray:
    """The array ``a.dtype.str, list(a.shape), a.tobytes()`` described, or ``StateError``."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise StateError(f"snapshot array of dtype {dtype!r}: only numbers are read ({', '.join(sorted(DTYPES))})")
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > MAX_NDIM
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise StateError(f"snapshot array shape {shape!r} is not a list of at most {MAX_NDIM} sizes")
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise StateError("snapshot array data is not bytes")
    dt = np.dtype(dtype)
    if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != len(raw):
        raise StateError(f"snapshot array {dtype}{list(shape)} with {len(raw)} bytes of data")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def numeric(a: Any, what: str, ndim: int | None = 1) -> np.ndarray:
    """``a`` if it is a numeric array (of ``ndim`` dimensions), else ``StateError``."""
    if not isinstance(a, np.ndarray) or a.dtype.str not in DTYPES or (ndim is not None and a.ndim != ndim):
        got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
        raise StateError(f"snapshot: {what} is {got}, expected a {ndim}-d array of numbers")
    return a


def like(a: np.ndarray, what: str, want: np.ndarray) -> np.ndarray:
    """``a`` if it has ``want``'s dtype and number of dimensions, else ``StateError``: an array of
    another kind would restore and fail a later tick, far from the snapshot behind it.

    >>> like(np.zeros(3), "host_hwm", np.zeros(0)).shape
    (3,)
    """
    if a.dtype != want.dtype or a.ndim != want.ndim:
        raise StateError(f"snapshot: {what} is {a.dtype}{list(a.shape)}, expected {want.ndim}-d {want.dtype}")
    return a


# One codec, two framings, both kept byte for byte: the engine's snapshot holds an array as a
# map (``to_dict``), the model state as msgpack extension type 1 (``to_ext``), where dict keys
# come from telemetry (NCCL communicators) and must never be read as an array marker.
EXT_NDARRAY = 1


def to_parts(a: np.ndarray) -> tuple[str, list[int], bytes]:
    """(dtype, shape, raw bytes) of ``a``: what ``from_parts`` reads back."""
    a = np.ascontiguousarray(a)
    return a.dtype.str, list(a.shape), a.tobytes()


def to_dict(a: np.ndarray) -> dict[str, Any]:
    """``a`` as the engine snapshot's map: ``{"dtype", "shape", "data"}``."""
    dtype, shape, raw = to_parts(a)
    return {"dtype": dtype, "shape": shape, "data": raw}


def from_dict(d: dict[str, Any]) -> np.ndarray:
    """The array a ``to_dict`` map describes (numbers only, or ``StateError``)."""
    return from_parts(d["dtype"], d["shape"], d["data"])


def to_ext(a: np.ndarray) -> msgspec.msgpack.Ext:
    """``a`` as msgpack extension ``EXT_NDARRAY``: its (dtype, shape, bytes) packed inside."""
    return msgspec.msgpack.Ext(EXT_NDARRAY, msgspec.msgpack.encode(list(to_parts(a))))


def from_ext(data: bytes | memoryview) -> np.ndarray:
    """The array inside an ``EXT_NDARRAY`` extension value (numbers only, or ``StateError``)."""
    parts = msgspec.msgpack.decode(data)
    if not isinstance(parts, list) or len(parts) != 3:
        raise StateError("model state: a malformed array")
    return from_parts(*parts)
