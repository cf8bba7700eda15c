"""Edge cases of the online models: sparse sampling, gaps, and several rows of a GPU in one tick."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine.frame import NcclFrame
from pipeline.models.deciders import ThresholdDecider
from pipeline.models.detectors.counters import CounterRateSurprise
from pipeline.models.detectors.hst import CohortHalfSpaceTrees
from pipeline.schema import dcgm
from tests.unit.models.factories import one_model, run_scores

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "60"))
H100 = "NVIDIA H100 80GB HBM3"


def _hst_tick(det: CohortHalfSpaceTrees, ent: np.ndarray, t: float) -> None:
    n = len(ent)
    F = {k: np.full(n, 1.0) for k in det.features}
    ts = np.full(n, t)
    det.score_many(ent, ts, F)
    det.learn_many(ent, ts, F, np.ones(n, dtype=bool))


def test_every_gpu_takes_its_turn_whatever_the_sampling_interval():
    # At 10 s sampling a GPU whose phase never meets its sample times was never scored (28 of
    # 32 GPUs at 10 s, 31 at 30 s): its turn must come with the first sample at or after it.
    for interval in (1, 5, 10, 30):
        det = CohortHalfSpaceTrees(period=60, learn_every=1, window_size=50, warmup=10)
        ent = np.arange(32, dtype=np.int32)
        turns = np.zeros(32, dtype=int)
        for t in np.arange(1000.0, 1000.0 + 1200.0, interval):
            before = det.score_ts[ent].copy() if len(det.score_ts) else np.full(32, np.nan)
            _hst_tick(det, ent, float(t))
            after = det.score_ts[ent]
            turns += ~((after == before) | (np.isnan(after) & np.isnan(before)))
        assert turns.min() >= 19 and turns.max() <= 21, (interval, turns.min(), turns.max())


def test_rows_of_a_gpu_at_one_time_take_one_turn():
    # A GPU record and its per-link records share a time: one turn, not one per record.
    det = CohortHalfSpaceTrees(period=60, learn_every=1, window_size=50, warmup=10)
    ent = np.array([0, 0, 0, 1, 1, 1], dtype=np.int32)
    for t in range(1000, 1120):
        _hst_tick(det, ent, float(t))
    # Each GPU: on first sight, then at its turn in each of the two minutes (3 rows a turn before).
    assert det.forest.counter + (0 if det.forest.first_window else det.forest.window_size) == 6


def _feed(det: CounterRateSurprise, rows: list[tuple[float, float]]) -> list[float]:
    out = []
    ent = np.array([0], dtype=np.int32)
    for t, inc in rows:
        F = {"inc:ecc_sbe_volatile": np.array([inc])}
        ts = np.array([t])
        out.append(float(det.score_many(ent, ts, F)[0]))
        det.learn_many(ent, ts, F, np.array([True]))
    return out


def test_errors_counted_over_a_gap_are_not_a_burst():
    # Telemetry cut for 6 h while the GPU keeps its usual 1 SBE an hour: the 6 errors come back
    # as one increase. They happened over the gap, not in the last minute: scored 13.5 before.
    det = CounterRateSurprise(counters=["ecc_sbe_volatile"], warmup=120)
    _feed(det, [(float(t), 0.0) for t in range(3600)])
    assert _feed(det, [(3600.0 + 6 * 3600, 6.0)])[0] < 4.0
    assert _feed(det, [(3600.0 + 6 * 3600 + 3 * 86400, 72.0)])[0] < 4.0
    # A real burst after a gap still stands out.
    assert _feed(det, [(3600.0 + 7 * 3600 + 3 * 86400, 500.0)])[0] > 8.0


def test_a_burst_at_sparse_sampling_counts_whole():
    # Sampled every 5 min (shorter than the 30 min window, longer than the 1 min one): the share
    # applied to every sample, so a burst of 10 SBEs counted a fifth in the short window.
    det = CounterRateSurprise(counters=["ecc_sbe_volatile"], warmup=120)
    _feed(det, [(float(t), 0.0) for t in range(0, 7200, 300)])
    assert _feed(det, [(7200.0, 10.0)])[0] > 15.0

def test_errors_counted_over_a_field_gap_are_not_a_burst():
    # The GPU keeps reporting, the SBE field stops for 6 h (its increase unknown), then comes back.
    det = CounterRateSurprise(counters=["ecc_sbe_volatile"], warmup=120)
    _feed(det, [(float(t), 0.0) for t in range(3600)])
    _feed(det, [(float(t), np.nan) for t in range(3600, 3600 + 6 * 3600, 10)])
    assert _feed(det, [(3600.0 + 6 * 3600, 6.0)])[0] < 4.0


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 5.0, 30.0, 4000.0]), st.sampled_from([0.0, 0.0, 1.0, 3.0, 50.0])),
        min_size=2,
        max_size=30,
    ),
    cut=st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_counter_state_is_the_same_whatever_the_rows_per_call(steps, cut):
    # Reference: one row per call. Rows of one GPU in one call (a GPU record and its link
    # records, two samples in one tick) must leave the same windows: they kept the last row's.
    ts = 1000.0 + np.cumsum([d for d, _ in steps])
    inc = np.array([i for _, i in steps])
    ref = CounterRateSurprise(counters=["ecc_sbe_volatile"], warmup=10)
    _feed(ref, list(zip(ts.tolist(), inc.tolist())))
    det = CounterRateSurprise(counters=["ecc_sbe_volatile"], warmup=10)
    bounds = [0] + [i for i in range(1, len(ts)) if cut[i]] + [len(ts)]
    for a, b in zip(bounds, bounds[1:]):
        ent = np.zeros(b - a, dtype=np.int32)
        F = {"inc:ecc_sbe_volatile": inc[a:b]}
        det.score_many(ent, ts[a:b], F)
        det.learn_many(ent, ts[a:b], F, np.ones(b - a, dtype=bool))
    for name in CounterRateSurprise.entity_arrays:
        np.testing.assert_allclose(getattr(det, name), getattr(ref, name), rtol=1e-9, atol=1e-12, err_msg=name)


def test_an_sbe_burst_is_seen_beside_per_link_records():
    # NVML and dcgm-exporter's link metrics send one record per NVLink beside the GPU's, at
    # its time: three rows of the GPU each tick. Only the last row's increase was kept, so a
    # burst of 2 SBE/s scored 3.9 and never alerted.
    ms = one_model("counter_rate", features=["ecc_sbe_volatile"], warmup=5)
    batches, sbe = [], 0
    for t in range(1000, 1400):
        sbe += 2 if t >= 1300 else 0
        recs = [dcgm(t + 0.1, "h1", 0, {"ecc_sbe_volatile": sbe, "gpu_temp": 50}, model=H100)]
        recs += [dcgm(t + 0.1, "h1", 0, {"nvlink_crc_flit_errors": 0}, model=H100, link=k) for k in range(2)]
        batches.append(recs)
    _, seen, alerts = run_scores(ms, batches)
    assert max(float(np.max(s)) for *_, s in seen[-100:]) > 50.0
    assert [a.state for a in alerts][:1] == ["firing"]


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    scores=st.lists(st.sampled_from([0.0, 2.0, 3.0, 4.0, 6.0, 7.0]), min_size=1, max_size=12),
    cut=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_hysteresis_applies_rows_of_an_entity_in_order(scores, cut):
    ref = ThresholdDecider(6.0, 3.0)
    want = [bool(ref.decide(np.array([0]), np.array([s]), 1)[0]) for s in scores]
    d = ThresholdDecider(6.0, 3.0)
    got: list[bool] = []
    bounds = [0] + [i for i in range(1, len(scores)) if cut[i]] + [len(scores)]
    for a, b in zip(bounds, bounds[1:]):
        got += d.decide(np.zeros(b - a, dtype=np.int32), np.array(scores[a:b]), 1).tolist()
    assert got == want
    assert bool(d.up[0]) == bool(ref.up[0])


# -- NCCL models forget communicators of jobs long gone ------------------------------------------


def _bus_frame(t: float, comms: list[str], slow: str | None = None) -> NcclFrame:
    """One interval of 4-rank, one-host communicators, each on its own host, all at 40 GB/s but
    ``slow`` at 20."""
    rows = [(c, h, r) for h, c in enumerate(comms) for r in range(4)]
    n = len(rows)
    return NcclFrame(ts=np.full(n, t), host=np.array([h for _, h, _ in rows], np.int32),
                     gpu=np.array([r for _, _, r in rows], np.int32), comm=[c for c, _, _ in rows],
                     rank=np.array([r for _, _, r in rows], np.int32), nranks=np.full(n, 4, np.int32),
                     bytes=np.full(n, 64.0 * 2**20), exec_time_us=np.full(n, 1000.0),
                     busbw_gbs=np.array([20.0 if c == slow else 40.0 for c, _, _ in rows]))  # fmt: skip


def _learn(det, frame) -> np.ndarray:
    s = det.score_frame(frame)
    det.learn_frame(frame, s, np.ones(len(frame), dtype=bool))
    return s


def _sized_frame(comms: list[tuple[str, int, float, float]]) -> NcclFrame:
    """One interval of one-host communicators (name, ranks, bytes, GB/s), each on its own host."""
    rows = [(c, h, r, k, b, bw) for h, (c, k, b, bw) in enumerate(comms) for r in range(k)]
    n = len(rows)
    return NcclFrame(ts=np.full(n, 100.0), host=np.array([x[1] for x in rows], np.int32),
                     gpu=np.array([x[2] for x in rows], np.int32), comm=[x[0] for x in rows],
                     rank=np.array([x[2] for x in rows], np.int32), nranks=np.array([x[3] for x in rows], np.int32),
                     bytes=np.array([x[4] for x in rows]), exec_time_us=np.full(n, 1000.0),
                     busbw_gbs=np.array([x[5] for x in rows]))  # fmt: skip


def test_communicators_of_another_kind_are_no_peers_whatever_their_sizes_add_up_to():
    # The peer kind was nranks * 1,000,003 + bytes: 9 ranks moving 48,573 bytes met 8 ranks
    # moving 1 MiB, and the lone 9-rank communicator was judged against them (half their rate).
    from pipeline.models.detectors.nccl import CommBusbw

    det = CommBusbw()
    f = _sized_frame([("a", 8, 1_048_576.0, 100.0), ("b", 8, 1_048_576.0, 100.0), ("c", 8, 1_048_576.0, 100.0),
                      ("x", 9, 48_573.0, 50.0)])  # fmt: skip
    det.score_frame(f)
    lone = np.array([c == "x" for c in f.comm])
    assert not det.last["judged"][lone].any() and np.isnan(det.last["ratio"][lone]).all()
    assert det.last["judged"][~lone].sum() == 3  # the three of one kind judge each other


def test_nccl_models_hold_no_state_for_communicators_long_gone():
    # Every communicator ever seen kept a code and, for the bus-bandwidth model, four values: a
    # fleet whose jobs come and go grew its memory and its snapshots for ever.
    from pipeline.models.detectors.nccl import CommBusbw, RankStraggler

    bus, rank = CommBusbw(), RankStraggler()
    for day in range(12):
        comms = [f"job{day}-c{i}" for i in range(400)]  # 400 communicators of the day's jobs
        for k in range(3):
            f = _bus_frame(day * 86400.0 + k * 60, comms)
            _learn(bus, f)
            _learn(rank, f)
    assert rank.codes == {}
    assert len(bus.codes) <= 2 * 1024 and len(bus.own_m) <= 4 * 1024
    assert {c.split("-")[0] for c in bus.codes} <= {"job10", "job11"}  # only the last days' jobs


def test_a_communicator_seen_again_after_forget_s_starts_afresh_whatever_else_was_seen():
    # Forgetting is by the communicator's own silence, so the answer does not depend on whether
    # the memory was compacted (which depends on the other communicators a scorer sees).
    from pipeline.models.detectors.nccl import CommBusbw

    peers = [f"p{i}" for i in range(5)]
    scores = []
    for extra in (0, 3000):  # few other communicators, or enough to compact
        det = CommBusbw(forget_s=3600.0)
        for k in range(10):  # 'x' learns it runs at half its peers' bandwidth: its normal
            _learn(det, _bus_frame(k * 60.0, ["x", *peers], slow="x"))
        if extra:  # scored only: what they would teach (the noise) is not the question here
            det.score_frame(_bus_frame(5000.0, [f"o{i}" for i in range(extra)]))
            assert "x" not in det.codes  # compacted: 'x' and its peers had gone quiet
        scores.append(det.score_frame(_bus_frame(10_000.0, ["x", *peers], slow="x")))
    assert np.array_equal(scores[0], scores[1])
    assert scores[0].max() > 0  # afresh: half its peers' bandwidth is news again
    fresh = CommBusbw(forget_s=3600.0)
    for k in range(10):
        _learn(fresh, _bus_frame(k * 60.0, ["x", *peers], slow="x"))
    assert fresh.score_frame(_bus_frame(11 * 60.0, ["x", *peers], slow="x")).max() == 0  # learnt: no news


def test_a_bus_model_state_of_a_build_before_seen_t_loads():
    from pipeline.models.detectors.nccl import CommBusbw

    det = CommBusbw()
    for k in range(3):
        _learn(det, _bus_frame(k * 60.0, ["a", "b", "c", "d"]))
    st = det.to_state()
    del st["seen_t"]
    again = CommBusbw()
    again.load_state(st)
    assert np.array_equal(again.score_frame(_bus_frame(240.0, ["a", "b", "c", "d"])),
                          det.score_frame(_bus_frame(240.0, ["a", "b", "c", "d"])))
