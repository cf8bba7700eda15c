"""The columnar telemetry message (pipeline/colwire.py, docs/architecture.md §7).

The format is gpuwarden's own (a msgpack map, https://github.com/msgpack/msgpack/blob/master/spec.md,
of little-endian arrays), so its fixtures are built here. The property test is the contract:
the same records, JSON or columnar, give the same alerts and the same dead letters (reason,
origin, action, fields) through the decoder and the engine.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import colwire, rows
from pipeline.bus.base import Message
from pipeline.bus.telemetry import COLUMNAR, JSON, per_host_wire
from pipeline.catalog import BLANK_FP64, BLANK_INT64
from pipeline.decode import REASONS, Decoder
from pipeline.engine import Engine, EngineConfig, EngineOutput
from pipeline.runner import Pipeline
from pipeline.schema import dcgm
from tests.factories import HEALTHY, T0, THROTTLED, alert_rows, dead_rows, fleet, fuzz_examples, sample

PROP = settings(
    max_examples=fuzz_examples(60),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HEADERS = (("content-type", colwire.COLUMNAR_V1),)


def _messages(batches: list[list], encoding: str) -> list[list[Message]]:
    out, off = [], 0
    for batch in batches:
        msgs = []
        for key, value, headers in per_host_wire(batch, encoding):
            msgs.append(Message("t", 0, off, key, value, None, tuple(headers) if headers else None))
            off += 1
        out.append(msgs)
    return out


def _run(batches: list[list], encoding: str, wall_clock: float | None = None, **config: Any) -> EngineOutput:
    dec = Decoder(wall_clock=(lambda: wall_clock) if wall_clock is not None else None)
    p = Pipeline(Engine(EngineConfig(**config)), dec)
    out = EngineOutput()
    for msgs in _messages(batches, encoding):
        out.extend(p.handle(msgs))
    out.extend(p.flush())
    return out




# -- the same records, either encoding --------------------------------------------------------

HOSTS = st.sampled_from(["n0", "n1", "n2", "", "a b", "x\n", "h" * 300])
TS = st.one_of(
    st.integers(0, 40).map(lambda s: T0 + s),
    st.sampled_from([0.0, 1.0e9 - 1, T0 * 1000, T0 + 2.2e9, T0 + 0.5]),
)
GPUS = st.one_of(st.integers(0, 3), st.sampled_from([-1, 4095, 4096, 2**40, -(2**40)]))
LINKS = st.one_of(st.none(), st.sampled_from([0, 3, -1, 1023, 1024]))
MODELS = st.one_of(st.none(), st.sampled_from(["NVIDIA H100 80GB HBM3", "H200", "", "x\n", "m" * 300]))
NAMES = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "not_a_dcgm_field",
    ]
)
VALUES = st.one_of(
    st.integers(0, 2000),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([-5, 0x40 | 0x20, BLANK_FP64, BLANK_INT64, 2**60, 1e300, math.inf, math.nan, "71", None, True]),
)
LABELS = st.one_of(st.just({}), st.sampled_from([{"job": "j1"}, {"job": "j2", "pod": "p"}, {"hpc_job": 7}]))
RECORD = st.fixed_dictionaries(
    {"kind": st.just("dcgm"), "ts": TS, "host": HOSTS, "gpu": GPUS},
    optional={
        "v": st.sampled_from([1, 1, 1, 2]),
        "link": LINKS,
        "model": MODELS,
        "fields": st.dictionaries(NAMES, VALUES, max_size=5),
        "labels": LABELS,
        "uuid": st.sampled_from(["GPU-1", None]),
    },
)


@PROP
@given(st.lists(st.lists(RECORD, max_size=12), min_size=1, max_size=5), st.booleans())
def test_json_and_columnar_give_equal_alerts_and_dead_letters(batches: list[list], live: bool) -> None:
    wall = T0 + 20 if live else None
    a, b = _run(batches, JSON, wall), _run(batches, COLUMNAR, wall)
    assert alert_rows(a) == alert_rows(b)
    assert dead_rows(a) == dead_rows(b)


@pytest.mark.parametrize("far_host", ["n0", "n1"])
def test_a_batch_of_both_encodings_is_screened_in_message_order(far_host: str) -> None:
    # n0's message mixes schema versions, so it goes as JSON; n1's goes columnar after it. The
    # decoder puts the columns first, and screening (record by record in stream order once a
    # record is far ahead) must still read them in the order the messages came.
    far = T0 + 2.2e9
    n0 = [{"kind": "dcgm", "ts": T0, "host": "n0", "gpu": 0, **({"v": 2} if i == 4 else {})} for i in range(5)]
    n0.append({"kind": "dcgm", "ts": T0 + 1, "host": "n0", "gpu": 0})
    if far_host == "n0":
        n0.append({"kind": "dcgm", "ts": far, "host": "n0", "gpu": 0})
    batch = [*n0, {"kind": "dcgm", "ts": far, "host": "n1", "gpu": 0}]
    assert [h is not None for _, _, h in per_host_wire(batch, COLUMNAR)] == [False, True]
    a, b = _run([batch], JSON), _run([batch], COLUMNAR)
    assert any(d.reason == "ts_out_of_range" for d in a.dead)
    assert alert_rows(a) == alert_rows(b)
    assert dead_rows(a) == dead_rows(b)


def test_a_batch_of_both_encodings_admits_new_hosts_in_message_order() -> None:
    # At the engine's host limit the first host to come is kept: n0 (JSON: its message mixes
    # schema versions) came before n1 (columnar), though the decoder puts the columns first.
    n0 = [{"kind": "dcgm", "ts": T0, "host": "n0", "gpu": 0, "v": v} for v in (1, 2)]
    batch = [*n0, {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0}]
    a, b = _run([batch], JSON, max_hosts=1), _run([batch], COLUMNAR, max_hosts=1)
    assert [(d.reason, d.host) for d in a.dead if d.reason == "entity_limit"] == [("entity_limit", "n1")]
    assert dead_rows(a) == dead_rows(b)


def test_a_throttled_gpu_fires_the_same_alert_from_either_encoding() -> None:
    recs = fleet(range(40), hosts=3, gpus=4, overrides=lambda t, h, g: THROTTLED if (h, g) == ("n1", 2) else {})
    batches = [[r for r in recs if r.ts == T0 + t] for t in range(40)]
    col = _messages(batches, COLUMNAR)
    assert all(m.headers == HEADERS for msgs in col for m in msgs)  # every message went columnar
    a, b = _run(batches, JSON), _run(batches, COLUMNAR)
    assert [x[:4] for x in alert_rows(b)] == [("firing", "thermal_throttling", "n1", 2)]
    assert alert_rows(a) == alert_rows(b) and dead_rows(a) == dead_rows(b) == []


def test_bad_rows_cost_only_themselves_with_the_json_paths_origins() -> None:
    recs = [sample(0, "n1", 0), sample(0, "n1", 5000), sample(0, "n1", 2, gpu_temp=-300)]
    recs.append(dcgm(T0 * 1000, "n1", 3, HEALTHY))
    out = _run([recs], COLUMNAR)
    got = sorted((d.reason, d.origin, d.action) for d in out.dead)
    assert got == [
        ("negative_value", "t[0]@0#2", "fields_dropped"),
        ("out_of_range", "t[0]@0#1", "record_dropped"),
        ("ts_out_of_range", "t[0]@0#3", "record_dropped"),
    ]


def test_a_batch_mixing_json_and_columnar_messages_keeps_both_parts_as_they_are() -> None:
    a = sample(0, "n1", 0)
    b = sample(0, "n2", 0)
    json_msg = Message("t", 0, 0, b"n1", msgspec.json.encode([a]))
    col_msg = Message("t", 0, 1, b"n2", colwire.encode_dcgm([b]), None, HEADERS)
    d = Decoder().decode_many([json_msg.value, col_msg.value], ["t[0]@0", "t[0]@1"], [False, True])
    # The columns first, then the JSON records; each keeps its own message's origin.
    assert isinstance(d.records, rows.Combined) and len(d.records.cols) == 1
    assert [r.host for r in d.records] == ["n2", "n1"]
    assert list(d.origins) == ["t[0]@1#0", "t[0]@0#0"]


# -- the encoder carries only what it carries exactly -------------------------------------------


@pytest.mark.parametrize(
    "rec",
    [
        {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "fields": {"DCGM_FI_DEV_GPU_TEMP": "<<<blank>>>"}},
        {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "fields": {"DCGM_FI_DEV_GPU_TEMP": math.nan}},
        {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "fields": {"DCGM_FI_DEV_GPU_TEMP": 2**70}},
        {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": True},
        {"kind": "dcgm", "ts": math.inf, "host": "n1", "gpu": 0},
        {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "labels": {"job": 7}},
        {"kind": "nccl", "ts": T0, "host": "n1"},
    ],
)
def test_what_json_tells_apart_stays_json(rec: dict) -> None:
    assert colwire.encode_dcgm([rec]) is None
    ((_, value, headers),) = per_host_wire([rec], COLUMNAR)
    assert headers is None and value.startswith(b"[")


def test_a_name_msgpack_cannot_encode_is_refused() -> None:
    assert colwire.encode_dcgm([{"kind": "dcgm", "ts": T0, "host": "n\ud800", "gpu": 0}]) is None


def test_columns_round_trip() -> None:
    recs = [
        dcgm(T0, "n1", 0, {"gpu_temp": 71, "sm_clock": 1980}, model="H100", labels={"job": "j1"}),
        dcgm(T0, "n1", 0, {"nvlink_replay_errors": 3}, link=5),
    ]
    names = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE")
    c = colwire.parse(colwire.encode_dcgm(recs), names)
    assert (c.host, c.ts.tolist(), c.gpu.tolist()) == ("n1", [T0, T0], [0, 0])
    assert c.link is not None and c.link.tolist() == [rows.NO_LINK, 5]
    assert np.array_equal(c.values, [[1980, 71, np.nan], [np.nan, np.nan, np.nan]], equal_nan=True)
    assert c.models == ["H100"] and c.model is not None and c.model.tolist() == [0, -1]
    assert c.labels == [{"job": "j1"}]


# -- hostile columnar messages --------------------------------------------------------------------


def _wire(**over: object) -> bytes:
    good = msgspec.msgpack.decode(colwire.encode_dcgm([sample(0, "n1", 0), sample(0, "n1", 1)]))
    return msgspec.msgpack.encode({**good, **over})


@pytest.mark.parametrize(
    "payload, says",
    [
        (b"\xc1", "not a columnar message"),
        (b'[{"kind":"dcgm"}]', "not a columnar message"),
        (_wire(cv=2), "encoding version 2"),
        (_wire(n=3), "bytes for 3 rows"),
        (_wire(n=1 << 20), "rows (0..65536)"),
        (_wire(values=b"\0" * 7), "values: 7 bytes"),
        (_wire(fields=["DCGM_FI_DEV_GPU_TEMP"] * 8), "a field named twice"),
        (_wire(models=["H100"], model=np.array([0, 1], "<i4").tobytes()), "model: an index outside"),
        (_wire(uuids=["GPU-1"]), "1 uuids for 2 rows"),
        (_wire(fields=["f%d" % i for i in range(2000)]), "more than 1024 fields"),
    ],
)
def test_a_malformed_columnar_message_is_one_dead_letter(payload: bytes, says: str) -> None:
    d = Decoder().decode_many([payload], ["t[0]@9"], [True])
    assert len(d.records) == 0
    ((dead,),) = [d.dead]
    assert (dead.reason, dead.origin) == ("malformed_columns", "t[0]@9") and says in dead.detail


def test_an_unknown_columnar_version_header_is_unsupported() -> None:
    assert colwire.is_columnar([("Content-Type", b"application/x-gpuwarden-cols; v=9")]) is None
    d = Decoder().decode_many([_wire()], ["t[0]@1"], [None])
    assert [x.reason for x in d.dead] == ["unsupported_version"]


@settings(max_examples=fuzz_examples(300), deadline=None, database=None)
@given(st.binary(max_size=400), st.integers(0, 400), st.binary(max_size=8))
def test_any_bytes_under_the_columnar_header_never_raise(junk: bytes, at: int, patch: bytes) -> None:
    good = _wire()
    mutated = good[:at] + patch + good[at + len(patch) :]
    eng = Pipeline(Engine())
    for payload in (junk, mutated):
        out = eng.handle([Message("t", 0, 0, b"n1", payload, None, HEADERS)])
        assert all(d.reason in REASONS for d in out.dead)
        assert all(isinstance(msgspec.json.encode(d), bytes) for d in out.dead)
    eng.flush()


def test_columnar_dcgm_beside_json_nic_nccl_and_progress_records_gives_the_json_answer() -> None:
    from pipeline.schema import NcclRecord, NicRecord
    from tests.factories import progress

    def other(t: int) -> list:
        return [
            NicRecord(ts=T0 + t, host="n9", device="mlx5_0", port=1, state=1 if t > 20 else 4,
                      state_name="DOWN" if t > 20 else "ACTIVE", counters={"link_downed": t // 20}),
            NcclRecord(ts=T0 + t, host="n9", gpu=0, job="j1", comm="0x1", rank=0, nranks=8, coll="AllReduce",
                       bytes=1 << 30, exec_time_us=900.0 + t, busbw_gbs=350.0),
            progress(t, host="n9"),
        ]

    recs = fleet(range(40), hosts=2, gpus=4, overrides=lambda t, h, g: THROTTLED if (h, g) == ("n1", 1) else {})
    batches = [[r for r in recs if r.ts == T0 + t] + other(t) for t in range(40)]
    def run(encoding: str) -> EngineOutput:
        p = Pipeline(Engine())
        out = EngineOutput()
        for msgs in _messages(batches, encoding):
            out.extend(p.handle(msgs))
        out.extend(p.flush())
        return out

    cols = _messages(batches, COLUMNAR)
    assert {m.headers is None for msgs in cols for m in msgs} == {True, False}  # both encodings in each batch
    a, b = run(JSON), run(COLUMNAR)
    assert alert_rows(a) and alert_rows(a) == alert_rows(b)
    assert dead_rows(a) == dead_rows(b)


def test_a_forwarding_engine_forwards_every_row_of_a_batch_with_both_encodings() -> None:
    # Before: a batch holding columns and JSON records was ingested but forwarded nothing, so
    # the fleet stage's models never saw it (their alerts missing through `serve`).
    from pipeline.schema import NcclRecord

    recs = [sample(0, "n1", 0), sample(0, "n1", 1)]
    nccl = NcclRecord(ts=T0, host="n2", gpu=0, comm="0x1", rank=0, nranks=8, coll="AllReduce", bytes=1 << 30,
                      exec_time_us=900.0)
    msgs = _messages([recs + [nccl]], COLUMNAR)[0]
    assert sorted(m.headers is None for m in msgs) == [False, True]
    p = Pipeline(Engine(forwards=True))
    out = p.handle(msgs)
    assert sorted((r.host, getattr(r, "gpu", None)) for r in out.forwarded) == [("n1", 0), ("n1", 1), ("n2", 0)]
