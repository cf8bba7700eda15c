"""``record``'s parts without a broker (pipeline/recording.py): the merge of a topic's partitions
and what a message becomes in the recording."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bus.base import Message
from pipeline.bus.telemetry import COLUMNAR_HEADERS
from pipeline.colwire import encode_dcgm
from pipeline.recording import PartitionMerge, _lines
from pipeline.schema import DcgmRecord, dcgm
from tests.factories import T0, fuzz_examples


def _topic(seed: int, partitions: int, n: int) -> list[list[Message]]:
    """Each partition's messages in offset order, timestamps rising within it, at random."""
    rng = random.Random(seed)
    out: list[list[Message]] = [[] for _ in range(partitions)]
    t = [0] * partitions
    for _ in range(n):
        p = rng.randrange(partitions)
        t[p] += rng.choice([0, 1, 5, 100])
        out[p].append(Message("t", p, len(out[p]), None, b"", t[p]))
    return out


def _key(m: Message) -> tuple[int, int, int]:
    return (m.timestamp_ms or 0, m.partition, m.offset)


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(seed=st.integers(0, 1 << 30), partitions=st.integers(1, 8), n=st.integers(0, 200),
       polls=st.integers(1, 30), limit=st.sampled_from([3, 50, 100_000]))  # fmt: skip
def test_the_merge_gives_the_timestamp_order_whatever_the_polls_bring(seed, partitions, n, polls, limit):
    # Reference: every message sorted by (timestamp, partition, offset). Polls bring each
    # partition's messages in offset order, a piece at a time, partitions in any order; a
    # partition with messages not fetched yet holds the rest (up to the limit).
    rng = random.Random(seed + 1)
    topic = _topic(seed, partitions, n)
    fetched = [0] * partitions
    merge = PartitionMerge(limit=limit)
    got: list[Message] = []
    for _ in range(polls):
        batch = []
        for p in rng.sample(range(partitions), partitions):
            k = rng.randint(0, len(topic[p]) - fetched[p])
            batch += topic[p][fetched[p]:fetched[p] + k]
            fetched[p] += k
        merge.add(batch)
        got += merge.ready(range(partitions), pending=lambda p: fetched[p] < len(topic[p]))
        assert len(merge) <= max(limit, 0) + len(batch)
    for p in range(partitions):
        merge.add(topic[p][fetched[p]:])
    got += merge.rest()
    every = sorted((m for part in topic for m in part), key=_key)
    assert sorted(got, key=_key) == every
    for p in range(partitions):  # each partition's order is kept, whatever the limit
        assert [m.offset for m in got if m.partition == p] == list(range(len(topic[p])))
    if limit >= n:
        assert got == every


def test_a_partition_not_fetched_yet_holds_the_others_until_the_limit():
    merge = PartitionMerge(limit=2)
    merge.add([Message("t", 1, i, None, b"", 10 + i) for i in range(4)])
    out = list(merge.ready([0, 1], pending=lambda p: p == 0))
    # Past the limit the earliest go, to leave ``limit`` waiting.
    assert [m.offset for m in out] == [0, 1] and len(merge) == 2


def test_a_columnar_message_is_recorded_as_its_records():
    recs = [dcgm(T0, "h1", g, {"gpu_temp": 70 + g, "power": 650.5}, labels={"pod": "p"}) for g in range(3)]
    m = Message("t", 0, 0, b"h1", encode_dcgm(recs), 1, tuple(COLUMNAR_HEADERS))
    got = [msgspec.json.decode(x, type=DcgmRecord) for x in _lines(m)]
    assert got == [msgspec.convert(msgspec.to_builtins(r), DcgmRecord) for r in recs]
    assert b'"DCGM_FI_DEV_GPU_TEMP":70,' in _lines(m)[0]  # whole numbers as the producers write them


def test_a_columnar_message_that_does_not_parse_is_kept_verbatim_on_one_line():
    m = Message("t", 0, 0, b"h1", b"\x81\xa2cv\n\x01", 1, tuple(COLUMNAR_HEADERS))
    assert _lines(m) == [b"\x81\xa2cv \x01"]


def test_the_merge_holds_at_most_its_bytes_too():
    # Found by a review: 100,000 messages of a few KB each is hundreds of MB held.
    merge = PartitionMerge(limit_bytes=10_000)
    merge.add([Message("t", 1, i, None, b"x" * 1000, 10 + i) for i in range(30)])
    out = list(merge.ready([0, 1], pending=lambda p: p == 0))
    assert len(out) == 20 and len(merge) == 10
