"""The forwarded records' columns (pipeline/service/forwarded.py): what the fleet stage builds from
them is what it decoded from the JSON array of earlier builds, field for field, and their sort
columns give the canonical order of ``record_identity`` (pipeline/canonical.py)."""

from __future__ import annotations

import math

import msgspec
import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from msgspec.structs import astuple

from pipeline.schema import DcgmJobLabels, NcclRecord, ProgressRecord, dcgm, dcgm_record_type
from pipeline.service.forwarded import Builder, Columns, Decoded, Encoder
from pipeline.canonical import SortColumns, canonical_order
from pipeline.fleetstage import FleetStage, records_decoder
from tests.factories import T0, canonical_reference, fuzz_examples

# What a fleet engine with models reads, both spellings (Engine.decode_fields).
FIELDS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
          "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS")
_value = st.one_of(st.integers(0, 2**40), st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0, 1, 71.5, 2**53 + 1]))
_dcgm = st.builds(
    lambda t, h, g, link, model, labels, fields: dcgm(T0 + t, h, g, fields, link=link, model=model, labels=labels),
    st.sampled_from([0.0, 0.5, 1.0, 7.25]),
    st.sampled_from(["n1", "n10", "n2", "a"]),
    st.integers(0, 3),
    st.none() | st.integers(0, 2),
    st.none() | st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]),
    st.sampled_from([{}, {"job": "train-1"}, {"job": "7", "pod": "p", "namespace": "ns", "other": "x"},
                     {"hpc_job": "42"}]),
    st.dictionaries(st.sampled_from(["gpu_temp", "power", "sm_clock", "memory_temp", "xid"]), _value, max_size=5),
)
_nccl = st.builds(
    lambda t, h, g, comm, rank, coll, seq: NcclRecord(
        ts=T0 + t, host=h, gpu=g, comm=comm, rank=rank, nranks=8, coll=coll, seq=seq, bytes=1 << 20,
        exec_time_us=100.0, labels={"job": "j"}),
    st.sampled_from([0.0, 1.0, 7.25]),
    st.sampled_from(["n1", "n3", "a"]),
    st.none() | st.integers(0, 3),
    st.sampled_from(["0x1", "0xab", "", "z"]),
    st.integers(0, 7),
    st.sampled_from(["AllReduce", "AllGather", ""]),
    st.none() | st.integers(0, 3),
)
_progress = st.builds(
    lambda t, h, rank, state: ProgressRecord(ts=T0 + t, host=h, job="j", rank=rank, comm="0", source="watchdog",
                                             state=state, last_enqueued=5, last_completed=4),
    st.sampled_from([0.0, 1.0]),
    st.sampled_from(["n1", "b"]),
    st.integers(0, 3),
    st.sampled_from(["progress", "timeout"]),
)
_records = st.lists(_dcgm | _nccl | _progress, max_size=30)


def _through_columns(records: list, fields: tuple[str, ...] = FIELDS) -> tuple[list, np.ndarray, SortColumns]:
    body = Encoder(fields).encode(records)
    d = Decoded(msgspec.msgpack.decode(body, type=Columns))
    recs, cols = Builder(fields).build(d, np.ones(d.n, bool), np.ones(len(d.other), bool))
    return recs, np.array([r.ts for r in recs]), cols


def _plain(r: object) -> tuple:
    """A record's values, numbers as doubles and NaN as None, for a comparison across decoders."""
    def one(v: object) -> object:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return None if math.isnan(v) else float(v)
        if isinstance(v, msgspec.Struct):
            return tuple(one(x) for x in astuple(v))
        return v
    return (type(r).__name__.replace("Subset", ""), *(one(v) for v in astuple(r)))


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(_records)
def test_the_columns_build_what_the_json_array_decoded(records):
    got, _, _ = _through_columns(records)
    want = records_decoder(FIELDS)(msgspec.json.encode(records))
    # The columns carry the DCGM records first, then the NCCL and progress records.
    want = [r for r in want if not isinstance(r, (NcclRecord, ProgressRecord))] + [
        r for r in want if isinstance(r, (NcclRecord, ProgressRecord))]
    assert [_plain(r) for r in got] == [_plain(r) for r in want]
    assert all(type(r) is dcgm_record_type(FIELDS) for r in got[: sum(1 for r in want if hasattr(r, "fields"))])


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(_records, st.data())
def test_the_sort_columns_of_the_wire_give_the_record_by_record_order(records, data):
    if records:  # repeats: what an upstream replay forwards again
        records = records + data.draw(st.lists(st.sampled_from(records), max_size=10))
    recs, ts, cols = _through_columns(records)
    order, dropped = canonical_order(recs, ts, cols)
    want = canonical_reference(recs)
    assert order == want and dropped == len(recs) - len(want)
    assert canonical_order(recs, ts) == (order, dropped)


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(st.lists(_records, min_size=1, max_size=4))
def test_a_stage_fed_columns_releases_what_one_fed_records_releases(batches):
    # Each message its own host table: the stage ranks the hosts of all it releases together.
    def released(columns: bool) -> list:
        got: list = []
        stage = FleetStage(lambda: _Recorder(got))
        for recs in batches:
            if columns:
                built, ts, cols = _through_columns(recs)
                stage.feed(built, ts=ts, cols=cols)
            else:
                stage.feed(records_decoder(FIELDS)(msgspec.json.encode(recs)))
        stage.flush()
        return _by_kind(got)

    assert released(True) == released(False)


