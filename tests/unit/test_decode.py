import json

import numpy as np
import pytest

from pipeline.bus.base import Message
from pipeline.decode import Decoder, Origins
from pipeline.engine import Engine
from pipeline.runner import Pipeline, _Origins
from pipeline.schema import DcgmRecord, NcclRecord

TS = 1764403200.0


def rec(**kw):
    base = {"v": 1, "kind": "dcgm", "ts": TS, "host": "n1", "gpu": 0, "fields": {"DCGM_FI_DEV_GPU_TEMP": 70}}
    base.update(kw)
    return base


def nccl(**kw):
    base = {"v": 1, "kind": "nccl", "ts": TS, "host": "n1", "gpu": 0, "comm": "0xabc", "rank": 0, "nranks": 8,
            "coll": "AllReduce", "bytes": 1 << 30, "exec_time_us": 4040.0, "busbw_gbs": 465.1}
    base.update(kw)
    return base


def dec(payload, origin="t[0]@7"):
    return Decoder().decode(payload if isinstance(payload, bytes) else payload.encode(), origin)


def test_good_records_single_and_batched():
    out = dec(json.dumps([rec(gpu=0), rec(gpu=1), nccl()]))
    # The fast path's checked types are subclasses of the contract's.
    assert len(out.records) == 3
    assert all(isinstance(r, t) for r, t in zip(out.records, [DcgmRecord, DcgmRecord, NcclRecord]))
    assert out.origins == ["t[0]@7#0", "t[0]@7#1", "t[0]@7#2"]
    assert out.dead == []
    assert out.records[0].fields.DCGM_FI_DEV_GPU_TEMP == 70.0


@pytest.mark.parametrize("payload, reason", [
    ('{"kind": "dcgm", "ts": 17', "malformed_json"),
    (json.dumps(rec(ts="yesterday")), "wrong_type"),
    (json.dumps(rec(gpu="three")), "wrong_type"),
    (json.dumps({k: v for k, v in rec().items() if k != "host"}), "missing_key"),
    (json.dumps(rec(kind="smart")), "unknown_kind"),
    # A kind that is a JSON array or object raised TypeError in the decoder (an `internal` dead letter).
    (json.dumps(rec(kind=[])), "wrong_type"),
    (json.dumps(rec(kind={"a": 1})), "wrong_type"),
    (json.dumps([rec(kind=["dcgm"])]), "wrong_type"),
    ('{"v":1,"kind":"dcgm","ts":NaN,"host":"n1","gpu":0}', "nan_value"),
    (json.dumps(rec(ts=TS * 1000)), "ts_out_of_range"),
    (json.dumps(rec(ts=12.0)), "ts_out_of_range"),
    (json.dumps(rec(v=2)), "unsupported_version"),
    (json.dumps(rec(gpu=-1)), "negative_value"),
    (json.dumps(nccl(rank=9)), "wrong_type"),
    (json.dumps(nccl(busbw_gbs=-3.0)), "negative_value"),
    ("[1, 2]", "wrong_type"),
])
def test_each_problem_has_its_reason_and_origin(payload, reason):
    out = dec(payload)
    assert out.records == []
    assert [d.reason for d in out.dead][:1] == [reason]
    assert out.dead[0].origin.startswith("t[0]@7")
    assert out.dead[0].raw


def test_one_poison_record_does_not_cost_its_neighbours():
    msg = json.dumps([rec(gpu=0), rec(gpu=1, ts="x"), rec(gpu=2)])
    out = dec(msg)
    assert [r.gpu for r in out.records] == [0, 2]
    assert out.origins == ["t[0]@7#0", "t[0]@7#2"]
    assert [(d.reason, d.origin) for d in out.dead] == [("wrong_type", "t[0]@7#1")]


def test_bad_fields_are_dropped_and_the_record_kept():
    msg = ('{"v":1,"kind":"dcgm","ts":%r,"host":"n1","gpu":0,"fields":{"DCGM_FI_DEV_GPU_TEMP":NaN,'
           '"DCGM_FI_DEV_SM_CLOCK":"<<<blank>>>","DCGM_FI_DEV_POWER_USAGE":300.5,"DCGM_FI_DEV_GPU_UTIL":"97"}}' % TS)
    out = dec(msg)
    assert len(out.records) == 1
    f = out.records[0].fields
    assert f.DCGM_FI_DEV_POWER_USAGE == 300.5 and f.DCGM_FI_DEV_GPU_UTIL == 97.0
    assert f.DCGM_FI_DEV_GPU_TEMP != f.DCGM_FI_DEV_GPU_TEMP  # NaN: not reported
    got = {(d.reason, tuple(d.fields), d.action) for d in out.dead}
    assert got == {("nan_field", ("DCGM_FI_DEV_GPU_TEMP",), "fields_dropped"),
                   ("blank_sentinel", ("DCGM_FI_DEV_SM_CLOCK",), "fields_dropped")}


