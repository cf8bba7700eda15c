"""NCCL lanes (pipeline/models/findings.py): a tick's findings from several lanes merge into one
finding per entity that does not depend on where, or in which order, the lanes were scored."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.models.findings import LANES, Findings, apply_findings, from_wire, lane_of, lanes, merge, to_wire
from tests.factories import fuzz_examples


def _lane(lane: int, rows: list[tuple[int, float, bool]], warm: bool) -> Findings:
    ent = np.array([e for e, _, _ in rows], dtype=np.int64)
    score = np.array([s for _, s, _ in rows])
    flagged = np.array([f for _, _, f in rows], dtype=bool)
    evidence = {j: {"lane": lane, "score": s} for j, (_, s, f) in enumerate(rows) if f}
    obs = np.full(len(rows), 100.0 + lane)
    return Findings("m", 10.0, ent, score, flagged, obs, evidence, warm, [("h", int(e)) for e in ent], lane)


def _reference(found: list[Findings]) -> dict[int, tuple[float, bool, float, dict | None]]:
    """Per entity, as the docstring says: warm lanes only (all, if none is), the flagged row
    first, then the worst score, then the lowest lane."""
    use = [f for f in found if f.warm] or found
    best: dict[int, tuple[tuple, tuple]] = {}
    for f in use:
        for j, e in enumerate(f.ent.tolist()):
            rank = (bool(f.flagged[j]), float(f.score[j]), -f.lane)
            got = (float(f.score[j]), bool(f.flagged[j]), float(f.obs_ts[j]), f.evidence.get(j))
            if e not in best or rank > best[e][0]:
                best[e] = (rank, got)
    return {e: v for e, (_, v) in best.items()}


_rows = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from([0.0, 1.0, 2.5, 9.0]), st.booleans()),
    max_size=6,
    unique_by=lambda r: r[0],
)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, LANES - 1), _rows, st.booleans()), min_size=1, max_size=4, unique_by=lambda x: x[0]
    ),
    st.randoms(use_true_random=False),
)
def test_merge_is_the_reference_in_any_order(lanes_in, rnd):
    found = [_lane(lane, rows, warm) for lane, rows, warm in lanes_in]
    shuffled = list(found)
    rnd.shuffle(shuffled)
    got = merge(shuffled)
    want = _reference(found)
    assert got.warm == any(f.warm for f in found)
    assert sorted(got.ent.tolist()) == sorted(want)
    for j, e in enumerate(got.ent.tolist()):
        assert (float(got.score[j]), bool(got.flagged[j]), float(got.obs_ts[j]), got.evidence.get(j)) == want[e]
        assert got.keys[j] == ("h", e)


def test_a_lane_still_learning_says_nothing_beside_a_warm_one():
    warm = _lane(3, [(0, 1.0, False)], warm=True)
    cold = _lane(5, [(0, 50.0, True), (1, 50.0, True)], warm=False)
    got = merge([cold, warm])
    assert got.ent.tolist() == [0] and not got.flagged.any() and got.warm


def test_lanes_are_the_same_everywhere_and_bounded():
    sizes = np.array([8, 64, 8, 1 << 30, -1], dtype=np.int64)
    got = lanes(sizes)
    assert got.tolist() == [lane_of(int(k)) for k in sizes.tolist()]
    assert ((got >= 0) & (got < LANES)).all()
    assert lanes(np.zeros(0, dtype=np.int32)).tolist() == []


def test_a_findings_lane_crosses_the_wire_and_an_old_senders_means_all_lanes():
    f = _lane(19, [(2, 4.0, True)], warm=True)
    back = from_wire(to_wire(f), {"m": True})
    assert back.lane == 19 and back.keys == [("h", 2)]
    old = to_wire(f)
    del old["lane"]
    assert from_wire(old, {"m": True}).lane == -1


def test_once_a_lane_is_warm_a_lane_still_learning_alone_in_a_tick_changes_nothing():
    from pipeline.models import load_models

    m = load_models().models["nccl_rank_straggler"]
    apply_findings(m, _lane(3, [(0, 1.0, False)], warm=False))
    assert not m.nccl_warm and m.cur[0] == 1.0  # before any lane is warm: applied, scores hidden
    apply_findings(m, _lane(3, [(0, 2.0, False)], warm=True))
    assert m.nccl_warm and m.cur[0] == 2.0
    apply_findings(m, _lane(5, [(0, 50.0, True), (1, 50.0, True)], warm=False))  # a new size
    assert m.nccl_warm and m.cur[0] == 2.0 and not m.flag.any()
