"""The fleet stage's canonical order as arrays (pipeline/canonical.py ``canonical_order``) against
its definition: the records sorted by ``record_identity``, the first fed of each identity kept."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schema import NcclRecord, dcgm
from pipeline.canonical import canonical_order
from tests.factories import T0, canonical_reference, fuzz_examples


_dcgm = st.builds(
    lambda t, h, g, link, fields: dcgm(T0 + t, h, g, fields, link=link),
    st.sampled_from([0.0, 0.5, 1.0, 7.25]),
    st.sampled_from(["n1", "n10", "n2", "a"]),
    st.integers(0, 3),
    st.none() | st.integers(0, 2),
    # Two sources of one GPU's second: its DCGM exporter's values and its kernel log's.
    st.sampled_from([{"gpu_temp": 50}, {"gpu_temp": 50, "xid": float("nan")}, {"xid": 79}]),
)
_nccl = st.builds(
    lambda t, h, g, comm, rank, coll, seq, size: NcclRecord(
        ts=T0 + t, host=h, gpu=g, comm=comm, rank=rank, nranks=8, coll=coll, seq=seq, bytes=size,
        exec_time_us=100.0),
    st.sampled_from([0.0, 1.0, 7.25]),
    st.sampled_from(["n1", "n2", "a"]),
    st.none() | st.integers(0, 3),
    st.sampled_from(["0x1", "0xab", "", "z"]),
    st.integers(0, 7),
    st.sampled_from(["AllReduce", "AllGather", ""]),
    st.none() | st.integers(0, 3),
    # Size buckets of one collective without sequence numbers (the Inspector's Prometheus mode).
    st.sampled_from([1 << 20, 1 << 30]),
)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.lists(_dcgm | _nccl, max_size=40), st.data())
def test_canonical_order_is_the_identity_sort_without_repeats(records, data):
    # Repeats of records already drawn: what an upstream replay forwards again.
    if records:
        records = records + data.draw(st.lists(st.sampled_from(records), max_size=10))
    ts = np.array([r.ts for r in records], dtype=np.float64)
    order, dropped = canonical_order(records, ts)
    want = canonical_reference(records)
    assert order == want
    assert dropped == len(records) - len(want)


def test_a_repeat_keeps_the_first_fed():
    a = dcgm(T0, "n1", 0, {"gpu_temp": 50}, labels={"from": "first"})
    b = dcgm(T0, "n1", 0, {"gpu_temp": 50}, labels={"from": "again"})  # same sample, fed later
    order, dropped = canonical_order([a, b], np.array([T0, T0]))
    assert order == [0] and dropped == 1


def test_two_sources_of_one_gpu_second_are_both_kept_in_one_order_whichever_came_first():
    # The exporter's sample and the kernel log's XID for one GPU at one second, one of them
    # forwarded again after them (an upstream replay): two records, one repeat, and the order
    # the models see is the records', not the order they were forwarded in.
    def exporter():
        return dcgm(T0, "n1", 0, {"gpu_temp": 50, "power_usage": 300})

    def xid():
        return dcgm(T0, "n1", 0, {"xid": 79})

    for recs in ([xid(), exporter(), exporter()], [exporter(), xid(), xid()]):
        order, dropped = canonical_order(recs, np.full(3, T0))
        assert [recs[i].fields.DCGM_FI_DEV_XID_ERRORS == 79 for i in order] == [False, True] and dropped == 1
        assert order[0] in (0, 1) and order[1] in (0, 1)   # the first fed of each, not its repeat


def test_an_nccl_collectives_size_buckets_without_sequence_numbers_are_each_kept():
    def bucket(size: int) -> NcclRecord:
        return NcclRecord(ts=T0, host="n1", gpu=0, comm="tp", rank=0, nranks=8, coll="AllReduce", bytes=size,
                          exec_time_us=size / 1e4)
    recs = [bucket(1 << 20), bucket(1 << 30), bucket(1 << 20)]   # the last: the first sent again
    order, dropped = canonical_order(recs, np.full(3, T0))
    assert order == [0, 1] and dropped == 1


def test_a_sequence_number_beyond_int64_sorts_without_error():
    big = [NcclRecord(ts=T0, host="n1", comm="c", rank=0, nranks=2, coll="AllReduce", seq=s, bytes=1,
                      exec_time_us=1.0) for s in (2**64 - 1, 3, 2**70, 3)]
    order, dropped = canonical_order(big, np.full(len(big), T0))
    assert order == canonical_reference(big) and dropped == 1