HUGE = 10 ** 400   # a JSON integer no double can hold


def _huge(gpu, huge):
    return json.dumps(rec(gpu=gpu, fields={"DCGM_FI_DEV_GPU_TEMP": huge, "DCGM_FI_DEV_SM_CLOCK": 1980})).encode()


@pytest.mark.parametrize("huge", [HUGE, -HUGE], ids=["huge", "minus_huge"])
def test_an_integer_field_beyond_a_double_is_dropped_and_the_record_kept(huge):
    # The plain decoder's float slots refuse it, so it meets it in its slow path: that field is
    # a NaN/Inf dead letter, the rest of the record is used.
    out = Decoder().decode(_huge(3, huge), "t[0]@7")
    assert [(x.reason, x.fields, x.origin) for x in out.dead] == [("nan_field", ["DCGM_FI_DEV_GPU_TEMP"], "t[0]@7")]
    assert out.records[0].fields.DCGM_FI_DEV_SM_CLOCK == 1980


@pytest.mark.parametrize("huge", [HUGE, -HUGE], ids=["huge", "minus_huge"])
def test_an_integer_field_beyond_a_double_is_dropped_by_the_engines_decoder_too(huge):
    # The engine's decoder keeps integers as integers (schema.dcgm_fields_type), so it reaches
    # the columnizer: the same one dead letter, and both records are taken in.
    p = Pipeline(Engine())
    ok = json.dumps(rec(gpu=4, fields={"DCGM_FI_DEV_GPU_TEMP": 71, "DCGM_FI_DEV_SM_CLOCK": 1980})).encode()
    out = p.handle([Message("t", 0, 7, None, _huge(3, huge)), Message("t", 0, 8, None, ok)])
    assert "DCGM_FI_DEV_GPU_TEMP" in p.decoder.fields   # decoded by the engine's own decoder
    assert [(x.reason, x.fields, x.origin) for x in out.dead] == [("nan_field", ["DCGM_FI_DEV_GPU_TEMP"], "t[0]@7")]
    assert p.totals.records == 2


def test_integer_and_float_spellings_of_a_value_read_the_same():
    # The engine's decoder keeps a JSON integer as an int (fewer objects made): the value
    # matrix must not see a difference between 71 and 71.0, nor between small and large ints.
    from pipeline.engine.frame import Columnizer
    from pipeline.catalog import FIELDS
    names = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_VIOLATION")
    cz = Columnizer([FIELDS.resolve(n).column for n in names])
    d = Decoder(fields=cz.names)
    as_int = d.decode(json.dumps(rec(fields={names[0]: 71, names[1]: 272438275669})).encode(), "a").records
    as_float = d.decode(json.dumps(rec(fields={names[0]: 71.0, names[1]: 272438275669.0})).encode(), "b").records
    assert type(as_int[0].fields.DCGM_FI_DEV_GPU_TEMP) is int
    np.testing.assert_array_equal(cz.compact(as_int, ["a"])[0], cz.compact(as_float, ["b"])[0])
    assert cz.compact(as_int, ["a"])[0].tolist() == [[71.0, 272438275669.0]]


def test_wall_clock_bound_only_when_asked():
    far = json.dumps(rec(ts=TS + 3600))
    assert Decoder().decode(far.encode(), "x").records
    live = Decoder(wall_clock=lambda: TS, max_future_s=60)
    assert live.decode(far.encode(), "x").dead[0].reason == "ts_out_of_range"
    old = json.dumps(rec(ts=TS - 30 * 86400))
    assert live.decode(old.encode(), "x").dead[0].reason == "ts_out_of_range"


def test_oversized_message():
    out = Decoder(max_message_bytes=100).decode(json.dumps([rec()] * 10).encode(), "x")
    assert out.dead[0].reason == "too_large" and not out.records


def test_unknown_fields_are_ignored_not_fatal():
    out = dec(json.dumps(rec(fields={"DCGM_FI_DEV_GPU_TEMP": 70, "DCGM_FI_SOMETHING_NEW": 5})))
    assert out.records and not out.dead


GOOD = [json.dumps([rec(gpu=0), rec(gpu=1), nccl()]), json.dumps(rec(host="n2")), json.dumps(nccl(rank=3))]
BAD = [
    "",                                                   # empty message
    "{not json",                                          # malformed
    json.dumps(rec()) + "," + json.dumps(rec(gpu=5)),     # two values in one message
    "[" + json.dumps(rec(gpu=6)),                         # half an array ...
    json.dumps(rec(gpu=7)) + "]",                         # ... and the other half
    json.dumps([rec(gpu=-1), rec(gpu=2)]),                # one implausible record among good ones
    json.dumps(rec(ts=TS * 1000)),                        # milliseconds
    json.dumps(nccl(rank=9)),                             # rank >= nranks
    json.dumps([rec(v=2)]),
    "   " + json.dumps(rec(gpu=3)) + "\n",                # whitespace around is fine
]


