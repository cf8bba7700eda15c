"""Columnar messages a hostile or broken producer writes (pipeline/colwire.py, docs/architecture.md §7).

The encoder writes only what it carries exactly; anyone who can write to the telemetry topic
can write anything else. So the arrays here are built by hand, past what ``encode_dcgm`` would
write (GPU indices, links and versions of any int64, NaN/Inf/-0/subnormal times and values),
and the JSON path is the reference: the same rows as JSON records give the same alerts and
dead letters.
"""

from __future__ import annotations

import gc
import json
import math
import random
import tracemalloc
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import colwire, rows
from pipeline.bus.base import Message
from pipeline import decode
from pipeline.decode import REASONS, Decoder
from pipeline.engine import Engine, EngineOutput
from pipeline.runner import Pipeline
from pipeline.schema import dcgm
from tests.factories import HEALTHY, T0, alert_rows, dead_rows, fuzz_examples, sample

PROP = settings(
    max_examples=fuzz_examples(100),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HEADERS = (("content-type", colwire.COLUMNAR_V1),)

# Valid UTF-8 only: msgpack cannot carry a lone surrogate (read() refuses it, see below).
HOSTS = st.one_of(st.sampled_from(["n0", "n1", "", "a b", "x\n", "\x1b[0m", "h" * 300, "é"]), st.text(max_size=6))
TS = st.one_of(
    st.integers(0, 30).map(lambda s: T0 + s),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.0e9 - 1, 1.0e9, 4.1e9, 4.1e9 + 1, T0 * 1000]),
)
GPUS = st.one_of(st.integers(0, 3), st.sampled_from([-1, 4095, 4096, 1 << 62, -(1 << 63), (1 << 63) - 1]))
LINKS = st.one_of(st.none(), st.sampled_from([0, 7, -1, 1023, 1024, (1 << 63) - 1, -(1 << 63) + 1]))
MODELS = st.one_of(st.none(), st.sampled_from(["H100", "H200", "", "x\n", "m" * 300]))
NAMES = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "not_a_dcgm_field",
    ]
)
VALUES = st.one_of(
    st.integers(0, 2000).map(float),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([-0.0, 5e-324, -5e-324, 2.0**47, 2.0**63, 1e300, -1e300]),
)
# No Inf here (test_inf_in_a_field_is_dropped_as_json_drops_it): Infinity is not JSON, so JSON
# meets it on its slow path, which names it in a dead letter while decoding, also in a field
# nobody reads or of a record the engine then refuses; the columns, as JSON's fast path does a
# negative value, leave a field nobody reads unlooked-at and screen the record first.
FIELDS = st.dictionaries(NAMES, VALUES, max_size=5)
LABELS = st.sampled_from([{}, {"job": "j1"}, {"job": "j2", "pod": "p"}])
ROW = st.fixed_dictionaries({"ts": TS, "gpu": GPUS, "link": LINKS, "model": MODELS, "labels": LABELS, "fields": FIELDS})
MESSAGE = st.fixed_dictionaries(
    {"host": HOSTS, "v": st.sampled_from([1, 1, 1, 2, 0, -(1 << 63), (1 << 63) - 1]), "rows": st.lists(ROW, max_size=6)}
)


def columnar(m: dict[str, Any]) -> bytes:
    """``m``'s rows as a columnar message built by hand (what encode_dcgm would refuse too)."""
    rs = m["rows"]
    n = len(rs)
    names = sorted({f for r in rs for f in r["fields"]})
    values = np.full((n, len(names)), np.nan)
    for i, r in enumerate(rs):
        for f, x in r["fields"].items():
            values[i, names.index(f)] = x
    models = sorted({r["model"] for r in rs if r["model"] is not None})
    labelsets = [dict(t) for t in sorted({tuple(sorted(r["labels"].items())) for r in rs if r["labels"]})]
    wire: dict[str, Any] = {
        "cv": 1,
        "v": m["v"],
        "host": m["host"],
        "n": n,
        "ts": np.array([r["ts"] for r in rs], "<f8").tobytes(),
        "gpu": np.array([r["gpu"] for r in rs], "<i8").tobytes(),
        "fields": names,
        "values": values.astype("<f8").tobytes(),
        "models": models,
        "model": np.array([models.index(r["model"]) if r["model"] is not None else -1 for r in rs], "<i4").tobytes(),
        "labels": labelsets,
        "label": np.array([labelsets.index(r["labels"]) if r["labels"] else -1 for r in rs], "<i4").tobytes(),
    }
    if any(r["link"] is not None for r in rs):
        wire["link"] = np.array([rows.NO_LINK if r["link"] is None else r["link"] for r in rs], "<i8").tobytes()
    return msgspec.msgpack.encode(wire)


