"""Model state is numbers: a forged or old snapshot is a StateError and runs nothing (issue 18)."""

from __future__ import annotations

import os
import pickle

import msgspec
import numpy as np
import pytest

from pipeline.engine import Engine
from pipeline.errors import StateError
from pipeline.models import load_models
from pipeline.models.modelset import STATE_VERSION
from pipeline.models.statecodec import decode_state, pack
from tests.unit.models.factories import run_scores


class _Marker:
    """Unpickling this creates a file: proof that a snapshot's bytes were executed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture(scope="module")
def warm_blob(sim_streams) -> bytes:
    """The default models' state after a run long enough for the HST forest to fill a window."""
    _, batches = sim_streams("nccl_straggler", hosts=4, duration=500.0, onset=250.0)
    ms = load_models()
    run_scores(ms, batches, name="gpu_multivariate")
    return ms.snapshot()


@pytest.fixture
def data(warm_blob) -> dict:
    return decode_state(warm_blob)


def _hst(data: dict) -> dict:
    (st,) = data["models"]["gpu_multivariate"]["dets"].values()
    return st["cohort"]["forest"]


def _restore(data: dict) -> None:
    load_models().restore(msgspec.msgpack.encode(pack(data)))


def test_snapshot_holds_no_pickle_and_restores(data):
    forest = _hst(data)
    assert data["version"] == STATE_VERSION == 6
    assert forest["l_mass"].dtype == np.int32 and forest["threshold"].dtype == np.float64
    assert forest["r_mass"].sum() > 0
    blob = msgspec.msgpack.encode(pack(data))
    assert b"\x80\x04\x95" not in blob            # no pickle protocol-4 frame anywhere
    ms = load_models()
    ms.restore(blob)
    assert ms.shared_bytes() > 0


def test_a_version_4_snapshot_is_read_and_its_epochs_start_afresh(data):
    """Version 4 had no cohort epochs: its detectors' state is taken, the epochs begin anew."""
    old = dict(data, version=4)
    del old["epochs"]
    ms = load_models()
    ms.restore(msgspec.msgpack.encode(pack(old)))
    assert ms.epochs.open is None and ms.epochs.applied is None
    assert ms.shared_bytes() > 0


def test_a_version_5_snapshots_nccl_detector_is_left_and_the_lanes_start_afresh(data):
    """Version 5 kept one detector and decider per NCCL model for every communicator size; its
    detector is not any lane's, so the lanes begin anew (the rest of the state is taken)."""
    old = dict(data, version=5)
    models = {}
    for name, st in data["models"].items():
        st = dict(st)
        if name.startswith("nccl_"):
            (lane_state, *_) = st["dets"].values()
            st["dets"] = {"fleet": lane_state}
            del st["lanes"]
        models[name] = st
    old["models"] = models
    ms = load_models()
    ms.restore(msgspec.msgpack.encode(pack(old)))
    nccl = ms.models["nccl_rank_straggler"]
    assert nccl.dets == {} and nccl.lane_deciders == {}
    assert ms.models["gpu_multivariate"].dets and ms.shared_bytes() > 0


def test_a_lane_outside_the_lanes_is_a_state_error(data):
    bad = dict(data, models={**data["models"], "nccl_comm_busbw": {**data["models"]["nccl_comm_busbw"], "lanes": {"64": {}}}})
    with pytest.raises(StateError, match="lane"):
        _restore(bad)


def test_malformed_epochs_are_a_state_error(data):
    for bad in ({"open": 1.5, "applied": None, "published": []}, {"open": 1, "applied": 0, "published": [{"x": 1}]}):
        with pytest.raises(StateError, match="epoch|cohort parts"):
            _restore(dict(data, epochs=bad))