def _by_kind(recs: list) -> tuple[list, list]:
    """The DCGM records, then the others, each in the order given: the columns hand an engine a
    batch's DCGM rows and its other records apart (pipeline/rows.py, ``Combined``), each part in
    canonical order, which is all the engine reads of the order (ingest keeps them apart)."""
    dcgm = [_plain(r) for r in recs if hasattr(r, "fields")]
    return dcgm, [_plain(r) for r in recs if not hasattr(r, "fields")]


class _Recorder:
    """An engine that keeps what it is fed, in order."""

    def __init__(self, got: list) -> None:
        self.got, self.released, self.pending = got, -math.inf, 0

    def process(self, records: list):
        from pipeline.engine import EngineOutput

        self.got.extend(records)
        return EngineOutput()

    def advance_to(self, upto: float):
        from pipeline.engine import EngineOutput

        return EngineOutput()

    def flush(self):
        from pipeline.engine import EngineOutput

        return EngineOutput()


def test_a_message_carries_only_the_fields_its_records_report():
    recs = [dcgm(T0, "n1", g, {"gpu_temp": 60 + g}) for g in range(4)]
    cols = msgspec.msgpack.decode(Encoder(FIELDS).encode(recs), type=Columns)
    assert cols.fields == ["DCGM_FI_DEV_GPU_TEMP"] and cols.hosts == ["n1"]
    assert np.frombuffer(cols.values, "<f8").tolist() == [60.0, 61.0, 62.0, 63.0]


def test_job_labels_travel_as_a_table():
    recs = [dcgm(T0, "n1", g, {}, labels={"job": "a" if g % 2 else "b", "pod": "p", "rack": "r1"}) for g in range(6)]
    cols = msgspec.msgpack.decode(Encoder(FIELDS).encode(recs), type=Columns)
    assert cols.labels == [DcgmJobLabels(job="b", pod="p"), DcgmJobLabels(job="a", pod="p")]
    assert np.frombuffer(cols.label, "<u4").tolist() == [0, 1, 0, 1, 0, 1]


def test_a_message_of_fields_the_engine_does_not_read_builds_records_without_values():
    # Each slot then reads a shared NaN: a map over those alone would never end.
    body = Encoder(("DCGM_FI_DEV_XID_ERRORS",)).encode([dcgm(T0, "n1", 0, {"xid": 79})])
    d = Decoded(msgspec.msgpack.decode(body, type=Columns))
    recs, _ = Builder(FIELDS).build(d, np.ones(1, bool), np.ones(0, bool))
    assert len(recs) == 1 and all(math.isnan(v) for v in astuple(recs[0].fields))


def test_records_built_with_gaps_encode_as_the_json_decoder_built_them():
    # A field one record of the message lacks is its slot's default: left out of the JSON a
    # snapshot buffers, where a NaN of its own was written as null and failed the restore.
    recs = [dcgm(T0, "n1", 0, {"gpu_temp": 60}), dcgm(T0, "n1", 1, {"power": 300})]
    built, _, _ = _through_columns(recs)
    assert msgspec.json.encode(list(built)) == msgspec.json.encode(records_decoder(FIELDS)(msgspec.json.encode(recs)))
    stage = FleetStage(lambda: _Recorder([]))
    stage.feed(built)
    again = FleetStage(lambda: _Recorder([]))
    again.restore(stage.snapshot(), records_decoder(FIELDS))
    assert again.pending == 2


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(st.lists(_dcgm, min_size=1, max_size=20), st.lists(_nccl, max_size=4), st.data())
def test_columnar_telemetry_forwards_the_body_its_records_would(dcgm_recs, nccl_recs, data):
    # A columnar producer's rows reach the host stage as columns (pipeline/rows.py) and are
    # forwarded as they are: the same DCGM rows, in the same order, as the records the JSON
    # decoder makes of them. Some hosts' messages stay JSON, as one holding NCCL records does.
    from pipeline import colwire
    from pipeline.decode import Decoder

    by_host: dict[str, list] = {}
    for r in dcgm_recs:
        by_host.setdefault(r.host, []).append(r)
    groups = list(by_host.values())
    col_msgs = [colwire.encode_dcgm(rs) for rs in groups]
    assume(all(m is not None for m in col_msgs))
    as_json = data.draw(st.lists(st.booleans(), min_size=len(groups), max_size=len(groups)))
    json_msgs = [msgspec.json.encode(rs) for rs in groups]
    tail = [msgspec.json.encode(nccl_recs)] if nccl_recs else []

    def forwarded(payloads: list, columnar: list) -> Columns:
        dec = Decoder()
        dec.set_fields(FIELDS)
        got = dec.decode_many(payloads, [f"m{i}" for i in range(len(payloads))], columnar)
        return msgspec.msgpack.decode(Encoder(FIELDS).encode(got.records), type=Columns)

    # The decoder puts a batch's columnar rows before its JSON messages' records.
    order = [i for i, j in enumerate(as_json) if not j] + [i for i, j in enumerate(as_json) if j]
    mixed = [json_msgs[i] if as_json[i] else col_msgs[i] for i in order]
    cols = forwarded(mixed + tail, [not as_json[i] for i in order] + [False] * len(tail))
    recs = forwarded([json_msgs[i] for i in order] + tail, [False] * (len(order) + len(tail)))
    assert msgspec.structs.asdict(cols) == msgspec.structs.asdict(recs)
