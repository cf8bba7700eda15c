"""NCCL Inspector values the plugin can write (or a hostile file can hold) that the decoder
refuses: each is left out and counted, so the operation's timing reaches the pipeline.

The plugin writes ``coll_sn``/``nnodes``/``dump_timestamp_us`` with jsonUint64 (up to 2**64-1)
and names with jsonStr (up to 2,047 bytes) (NVIDIA/nccl plugins/profiler/inspector/
inspector_json.cc and json.cc at 5067397c); the decoder's bounds are pipeline/recordchecks.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pipeline.decode import Decoder
from producers.nccl_inspector import InspectorFollower, InspectorStats, parse_operation, parse_prom

SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "nccl_inspector_sample.jsonl"
T = 1764403200.0


def first_line() -> dict:
    return json.loads(SAMPLE.read_text().splitlines()[0])


def decodes(rec) -> bool:
    out = Decoder().decode(msgspec.json.encode(rec), "t:1")
    return len(out.records) == 1 and not out.dead


@pytest.mark.parametrize(
    "where,key,value",
    [
        ("coll_perf", "coll_sn", 2**63 + 5),  # a uint64 past int64
        ("coll_perf", "coll_sn", True),
        ("header", "nnodes", 0),
        ("header", "nnodes", 2**40),
        ("metadata", "dump_timestamp_us", 10**18),  # the year 33658
        ("header", "comm_name", "x" * 300),
        ("header", "comm_name", "tab\there"),
        ("metadata", "hostname", "h" * 300),
        ("metadata", "hostname", ["n1"]),
        ("metadata", "hostname", "node 7"),  # a host name holds no space (recordchecks.bad_host)
    ],
)
def test_a_field_the_decoder_refuses_is_left_out_and_the_operation_kept(where, key, value):
    # Before: the record carried the value, and the decoder dead-lettered the whole operation.
    obj = first_line()
    obj[where][key] = value
    r = parse_operation(obj)
    assert not isinstance(r, str) and r.exec_time_us == 61974 and r.bytes == 17179869184 and decodes(r)
    assert r.nnodes in (None, 1) and r.host in ("example-hostname", "unknown") and r.seq in (None, 1407)
    st = InspectorStats()
    parse_operation(obj, stats=st)
    assert st.bad_values == 1


def test_a_communicator_or_rank_past_the_decoders_bounds_is_counted_here():
    # Before: a rank of True read as rank 1, n_ranks of 2**40 passed: dead letters downstream.
    for hdr in ({"rank": True, "n_ranks": 8}, {"rank": 2, "n_ranks": 2**40}):
        obj = first_line()
        obj["header"].update(hdr)
        assert parse_operation(obj) == "bad_rank"
    obj = first_line()
    obj["header"]["id"] = "0x" + "f" * 400
    assert parse_operation(obj) == "bad_id"


def test_the_follower_counts_left_out_values_in_its_summary(tmp_path):
    obj = first_line()
    obj["coll_perf"]["coll_sn"] = 2**63 + 5
    (tmp_path / "h-pid1.log").write_text(json.dumps(obj) + "\n")
    f = InspectorFollower(tmp_path, aggregate_ops=False)
    [r] = f.poll()
    assert r.seq is None and decodes(r) and f.summary()["dropped.bad_value"] == 1


def test_prometheus_values_the_decoder_refuses_are_left_out():
    # Before: GPU9999 (6 digits allowed, the decoder's GPU index stops at 4095), n_nodes="0" or
    # nranks past 2**24 passed into the record and the decoder dead-lettered it.
    lab = 'version="v5.1",node="n1",gpu="GPU9999",comm_name="DP",n_nodes="0",nranks="4",collective="AllReduce",message_size="4-5GB"'
    text = f"nccl_collective_exec_time_microseconds{{{lab}}} 9498.47\nnccl_bus_bandwidth_gbs{{{lab}}} 678.2\n"
    counts: dict[str, int] = {}
    [r] = parse_prom(text, ts=T, counts=counts)
    assert (r.gpu, r.nnodes, r.rank, r.exec_time_us) == (None, None, 0, 9498.47) and decodes(r)
    assert counts["dropped.bad_value"] == 2
    big = text.replace('nranks="4"', 'nranks="99999999"')
    counts = {}
    assert parse_prom(big, ts=T, counts=counts) == [] and counts["dropped.bad_rank"] == 1


def test_a_size_bucket_past_an_int64_is_left_out_and_counted():
    # Found in review: "999999999999TB" became bytes of ~1.1e24, which the decoder refuses
    # (out_of_range): the whole series was dead-lettered downstream.
    from producers.nccl_inspector import bucket_bytes, parse_prom

    assert bucket_bytes("999999999999TB") is None and bucket_bytes("4-5GB") == 4 << 30
    text = (
        "# TYPE nccl_collective_exec_time_microseconds gauge\n"
        'nccl_collective_exec_time_microseconds{node="n1",gpu="GPU0",comm_name="c",nranks="8",n_nodes="1",'
        'collective="AllReduce",message_size="999999999999TB"} 10\n'
    )
    counts: dict[str, int] = {}
    recs = parse_prom(text, ts=1.0e9, counts=counts)
    assert [r.bytes for r in recs] == [0] and counts == {"dropped.bad_value": 1}
