import numpy as np
import pytest

from pipeline.catalog import FIELDS
from pipeline.engine.arrays import from_dict, to_dict
from pipeline.engine.entities import Entities
from pipeline.engine.frame import N_FIELDS, DcgmFrame
from pipeline.engine.state import COUNTER_COLS, Columns, GpuState, _positions, advance
from pipeline.errors import StateError
from tests.factories import T0

COLS = np.array(sorted({FIELDS.by_alias(a).column for a in
                        ("gpu_temp", "sm_clock", "clocks_event_reasons", "ecc_sbe_volatile", "xid")}), dtype=np.intp)


def _entities(hosts: int, gpus_per_host: int) -> Entities:
    ent = Entities()
    for h in range(hosts):
        for g in range(gpus_per_host):
            ent.gpu(f"h{h}", g)
    return ent


def _tick(rng: np.random.Generator, n: int, t: float) -> DcgmFrame:
    vals = rng.integers(0, 5, size=(n, len(COLS))).astype(float)
    vals[rng.random(vals.shape) < 0.3] = np.nan          # fields not reported this time
    return DcgmFrame(np.full(n, t), np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32) // 4, vals)


def test_columns_reads_like_the_full_matrix():
    rng = np.random.default_rng(1)
    data = rng.random((6, len(COLS)))
    full = np.full((6, N_FIELDS), np.nan)
    full[:, COLS] = data
    m = Columns(data, _positions(COLS))
    assert m.shape == full.shape and len(m) == 6
    for col in range(N_FIELDS):
        np.testing.assert_array_equal(m[:, col], full[:, col])
    some = np.array([COLS[0], 0 if 0 not in COLS else N_FIELDS - 1, COLS[-1]])
    np.testing.assert_array_equal(m[:, some], full[:, some])
    np.testing.assert_array_equal(m[2:4, some], full[2:4, some])
    np.testing.assert_array_equal(np.asarray(m), full)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_tick_of_the_whole_fleet_folds_like_any_other_chunk(seed):
    # Every GPU once, in id order, takes the short way (no gather or scatter by id); it must
    # give the same view and state as the general path, which a GPU that never reports forces.
    n = 16
    whole, general = GpuState(), GpuState()
    ent_whole, ent_general = _entities(4, 4), _entities(4, 4)
    ent_general.gpu("h9", 0)
    rng = np.random.default_rng(seed)
    resets = []
    for step in range(6):
        frame = _tick(rng, n, T0 + step)
        if step == 3:   # a counter reset: the series restarts
            frame.values[:, :] = 0.0
        a = advance(whole, frame, ent_whole, T0 + step, COLS)
        b = advance(general, frame, ent_general, T0 + step, COLS)
        assert a.ids == slice(0, n) and b.ids is b.frame.gpu   # per-GPU state read as a view, or gathered
        for name in ("filled", "prev", "seen"):
            np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
        np.testing.assert_array_equal(np.asarray(a.frame.values), np.asarray(b.frame.values))
        np.testing.assert_array_equal(a.increase, b.increase)
        np.testing.assert_array_equal(a.reset, b.reset)
        np.testing.assert_array_equal(whole.last[:n], general.last[:n])
        np.testing.assert_array_equal(whole.seen[:n], general.seen[:n])
        np.testing.assert_array_equal(whole.last_ts[:n], general.last_ts[:n])
        resets.append(bool(a.reset.any()))
    assert resets[3] and len(COUNTER_COLS)
    # Unused columns read as NaN, used ones as the last known value.
    sbe = FIELDS.by_alias("ecc_sbe_volatile").column
    assert not np.isnan(a.filled[:, sbe]).all()
    unused = next(c for c in range(N_FIELDS) if c not in COLS)
    assert np.isnan(a.filled[:, unused]).all()


def test_state_of_columns_in_use_survives_a_change_of_columns_and_a_restore():
    # The columns in use live apart from the full matrices (GpuState.columns); rules reloaded
    # with other columns, and an older snapshot restored into the running state, must still
    # see each field's last value from the ticks in which it was in use, and nothing else.
    n, rng = 8, np.random.default_rng(4)
    a = COLS[:3]
    b = np.array(sorted({*COLS[1:].tolist(), FIELDS.by_alias("power").column}), dtype=np.intp)
    state, ent = GpuState(), _entities(2, 4)
    want = np.full((n, N_FIELDS), np.nan)
    for step, cols in enumerate([a, a, b, b, b, b, a, a]):
        if step == 3:   # a snapshot (Engine.snapshot reads the full matrices)
            saved = state.last.copy(), state.seen.copy(), want.copy()
        if step == 5:   # ... restored into the running state, as Engine.restore does
            state.last, state.seen, want = saved
        vals = rng.integers(0, 9, size=(n, N_FIELDS)).astype(float)
        vals[rng.random(vals.shape) < 0.4] = np.nan
        advance(state, DcgmFrame(np.full(n, T0 + step), np.arange(n, dtype=np.int32),
                                 np.arange(n, dtype=np.int32) // 4, vals), ent, T0 + step, cols)
        reported = ~np.isnan(vals[:, cols])
        want[:, cols] = np.where(reported, vals[:, cols], want[:, cols])
    np.testing.assert_array_equal(state.last[:n], want)
    assert state.nbytes_per_gpu() < 4096


def test_a_snapshot_from_a_smaller_catalog_restores_with_the_new_fields_empty():
    # Fields added to the catalog take its last columns: a snapshot made before them holds
    # narrower per-GPU matrices, which restore with the new columns unknown (NaN).
    rng = np.random.default_rng(2)
    st = GpuState()
    ent = _entities(2, 4)
    st.ensure(8, 2)
    advance(st, _tick(rng, 8, T0), ent, columns=COLS)
    state = st.to_state()
    before = st.last.copy()
    narrow = {k: dict(v) for k, v in state.items()}
    for key in ("last", "seen"):
        narrow[key] = to_dict(from_dict(state[key])[:, : N_FIELDS - 6].copy())
    back = GpuState()
    back.load_state(narrow, np.full(2, 1.0))
    assert back.last.shape == before.shape == back.seen.shape and before.shape[1] == N_FIELDS
    np.testing.assert_array_equal(back.last[:, : N_FIELDS - 6], before[:, : N_FIELDS - 6])
    assert np.isnan(back.last[:, N_FIELDS - 6 :]).all()


def test_a_snapshot_wider_than_the_catalog_is_refused():
    st = GpuState()
    st.ensure(2, 1)
    state = st.to_state()
    state["last"] = to_dict(np.zeros((2, N_FIELDS + 1)))
    with pytest.raises(StateError, match="catalog has"):
        GpuState().load_state(state, np.full(1, 1.0))
