"""``pipeline/rows.py``: a batch as columns answers as the list of its records would (indexing,
slices, ``take``, ``concat``, ``split``), against that list as the reference."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import colwire, rows
from pipeline.decode import Decoder
from pipeline.schema import NcclRecord, dcgm
from tests.factories import T0, fuzz_examples


def _columns(recs: list[Any]) -> rows.DcgmColumns:
    """``recs`` (DCGM records, hosts in runs) as the decoder's columns: a message per host run."""
    runs: list[list[Any]] = []
    for r in recs:
        if runs and runs[-1][0].host == r.host:
            runs[-1].append(r)
        else:
            runs.append([r])
    payloads = [b for b in map(colwire.encode_dcgm, runs) if b is not None]
    assert len(payloads) == len(runs)  # every run went columnar
    got = Decoder().decode_many(payloads, [f"t[0]@{i}" for i in range(len(runs))], [True] * len(runs)).records
    assert isinstance(got, rows.DcgmColumns)
    return got


def _key(r: Any) -> tuple:
    """What a row says, whichever shape carried it."""
    if isinstance(r, NcclRecord):
        return ("nccl", r.ts, r.host, r.comm, r.rank)
    fields = {k: v for k, v in msgspec.structs.asdict(r.fields).items() if v is not None}
    return ("dcgm", r.ts, r.host, r.gpu, r.link, r.model, tuple(sorted(fields.items())))


def _nccl(t: float, host: str, rank: int) -> NcclRecord:
    return NcclRecord(ts=t, host=host, comm="c1", rank=rank, nranks=4, coll="AllReduce", bytes=8, exec_time_us=5.0)


SAMPLES = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from(["n1", "n2", "n3"]), st.integers(0, 3), st.integers(50, 90)),
    min_size=1,
    max_size=12,
).map(lambda xs: [dcgm(T0 + t, h, g, {"gpu_temp": temp}, model="H100") for t, h, g, temp in xs])
NCCL = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["n1", "n4"]), st.integers(0, 3)), max_size=5).map(
    lambda xs: [_nccl(T0 + t, h, k) for t, h, k in xs]
)


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(SAMPLES, NCCL, st.data())
def test_rows_answer_as_the_list_of_their_records(samples: list, nccl: list, data: st.DataObject) -> None:
    cols = _columns(samples)
    batch: Any = rows.Combined(cols, nccl) if nccl else cols
    ref = [*samples, *nccl]  # a Combined's columns come first
    assert [_key(r) for r in batch] == [_key(r) for r in ref]
    n = len(ref)
    i = data.draw(st.integers(-n, n - 1))
    assert _key(batch[i]) == _key(ref[i])
    # A slice is a take: a Combined's columns first, then its records, each in the slice's order.
    sl = data.draw(st.slices(n))
    idx = list(range(n))[sl]
    want = [i for i in idx if i < len(samples)] + [i for i in idx if i >= len(samples)]
    assert [_key(r) for r in batch[sl]] == [_key(ref[i]) for i in want]
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    assert [_key(r) for r in rows.take(batch, mask)] == [_key(r) for r, m in zip(ref, mask) if m]
    assert rows.times(batch).tolist() == [r.ts for r in ref] and rows.hosts(batch) == [r.host for r in ref]
    d, o = rows.split(batch)
    assert [_key(r) for r in d] == [_key(r) for r in samples] and o == nccl
    # records_at: the rows at any indices as records, in their order (a Combined's records and
    # all of them, as the canonical order reads the NCCL ones, included).
    picks = [np.flatnonzero(mask), np.arange(len(samples), n), np.array(data.draw(st.lists(st.integers(0, n - 1))))]
    if nccl:  # some of the records only, in any order
        picks.append(np.array(data.draw(st.lists(st.integers(len(samples), n - 1), min_size=1)), np.int64))
    for at in picks:
        assert [_key(r) for r in rows.records_at(batch, at)] == [_key(ref[i]) for i in at.tolist()]


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(st.lists(st.tuples(SAMPLES, NCCL, st.booleans()), min_size=1, max_size=4))
def test_concat_says_where_each_row_came_from(parts: list) -> None:
    shaped, laid_end_to_end = [], []
    for samples, nccl, as_columns in parts:
        if as_columns:
            shaped.append(rows.Combined(_columns(samples), nccl) if nccl else _columns(samples))
            laid_end_to_end += [*samples, *nccl]
        else:
            shaped.append(nccl)  # a part of records only: NCCL
            laid_end_to_end += nccl
    joined, where = rows.concat(shaped)
    order = np.arange(len(laid_end_to_end)) if where is None else where
    assert sorted(order.tolist()) == list(range(len(laid_end_to_end)))
    assert [_key(r) for r in joined] == [_key(laid_end_to_end[k]) for k in order.tolist()]


def test_a_row_past_either_end_is_an_index_error() -> None:
    cols = _columns([dcgm(T0, "n1", 0, {"gpu_temp": 60}), dcgm(T0, "n1", 1, {"gpu_temp": 61})])
    both = rows.Combined(cols, [_nccl(T0, "n1", 0)])
    for batch in (cols, both):
        n = len(batch)
        assert batch[-n].gpu == 0
        for i in (n, -n - 1):
            with pytest.raises(IndexError):
                batch[i]