def as_json(m: dict[str, Any]) -> bytes:
    """The same rows as a JSON array of records (json.dumps writes NaN/Infinity as a loose producer would)."""
    out = []
    for r in m["rows"]:
        rec: dict[str, Any] = {"kind": "dcgm", "v": m["v"], "ts": r["ts"], "host": m["host"], "gpu": r["gpu"]}
        for k in ("link", "model"):
            if r[k] is not None:
                rec[k] = r[k]
        rec["fields"], rec["labels"] = r["fields"], r["labels"]
        out.append(rec)
    return json.dumps(out).encode()


def _run(batches: list[list[dict]], cols: list[list[bool]], wall_clock: float | None) -> EngineOutput:
    """The batches through the decoder and an engine, each message columnar where ``cols`` says."""
    dec = Decoder(wall_clock=(lambda: wall_clock) if wall_clock is not None else None)
    p = Pipeline(Engine(), dec)
    out, off = EngineOutput(), 0
    for batch, col in zip(batches, cols):
        msgs = []
        for m, c in zip(batch, col):
            msgs.append(Message("t", 0, off, b"k", columnar(m) if c else as_json(m), None, HEADERS if c else None))
            off += 1
        out.extend(p.handle(msgs))
    out.extend(p.flush())
    return out




@PROP
@given(st.lists(st.lists(MESSAGE, min_size=1, max_size=3), min_size=1, max_size=3), st.booleans(), st.randoms())
def test_hand_built_columns_give_what_the_same_json_records_give(
    batches: list[list[dict]], live: bool, rnd: random.Random
) -> None:
    # Every message columnar, or each either way (a batch of both encodings), against all JSON.
    wall = T0 + 20 if live else None
    mixed = rnd.random() < 0.5
    a = _run(batches, [[False] * len(b) for b in batches], wall)
    b = _run(batches, [[not mixed or rnd.random() < 0.5 for _ in b] for b in batches], wall)
    assert alert_rows(a) == alert_rows(b)
    assert dead_rows(a) == dead_rows(b)