def test_a_pickled_object_in_the_state_is_refused_not_unpickled(tmp_path, data):
    marker = tmp_path / "pwned"
    evil = msgspec.msgpack.Ext(2, pickle.dumps(_Marker(str(marker))))   # what versions 2-3 held
    packed = pack(data)
    (st,) = packed["models"]["gpu_multivariate"]["dets"].values()
    st["cohort"]["hst"] = evil
    with pytest.raises(StateError, match="pickled object"):
        load_models().restore(msgspec.msgpack.encode(packed))
    assert not marker.exists()
    # Also through the engine, the way the service restores a checkpoint.
    eng = Engine(row_checks=[], tick_checks=[], models=load_models())
    blob = eng.snapshot()
    outer = msgspec.msgpack.decode(blob)
    outer["models"] = msgspec.msgpack.encode({"version": STATE_VERSION, "x": evil})
    with pytest.raises(StateError):
        Engine(row_checks=[], tick_checks=[], models=load_models()).restore(msgspec.msgpack.encode(outer))
    assert not marker.exists()


@pytest.mark.parametrize("version", [2, 3])
def test_old_state_versions_are_refused(data, version):
    data["version"] = version
    with pytest.raises(StateError, match=f"version {version}"):
        _restore(data)


@pytest.mark.parametrize("code", [0, 3, 99])
def test_unknown_extension_types_are_refused(code):
    blob = msgspec.msgpack.encode({"version": STATE_VERSION, "x": msgspec.msgpack.Ext(code, b"\x00")})
    with pytest.raises(StateError, match="unknown extension"):
        load_models().restore(blob)


@pytest.mark.parametrize("parts", [
    ["|O", [2], b"\x00" * 16],                  # object dtype: pointers from the wire
    ["<U4", [1], b"\x00" * 16],                 # strings are not numbers
    ["<f8", [3], b"\x00" * 16],                 # 16 bytes are not 3 floats
    ["<f8", [-2], b""],                         # negative size
    ["<f8", [2, 2, 2, 2, 2], b"\x00" * 256],    # too many dimensions
    ["<f8", [2]],                               # malformed
])
def test_arrays_that_are_not_plain_numbers_are_refused(data, parts):
    packed = pack(data)
    packed["cohort_of"] = msgspec.msgpack.Ext(1, msgspec.msgpack.encode(parts))
    with pytest.raises(StateError):
        load_models().restore(msgspec.msgpack.encode(packed))


@pytest.mark.parametrize("key,value", [
    ("feature", lambda a: a.astype(np.int64)),           # wrong dtype
    ("feature", lambda a: np.full_like(a, 9)),           # a split on a feature that does not exist
    ("threshold", lambda a: a[:, :-1].copy()),           # wrong shape
    ("threshold", lambda a: np.where(a > 0.5, np.nan, a)),
    ("l_mass", lambda a: a - 10_000),                    # negative masses
    ("r_mass", lambda a: a.ravel().copy()),              # flat, not per tree
    ("counter", lambda c: 10 ** 6),                      # past the window
    ("counter", lambda c: "3"),
    ("first_window", lambda f: 1),
])
def test_a_forged_forest_is_a_state_error(data, key, value):
    forest = _hst(data)
    forest[key] = value(forest[key])
    with pytest.raises(StateError):
        _restore(data)


def test_per_entity_arrays_must_agree(data):
    m = data["models"]["nccl_rank_straggler"]
    m["flag"] = m["flag"][:1].copy() if len(m["flag"]) > 1 else np.zeros(5, dtype=bool)
    with pytest.raises(StateError, match="differ in length"):
        _restore(data)
    data["cohort_of"] = np.full(3, 7, dtype=np.int32)   # cohort 7 of 1
    with pytest.raises(StateError, match="cohort"):
        _restore(data)


def test_pack_refuses_objects_instead_of_pickling_them():
    with pytest.raises(TypeError, match="numbers and arrays"):
        pack({"x": object()})


def test_queued_nccl_records_must_be_columns_of_one_length(data):
    from pipeline.engine.frame import NCCL_KEYS
    frame = {k: (["c0", "c1"] if k == "comm" else np.zeros(2)) for k in NCCL_KEYS}
    data["nccl"] = [frame]
    _restore(data)                                        # well-formed: restores
    for bad in ({"ts": ["a", "b"]}, {"comm": [1, 2]}, {"rank": np.zeros(3)}):
        data["nccl"] = [{**frame, **bad}]
        with pytest.raises(StateError):
            _restore(data)
