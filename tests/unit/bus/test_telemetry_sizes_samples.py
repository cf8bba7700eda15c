"""``sized_host_groups`` cuts a host's backlog where the time changes: a message holds each of
the host's samples whole, which the consumer's release trusts (docs/architecture.md §4), unless
one sample alone is more than a message may hold."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bus.telemetry import array, sized_host_groups
from pipeline.schema import dcgm
from tests.factories import T0, fuzz_examples


def _backlog(sizes: list[int], label: str = "") -> list:
    return [
        dcgm(T0 + k, "h", g, {"gpu_temp": 50}, labels={"l": label} if label else None)
        for k, n in enumerate(sizes)
        for g in range(n)
    ]


def test_a_backlog_of_whole_samples_is_cut_between_them() -> None:
    # Three samples of 8 GPUs at most 12 records a message: 8 + 4 cut the second sample, whose
    # first half the consumer took for the whole of it.
    groups, big = sized_host_groups(_backlog([8, 8, 8]), 12, 1 << 20)
    assert big == []
    assert [[r.ts - T0 for r in recs] for _, _, recs in groups] == [[0.0] * 8, [1.0] * 8, [2.0] * 8]


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(
    st.lists(st.integers(1, 8), min_size=1, max_size=12),
    st.integers(1, 20),
    st.sampled_from([1 << 20, 2000, 700]),
)
def test_every_record_once_in_order_within_bounds_and_samples_whole_where_they_fit(sizes, max_records, max_bytes):
    recs = _backlog(sizes, label="x" * 40)
    groups, big = sized_host_groups(recs, max_records, max_bytes)
    assert big == []
    assert [r for _, _, held in groups for r in held] == recs
    for _, parts, held in groups:
        assert 1 <= len(parts) <= max_records and len(array(parts)) <= max_bytes
        assert [json.loads(p)["gpu"] for p in parts] == [r.gpu for r in held]
    # A sample is in one message unless alone it is more than one may hold.
    where: dict[float, set[int]] = {}
    encoded: dict[float, list[bytes]] = {}
    for i, (_, parts, held) in enumerate(groups):
        for r, part in zip(held, parts):
            where.setdefault(r.ts, set()).add(i)
            encoded.setdefault(r.ts, []).append(part)
    for ts, messages in where.items():
        if len(encoded[ts]) <= max_records and len(array(encoded[ts])) <= max_bytes:
            assert len(messages) == 1, ts - T0
