"""``sized_host_messages``: messages bounded in records and bytes, records too large alone set apart."""

from __future__ import annotations

import json

import pytest

from pipeline.bus.telemetry import array, per_host_messages, sized_host_messages
from pipeline.schema import dcgm


def _recs(n, host="h", label=""):
    out = []
    for i in range(n):
        r = dcgm(1.0e9 + i, host, 0, {"gpu_temp": 50})
        if label:
            r.labels = {"l": label * (i % 3)}
        out.append(r)
    return out


def test_same_bytes_as_per_host_messages_when_no_byte_bound_bites():
    recs = _recs(250) + _recs(30, host="other")
    msgs, big = sized_host_messages(recs, 100, 1 << 30)
    assert big == [] and [(k, array(p)) for k, p in msgs] == list(per_host_messages(recs, 100))


def test_byte_bound_and_too_large_records():
    recs = _recs(60, label="z" * 300)
    msgs, big = sized_host_messages(recs, 1000, 1500)
    assert all(len(array(p)) <= 1500 for _, p in msgs)
    assert sum(len(p) for _, p in msgs) + len(big) == 60
    assert [len(json.loads(array(p))) for _, p in msgs if p]
    tiny, big2 = sized_host_messages(recs, 1000, 100)
    assert tiny == [] and len(big2) == 60


def test_bounds_must_be_positive():
    with pytest.raises(ValueError):
        sized_host_messages([], 0, 10)