def _flat(out):
    return ([json.loads(__import__("msgspec").json.encode(r)) for r in out.records], out.origins,
            [(d.reason, d.origin) for d in out.dead])


@pytest.mark.parametrize("bad", [None, *BAD])
def test_decode_many_equals_decode_per_message(bad):
    # The batch's fast path must never let one message's bytes change how another is read:
    # same records, origins and dead letters as decoding each message alone.
    payloads = GOOD + ([] if bad is None else [bad]) + GOOD[:1]
    payloads = [p.encode() for p in payloads]
    origins = [f"t[0]@{i}" for i in range(len(payloads))]
    for d in (Decoder(), Decoder(fields=("DCGM_FI_DEV_GPU_TEMP",))):
        one_by_one = [d.decode(p, o) for p, o in zip(payloads, origins)]
        expected = ([json.loads(__import__("msgspec").json.encode(r)) for x in one_by_one for r in x.records],
                    [o for x in one_by_one for o in x.origins],
                    [(dl.reason, dl.origin) for x in one_by_one for dl in x.dead])
        assert _flat(d.decode_many(payloads, origins)) == expected


@pytest.mark.parametrize("bad", [nccl(rank=8), nccl(rank=-1), nccl(nranks=0), nccl(exec_time_us=-1.0),
                                 nccl(rank=2 ** 63 + 5, nranks=2 ** 64 - 1), nccl(seq=2 ** 64 - 1), nccl(seq=-1),
                                 nccl(busbw_gbs=-2.0), nccl(algbw_gbs=1e999), nccl(busbw_gbs=None, algbw_gbs=None)])
def test_decode_many_judges_nccl_records_like_decode(bad):
    payloads = [json.dumps([rec(gpu=0), nccl(rank=1)]).encode(), json.dumps([nccl(rank=2), bad]).encode()]
    origins = ["a", "b"]
    d = Decoder()
    one_by_one = [d.decode(p, o) for p, o in zip(payloads, origins)]
    many = d.decode_many(payloads, origins)
    assert [(x.reason, x.origin) for x in many.dead] == [(x.reason, x.origin) for o in one_by_one for x in o.dead]
    assert many.origins == [o for x in one_by_one for o in x.origins]


def test_a_message_without_a_value_is_a_dead_letter_not_a_crash():
    # A tombstone (null value) on the telemetry topic must not stop the service.
    d = Decoder()
    out = d.decode_many([json.dumps(rec()).encode(), None], ["t[0]@1", "t[0]@2"])
    assert len(out.records) == 1 and [(x.reason, x.origin) for x in out.dead] == [("wrong_type", "t[0]@2")]


def test_origins_of_the_fast_path_are_spelled_only_when_read_and_name_the_right_record():
    # Through the whole pipeline: a batch mixing bare records, arrays, NCCL records and a
    # blank sentinel; the dead letter must name the very record, as decode() would.
    blank = rec(gpu=2, fields={"DCGM_FI_DEV_GPU_TEMP": 2 ** 63})
    payloads = [json.dumps(rec(gpu=0)), json.dumps([nccl(rank=1), rec(gpu=1), blank]), json.dumps([])]
    msgs = [Message("t", 0, 7 + i, None, p.encode()) for i, p in enumerate(payloads)]
    d = Decoder().decode_many([m.value for m in msgs], [m.origin for m in msgs])
    assert isinstance(d.origins, Origins)
    assert list(d.origins) == ["t[0]@7", "t[0]@8#0", "t[0]@8#1", "t[0]@8#2"]
    assert list(d.origins.take(np.array([3, 0]))) == ["t[0]@8#2", "t[0]@7"]
    assert list(_Origins(msgs)) == ["t[0]@7", "t[0]@8", "t[0]@9"] and _Origins(msgs)[1:] == ["t[0]@8", "t[0]@9"]
    out = Pipeline(Engine()).handle(msgs)
    assert [(x.reason, x.origin, x.action) for x in out.dead] == [("blank_sentinel", "t[0]@8#2", "fields_dropped")]


@pytest.mark.parametrize("size, reason", [(-5, "negative_value"), (2**63, "out_of_range")])
def test_an_nccl_message_size_is_a_non_negative_int64(size, reason):
    # bytes was not checked: -5 was a record, and 2**63 one no int64 column carries.
    for payload in (json.dumps(nccl(bytes=size)), json.dumps([nccl(bytes=size), nccl()])):
        out = dec(payload)
        assert [d.reason for d in out.dead] == [reason] and len(out.records) == payload.count("{") - 1
