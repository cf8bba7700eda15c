import numpy as np

from pipeline.engine.entities import Entities


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
