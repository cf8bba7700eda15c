"""A damaged or forged engine snapshot is a ``StateError`` at restore, never another exception:
the service reads snapshots back from the state topic, outside the process."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine import Engine
from pipeline.errors import StateError
from tests.factories import fleet, fuzz_examples


def _snapshot() -> dict:
    eng = Engine()
    eng.process(fleet(range(40), hosts=2, gpus=2))
    return msgspec.msgpack.decode(eng.snapshot())


SNAPSHOT = _snapshot()
NAMES = sorted(SNAPSHOT["lifecycles"])


@pytest.mark.parametrize("blob", [[1, 2], 3, "snapshot", None], ids=repr)
def test_a_snapshot_that_is_not_a_map_is_a_state_error(blob) -> None:
    with pytest.raises(StateError, match="snapshot"):
        Engine().restore(msgspec.msgpack.encode(blob))


@pytest.mark.parametrize("lifecycles", [[1, 2], 3.5, None, {NAMES[0]: 7}, {NAMES[0]: [1]}], ids=repr)
def test_lifecycles_that_are_not_maps_are_a_state_error(lifecycles) -> None:
    with pytest.raises(StateError, match="cannot restore"):
        Engine().restore(msgspec.msgpack.encode({**SNAPSHOT, "lifecycles": lifecycles}))


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.text(max_size=3) | st.binary(max_size=9),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(key=st.sampled_from(sorted(SNAPSHOT)), value=VALUES)
def test_any_value_under_any_key_restores_or_is_a_state_error(key: str, value: object) -> None:
    try:
        Engine().restore(msgspec.msgpack.encode({**SNAPSHOT, key: value}))
    except StateError:
        pass


def _array(dtype: str, shape: list[int]) -> dict:
    n = 1
    for d in shape:
        n *= d
    return {"dtype": dtype, "shape": shape, "data": bytes(n * int(dtype[-1]))}


@pytest.mark.parametrize("key", ["last_ts", "host_last_ts", "host_back", "host_hwm", "host_seen", "host_jump",
                                 "host_step", "host_min_step", "released_step"])
@pytest.mark.parametrize("array", [_array("<f8", [2, 2]), _array("<f8", [1, 1, 1, 1]), _array("<i8", [4])], ids=repr)
def test_a_per_host_or_per_gpu_array_of_another_kind_is_a_state_error_not_a_later_crash(key, array) -> None:
    # Before: restored, then the next batch failed in numpy (broadcast, index, NaN to int).
    eng = Engine()
    with pytest.raises(StateError, match=key):
        eng.restore(msgspec.msgpack.encode({**SNAPSHOT, key: array}))


@pytest.mark.parametrize("gpu", [-2**63, -1, 4096, 1e308, float("inf"), "0"], ids=repr)
def test_a_gpu_index_out_of_a_records_range_is_a_state_error(gpu) -> None:
    # Before: IndexError or OverflowError at restore, or a snapshot that failed to encode later.
    ents = {**SNAPSHOT["entities"], "gpus": [[SNAPSHOT["entities"]["gpus"][0][0], gpu]]}
    with pytest.raises(StateError, match="GPU index"):
        Engine().restore(msgspec.msgpack.encode({**SNAPSHOT, "entities": ents}))


def test_nesting_past_the_decoders_depth_is_a_state_error() -> None:
    deep = b"\x91" * 5000 + b"\xc0"   # a list in a list ... 5000 deep
    blob = msgspec.msgpack.encode({**SNAPSHOT, "stats": msgspec.Raw(deep)})
    with pytest.raises(StateError):
        Engine().restore(blob)
