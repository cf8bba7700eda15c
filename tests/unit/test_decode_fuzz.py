"""Fuzzing the decoder and the engine behind it (issue 18): any bytes give records and dead
letters, never an exception; every dead letter has a known reason and encodes as UTF-8 JSON;
every record that gets through can be ingested, snapshot and written out.

``GPUWARDEN_FUZZ_EXAMPLES`` examples per test (300 by default: a few seconds in `make test`).
A longer hunt::

    GPUWARDEN_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/unit/test_decode_fuzz.py -p no:cacheprovider
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.decode import REASONS, Decoder
from pipeline.engine import Engine
from pipeline.schema import encode
from tests.factories import T0

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

HOSTILE_INTS = st.one_of(st.integers(-10, 20), st.sampled_from([2 ** 31, 2 ** 32, 2 ** 63, -2 ** 63, 10 ** 30, -2000]))
HOSTILE_STRS = st.one_of(st.sampled_from(["n0", "n1", "", "n\ud800", "a b", "x\n", "h" * 300, "\x1b[0m"]),
                         st.text(max_size=12))
HOSTILE_TS = st.one_of(st.floats(T0 - 100, T0 + 100), st.sampled_from([T0 + 3600, T0 + 2.2e9, 1.0e9 + 5, 0.0,
                                                                         float("nan"), float("inf"), 1e400]),
                       st.integers(-10, 2 ** 64).map(float))
VALUES = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from(["<<<blank>>>", "71", "x", None, True]), st.lists(st.integers(), max_size=2))
FIELDS = st.dictionaries(st.sampled_from(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS",
                                          "DCGM_FI_DEV_SM_CLOCK", "bogus"]), VALUES, max_size=4)
DCGM = st.fixed_dictionaries({"kind": st.just("dcgm"), "ts": HOSTILE_TS, "host": HOSTILE_STRS, "gpu": HOSTILE_INTS},
                             optional={"v": st.sampled_from([1, 2]), "fields": FIELDS, "model": HOSTILE_STRS,
                                       "link": HOSTILE_INTS})
NCCL = st.fixed_dictionaries({"kind": st.just("nccl"), "ts": HOSTILE_TS, "host": HOSTILE_STRS, "comm": HOSTILE_STRS,
                              "rank": HOSTILE_INTS, "nranks": HOSTILE_INTS, "coll": HOSTILE_STRS,
                              "bytes": HOSTILE_INTS, "exec_time_us": st.floats(allow_nan=True)},
                             optional={"gpu": HOSTILE_INTS, "job": HOSTILE_STRS, "busbw_gbs": st.floats()})
NIC = st.fixed_dictionaries({"kind": st.just("nic"), "ts": HOSTILE_TS, "host": HOSTILE_STRS, "device": HOSTILE_STRS,
                             "port": HOSTILE_INTS},
                            optional={"state": HOSTILE_INTS, "phys_state": HOSTILE_INTS, "netdev": HOSTILE_STRS,
                                      "link_layer": HOSTILE_STRS, "rate_gbps": VALUES,
                                      "counters": st.dictionaries(HOSTILE_STRS, VALUES, max_size=4),
                                      "gpus": st.lists(HOSTILE_INTS, max_size=3)})
RECORD = st.one_of(DCGM, NCCL, NIC)


def _dump(obj: object) -> bytes:
    # json.dumps writes NaN/Infinity and lone surrogates as escapes, as a loose producer would.
    return json.dumps(obj).encode()


def _nested(depth: int) -> bytes:
    return b'{"kind":"dcgm","ts":%d,"host":"n0","gpu":0,"x":' % T0 + b"[" * depth + b"]" * depth + b"}"


MESSAGE = st.one_of(
    RECORD.map(_dump),
    st.lists(RECORD, min_size=1, max_size=4).map(_dump),
    st.binary(max_size=64),
    st.integers(1, 3000).map(_nested),
    st.builds(lambda r, cut: _dump(r)[:cut], RECORD, st.integers(0, 60)),
)


def _check(decoded, engine: Engine) -> None:
    for d in decoded.dead:
        assert d.reason in REASONS
        encode(d).decode("utf-8")          # a writer of the DLQ can always write it
    out = engine.process(decoded.records, decoded.origins)
    for d in out.dead:
        assert d.reason in REASONS
        encode(d).decode("utf-8")
    for a in out.alerts:
        encode(a).decode("utf-8")


@FUZZ
@given(st.lists(MESSAGE, min_size=1, max_size=6))
def test_any_batch_of_messages_decodes_and_ingests_without_raising(messages: list[bytes]) -> None:
    dec = Decoder()
    engine = Engine()
    origins = [f"f:{i + 1}" for i in range(len(messages))]
    many = dec.decode_many(messages, origins)
    one = [dec.decode(m, o) for m, o in zip(messages, origins)]
    # The batch path and the per-message path agree record for record.
    assert [encode(r) for r in many.records] == [encode(r) for d in one for r in d.records]
    assert sorted(d.reason for d in many.dead) == sorted(d.reason for d in one for d in d.dead)
    _check(many, engine)
    engine.flush()
    Engine().restore(engine.snapshot())


@FUZZ
@given(st.lists(MESSAGE, min_size=1, max_size=6))
def test_the_live_decoder_never_raises_either(messages: list[bytes]) -> None:
    dec = Decoder(wall_clock=lambda: T0 + 50)
    _check(dec.decode_many(messages, [f"t[0]@{i}" for i in range(len(messages))]), Engine())