@pytest.mark.parametrize("value", [math.inf, -math.inf])
@pytest.mark.parametrize("name", ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_SM_CLOCK"])
def test_inf_in_a_field_is_dropped_as_json_drops_it(name: str, value: float) -> None:
    row = {"ts": T0, "gpu": 0, "link": None, "model": None, "labels": {}, "fields": {name: value, "x": 1.0}}
    other = {**row, "gpu": 1, "fields": {name: 50.0}}
    batches = [[{"host": "n1", "v": 1, "rows": [row, other]}]]
    a, b = _run(batches, [[False]], None), _run(batches, [[True]], None)
    assert [d[0] for d in dead_rows(a)] == ["nan_field"]
    assert dead_rows(a) == dead_rows(b)


# -- one message, one dead letter -------------------------------------------------------------


def _wire(**over: object) -> bytes:
    good = msgspec.msgpack.decode(colwire.encode_dcgm([sample(0, "n1", 0), sample(0, "n1", 1)]))
    return msgspec.msgpack.encode({**good, **over})


def _with_unknown_key(tail: bytes) -> bytes:
    """``_wire()`` with one more key, ``z``, whose msgpack value is ``tail`` (raw)."""
    good = msgspec.msgpack.decode(_wire())
    body = msgspec.msgpack.encode(good)
    assert 0x80 <= body[0] < 0x8F  # a fixmap with room for one more key
    return bytes([body[0] + 1]) + body[1:] + b"\xa1z" + tail


@pytest.mark.parametrize(
    "payload, says",
    [
        (b"", "truncated"),
        (_wire(host="nX").replace(b"\xa2nX", b"\xa2n\xff"), "UTF-8"),
        (_wire(host="nX").replace(b"\xa2nX", b"\xa2\xed\xa0"), "UTF-8"),  # a lone surrogate, CESU-8 style
        (_with_unknown_key(b"\xdd\xff\xff\xff\xff"), "truncated"),  # an array claiming 2^32 items
        (_with_unknown_key(b"\xc6\xff\xff\xff\xff"), "truncated"),  # bytes claiming 4 GiB
        (_with_unknown_key(b"\x91" * 100_000 + b"\xc0"), "recursion"),
        (_wire(v=(1 << 64) - 1), "schema version 18446744073709551615"),
        (_wire(v=1 << 63), "schema version 9223372036854775808"),
        (_wire(fields=["DCGM_FI_DEV_GPU_TEMP" + "x" * colwire.MAX_NAME], values=b"\0" * 16), "field name"),
    ],
)
def test_a_hostile_columnar_message_is_one_dead_letter(payload: bytes, says: str) -> None:
    p = Pipeline(Engine())
    out = p.handle([Message("t", 0, 9, b"n1", payload, None, HEADERS)])
    assert [(d.reason, d.origin) for d in out.dead] == [("malformed_columns", "t[0]@9")]
    assert says in out.dead[0].detail
    assert p.totals.records == 0


def test_a_version_past_int64_never_raises_in_a_batch_with_good_messages() -> None:
    # Before: the version column's int64 overflowed and the whole batch raised.
    msgs = [_wire(), _wire(v=(1 << 64) - 1), _wire(host="n2")]
    d = Decoder().decode_many(msgs, ["t[0]@0", "t[0]@1", "t[0]@2"], [True, True, True])
    assert [r.host for r in d.records] == ["n1", "n1", "n2", "n2"]
    assert [(x.reason, x.origin) for x in d.dead] == [("malformed_columns", "t[0]@1")]


def test_a_null_content_type_header_says_nothing_of_the_encoding() -> None:
    # A Kafka header's value is nullable (kafka-python hands None); before, it raised TypeError.
    assert colwire.is_columnar([("content-type", None)]) is False
    assert colwire.is_columnar([("content-type", None), ("content-type", colwire.COLUMNAR_V1)]) is True
    value = msgspec.json.encode([sample(0, "n1", 0)])
    out = Pipeline(Engine()).handle([Message("t", 0, 0, b"n1", value, None, (("content-type", None),))])
    assert out.dead == []


@pytest.mark.parametrize(
    "name, carried",
    [("DCGM_FI_" + "x" * (colwire.MAX_NAME - 8), True), ("DCGM_FI_" + "x" * (colwire.MAX_NAME - 7), False), (7, False)],
)
def test_a_field_name_the_reader_refuses_goes_as_json(name: Any, carried: bool) -> None:
    rec = {"kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "fields": {name: 1}}
    assert (colwire.encode_dcgm([rec]) is not None) is carried
    if carried:
        assert Decoder().decode_many([colwire.encode_dcgm([rec])], ["t[0]@0"], [True]).dead == []


def test_a_columnar_message_of_long_field_names_is_not_kept() -> None:
    # The field list is cached by layout (a producer sends the same one every time): 1,024 names
    # of 8 KiB each would have kept 8 MiB per hostile message alive, 256 messages' worth.
    good = msgspec.msgpack.decode(colwire.encode_dcgm([sample(0, "n1", 0)]))
    msgs = [
        msgspec.msgpack.encode({**good, "fields": [f"{i}.{j}." + "x" * 1000 for j in range(1024)], "values": b"\0" * 8192})
        for i in range(8)
    ]
    dec = Decoder(fields=("DCGM_FI_DEV_GPU_TEMP",))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reasons = [x.reason for i, m in enumerate(msgs) for x in dec.decode_many([m], [f"t[0]@{i}"], [True]).dead]
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"{kept} bytes kept after 8 messages of {len(msgs[0])} bytes"
    assert reasons == ["malformed_columns"] * 8


@PROP
@given(st.binary(max_size=64), st.sampled_from([None, b"", b"application/x-gpuwarden-cols", colwire.COLUMNAR_V1]))
def test_any_header_value_decodes_without_raising(payload: bytes, ctype: bytes | None) -> None:
    out = Pipeline(Engine()).handle([Message("t", 0, 0, b"k", payload, None, (("Content-Type", ctype),))])
    assert all(d.reason in REASONS for d in out.dead)


def test_the_names_a_decoder_remembers_stay_bounded_on_the_columnar_path(monkeypatch) -> None:
    # The JSON path forgets its valid names past MAX_KNOWN_NAMES; the columns' host and model
    # checks kept every one (300 messages of a new host and 4,096 models: 1.2 M names held).
    monkeypatch.setattr(decode, "MAX_KNOWN_NAMES", 500, raising=False)
    dec = Decoder()
    for i in range(40):
        recs = [dcgm(T0, f"h{i}", g, HEALTHY, model=f"m{i}.{g}") for g in range(64)]
        d = dec.decode_many([colwire.encode_dcgm(recs)], [f"t[0]@{i}"], [True])
        assert len(d.records) == 64 and d.dead == []
    assert len(dec._ok_names) + len(dec._ok_hosts) <= 500 + 65
