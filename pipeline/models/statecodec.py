"""How model state is written as bytes: msgpack of numbers, strings, maps and numeric arrays,
no objects (docs/models.md#model-state). The model set's snapshots use it, and so do model
shards for what they send each other (pipeline/service/peers.py).

>>> decode_state(encode_state({"n": 3, "a": np.arange(2)}))["a"].tolist()
[0, 1]
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from pipeline.engine.arrays import EXT_NDARRAY, from_ext, to_ext
from pipeline.errors import StateError

# Arrays travel as a msgpack extension value (``pipeline.engine.arrays.to_ext``), never as a
# marked dict: dict keys in the state come from telemetry (NCCL communicator ids) and must never
# be read as a type marker. There is no other extension: state is numbers, strings and arrays of
# numbers, so restoring it runs nothing. Type 2 was a pickled object (model state versions 2 and
# 3); it is refused, never unpickled.
_EXT_NDARRAY, _EXT_PICKLE_REFUSED = EXT_NDARRAY, 2


def pack(o: Any) -> Any:
    """``o`` as msgpack takes it: arrays as the extension value, numpy scalars as numbers, keys as
    strings; anything else that is not a number, string or container is a ``TypeError``.

    >>> pack({1: np.float32(0.5), "a": (1, None)})
    {'1': 0.5, 'a': [1, None]}
    """
    if isinstance(o, np.ndarray):
        return to_ext(o)
    if isinstance(o, dict):
        return {str(k): pack(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [pack(v) for v in o]
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        return o.item()
    if o is None or isinstance(o, (str, int, float, bool, bytes)):
        return o
    # A detector whose state is an object: a bug here, not something to smuggle into the snapshot.
    raise TypeError(f"model state holds a {type(o).__name__}; a detector's state is numbers and arrays")


def _ext(code: int, data: memoryview) -> Any:
    if code == _EXT_NDARRAY:
        return from_ext(data)
    if code == _EXT_PICKLE_REFUSED:
        raise StateError("model state holds a pickled object (state version 3 or older); it is not read")
    raise StateError(f"unknown extension type {code} in model state")


_decode_state = msgspec.msgpack.Decoder(ext_hook=_ext)


def encode_state(obj: Any) -> bytes:
    """Numbers, strings, maps and numeric arrays as the model state writes them (msgpack, arrays
    as extension type 1): what model shards send each other too (pipeline/service/peers.py)."""
    return msgspec.msgpack.encode(pack(obj))


def decode_state(blob: bytes) -> Any:
    """What ``encode_state`` wrote; an array's dtype and shape checked, nothing else run."""
    return _decode_state.decode(blob)
