from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine.entities import Entities
from tests.factories import fuzz_examples


def test_ids_by_host_id_match_ids_by_name_in_first_seen_order():
    by_name, by_id = Entities(), Entities()
    rng = np.random.default_rng(3)
    for _ in range(20):   # batches with new hosts, new GPUs, repeats and a huge index
        names = [f"h{int(h)}" for h in rng.integers(0, 40, 50)]
        idx = [int(i) for i in rng.choice([0, 1, 7, 8, 15, 4000], 50)]
        want = by_name.gpu_ids(names, idx)
        got = by_id.gpu_ids_of(by_id.host_ids(names), np.array(idx))
        np.testing.assert_array_equal(got, want)
    assert by_id.gpus == by_name.gpus and by_id.hosts == by_name.hosts


def test_restored_entities_answer_by_host_id():
    ent = Entities()
    ent.gpu_ids(["a", "b", "a"], [0, 3, 1])
    back = Entities.from_state(ent.to_state())
    np.testing.assert_array_equal(back.gpu_ids_of(back.host_ids(["b", "a", "a"]), np.array([3, 1, 0])), [1, 2, 0])


def test_host_ids_assign_new_hosts_in_order_of_first_appearance():
    ent = Entities()
    np.testing.assert_array_equal(ent.host_ids(["b", "a", "b"]), [0, 1, 0])
    # Known and new names mixed: known keep their ids, new ones get the next, in order.
    np.testing.assert_array_equal(ent.host_ids(["a", "c", "b", "d", "c"]), [1, 2, 0, 3, 2])
    assert ent.hosts == ["b", "a", "c", "d"]
    assert ent.host_ids([]).dtype == np.int32 and len(ent.host_ids([])) == 0


def _one_at_a_time(ent: Entities, names: list[str], limit: int | None) -> list[int]:
    """The reference: each name in turn, a new one taken while fewer than ``limit`` are known."""
    return [ent.host(n) if limit is None or n in ent.host_id or ent.n_hosts < limit else -1 for n in names]


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(
    st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=30), max_size=6),
    st.one_of(st.none(), st.integers(0, 6)),
)
def test_host_and_gpu_ids_match_taking_one_record_at_a_time(batches: list[list[str]], limit: int | None) -> None:
    ent, ref = Entities(), Entities()
    for names in batches:
        got = ent.host_ids(names, limit=limit)
        assert got.dtype == np.int32
        assert got.tolist() == _one_at_a_time(ref, names, limit)
        known = [n for n in names if n in ent.host_id]
        idx = [ord(n) % 3 for n in known]
        assert ent.gpu_ids(known, idx).tolist() == [ref.gpu(n, i) for n, i in zip(known, idx)]
    assert ent.hosts == ref.hosts and ent.gpus == ref.gpus


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(st.lists(st.sampled_from("abcdefgh"), max_size=30), st.one_of(st.none(), st.integers(0, 6)), st.randoms())
def test_host_ids_in_a_given_order_match_taking_the_records_in_that_order(names, limit, rnd) -> None:
    order = list(range(len(names)))
    rnd.shuffle(order)
    want = dict(zip(order, _one_at_a_time(Entities(), [names[i] for i in order], limit)))
    got = Entities().host_ids(names, limit=limit, order=np.array(order, np.int64))
    assert got.tolist() == [want[i] for i in range(len(names))]
