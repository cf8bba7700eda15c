"""NCCL producers: Inspector JSONL (real sample, following a directory through appends, partial
lines and rotation, aggregation), Inspector Prometheus mode, and nccl-tests text and -J JSON."""

from __future__ import annotations

import json
import os

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.nccl_inspector import InspectorFollower, PromFileSource, aggregate, bucket_bytes, parse_prom, parse_record
from producers.nccl_tests import parse, parse_text

from tests.factories import SHARED_DATA as DATA  # noqa: E402


def _decodes(recs):
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "t")
    assert out.dead == [] and len(out.records) == len(recs)
    return out.records


def test_inspector_sample_field_by_field():
    lines = (DATA / "nccl_inspector_sample.jsonl").read_text().splitlines()
    recs = [parse_record(json.loads(l), gpus_per_node=8) for l in lines]
    a, b, c = _decodes(recs)
    assert (a.host, a.comm, a.comm_name, a.rank, a.nranks, a.nnodes, a.coll, a.seq) == \
        ("example-hostname", "0x7f8c496ae9f661", None, 2, 8, 1, "AllReduce", 1407)
    assert (a.bytes, a.exec_time_us, a.algbw_gbs, a.busbw_gbs) == (17179869184, 61974, 277.210914, 485.119099)
    assert a.ts == pytest.approx(1748030377.748202) and a.gpu == 2        # whole-node comm: rank % 8
    assert a.labels == {"source": "nccl_inspector", "version": "v4.0", "pid": "1639453"}
    assert (b.coll, b.rank, b.bytes, b.busbw_gbs, b.labels["timing_source"]) == ("ReduceScatter", 4, 2147483648, 366.134533, "kernel_gpu")
    assert (c.rank, c.nranks, c.nnodes, c.gpu, c.exec_time_us) == (31, 32, 4, 7, 110)   # 4 nodes x 8


def test_inspector_versions_nan_and_junk():
    base = {"header": {"id": "0x1", "rank": 0, "n_ranks": 2, "nnodes": 1, "comm_name": "TP"},
            "metadata": {"inspector_output_format_version": "v4.3", "dump_timestamp_us": 1764403200000000, "hostname": "h"},
            "coll_perf": {"coll": "AllGather", "coll_sn": 1, "coll_msg_size_bytes": 1024, "coll_exec_time_us": 10,
                          "coll_algobw_gbs": "nan", "coll_busbw_gbs": "nan"}}
    r = parse_record(base)
    assert r.comm_name == "TP" and r.algbw_gbs is None and r.busbw_gbs is None and r.gpu is None
    assert parse_record({**base, "coll_perf": {**base["coll_perf"], "coll_exec_time_us": "nan"}}) is None
    assert parse_record({**base, "header": {"id": "x", "rank": 5, "n_ranks": 2}}) is None
    assert parse_record({"metadata": {}}) is None
    p2p = {**{k: v for k, v in base.items() if k != "coll_perf"},
           "p2p_perf": {"p2p": "Send", "p2p_sn": 3, "p2p_peer": 1, "p2p_msg_size_bytes": 4096, "p2p_exec_time_us": 5.5}}
    r = parse_record(p2p)
    assert (r.coll, r.bytes, r.exec_time_us, r.labels["peer"]) == ("Send", 4096, 5.5, "1")


def _line(rank, sn, t, size=1024, ts_us=1764403200000000):
    return json.dumps({"header": {"id": "0xc", "rank": rank, "n_ranks": 8, "nnodes": 1},
                       "metadata": {"dump_timestamp_us": ts_us + sn, "hostname": "node-a", "pid": 7},
                       "coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": size,
                                     "coll_exec_time_us": t, "coll_algobw_gbs": 1.0, "coll_busbw_gbs": 2.0 * t}})


def test_follow_appends_partial_lines_new_files_and_rotation(tmp_path):
    f = tmp_path / "node-a-pid7.log"
    f.write_text(_line(0, 1, 10) + "\n" + _line(0, 2, 30) + "\n" + _line(0, 3, 20)[:25])   # partial last line
    fol = InspectorFollower(tmp_path, gpus_per_node=8)
    [agg] = fol.poll()
    assert agg.exec_time_us == 20 and agg.seq == 2 and agg.labels["ops"] == "2"          # 2 ops, 1 record
    assert agg.labels["exec_time_us_max"] == "30" and agg.busbw_gbs == 40 and agg.gpu == 0
    with open(f, "a") as fh:
        fh.write(_line(0, 3, 20)[25:] + "\n")                                             # completes it
    [r] = fol.poll()
    assert r.seq == 3 and r.exec_time_us == 20
    assert fol.poll() == []
    (tmp_path / "node-b-pid9.log").write_text(_line(1, 1, 11).replace("node-a", "node-b") + "\nnot json\n")
    [r] = fol.poll()
    assert r.host == "node-b" and r.rank == 1 and fol.stats.bad_json == 1
    os.rename(f, tmp_path / "node-a-pid7.log.1")                                          # rotation
    f.write_text(_line(0, 9, 50) + "\n")
    [r] = fol.poll()
    assert r.seq == 9 and fol.stats.rotations == 1
    f.write_text("")                                           # copytruncate, then the plugin appends
    with open(f, "a") as fh:
        fh.write(_line(0, 10, 6) + "\n")
    assert [x.seq for x in fol.poll()] == [10]
    _decodes([agg, r])


def test_aggregate_keeps_sizes_and_ranks_apart():
    recs = [parse_record(json.loads(_line(rk, sn, 10 + sn, size))) for rk in (0, 1) for sn in (1, 2) for size in (8, 16)]
    out = aggregate(recs)
    assert len(out) == 4 and all(r.labels["ops"] == "2" for r in out)


def test_inspector_prom_sample():
    recs = parse_prom((DATA / "nccl_inspector_prom_sample.prom").read_text(), ts=1764403200.0)
    recs = {r.coll: r for r in _decodes(recs)}
    a, s = recs["AllReduce"], recs["Send"]
    assert (a.host, a.gpu, a.comm, a.comm_name, a.nranks, a.nnodes, a.job) == ("nvl72004-T01", 0, "DP Group 0", "DP Group 0", 4, 1, None)
    assert (a.busbw_gbs, a.exec_time_us, a.bytes) == (678.263, 9498.47, 4 << 30)
    assert a.labels == {"source": "nccl_inspector_prom", "rank_source": "gpu_index", "message_size": "4-5GB",
                        "algo_proto": "Ring_ll", "version": "v5.1"}
    assert (s.busbw_gbs, s.exec_time_us, s.bytes) == (464.9, 1154.87, 512 << 20)
    assert bucket_bytes("junk") is None


def test_prom_file_source_rereads_on_rewrite(tmp_path):
    p = tmp_path / "nccl.prom"
    p.write_text((DATA / "nccl_inspector_prom_sample.prom").read_text())
    src = PromFileSource(p)
    assert len(src.poll()) == 2 and src.poll() == []
    os.utime(p, (1, 1))
    assert len(src.poll()) == 2


def test_nccl_tests_sample_field_by_field():
    path = DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt"
    recs = _decodes(parse_text(path.read_text(), ts=1764403200.0, name_hint=str(path)))
    assert len(recs) == 31
    first, last = recs[0], recs[-1]
    assert (first.host, first.gpu, first.rank, first.nranks, first.nnodes, first.coll) == ("ztan-mig-235z", 0, 0, 16, 2, "AllReduce")
    assert (first.bytes, first.exec_time_us, first.algbw_gbs, first.busbw_gbs) == (8, 135.8, 0.0, 0.0)
    assert first.labels["in_time_us"] == "123.5" and first.labels["type"] == "float" and first.labels["redop"] == "sum"
    assert first.labels["root"] == "-1" and first.labels["wrong"] == "0"
    assert (last.bytes, last.exec_time_us, last.algbw_gbs, last.busbw_gbs) == (8589934592, 47535, 180.71, 338.82)
    assert last.labels["in_busbw_gbs"] == "337.35"
    assert recs[28].exec_time_us == 12646 and recs[28].bytes == 2147483648


OLD = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  1234 on    dgx01 device  0 [0x07] Tesla V100-SXM2-32GB
#   Rank  1 Pid  1234 on    dgx01 device  1 [0x0a] Tesla V100-SXM2-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    42.11    0.00    0.00  0e+00    41.50    0.00    0.00  0e+00
         128            32   float     sum    43.00    0.00    0.01  0e+00    42.00    0.00    0.01  0e+00
# Out of bounds values : 0 OK
"""


def test_nccl_tests_old_layout_no_root_error_column():
    recs = parse_text(OLD, ts=1764403200.0, coll="AllReduce", host="fallback")
    assert [(r.bytes, r.exec_time_us, r.busbw_gbs) for r in recs] == [(8, 42.11, 0.0), (128, 43.0, 0.01)]
    assert "root" not in recs[0].labels and recs[0].labels["in_time_us"] == "41.5"
    # rank lines without Group are read; nranks is at least the header's nThread x nGpus
    assert recs[0].host == "dgx01" and recs[0].gpu == 0 and recs[0].nranks == 8


def test_nccl_tests_json():
    doc = {"version": 2, "args": ["/opt/nccl-tests/build/reduce_scatter_perf", "-b", "8"],
           "config": {"devices": [{"rank": 0, "group": 0, "pid": 5, "hostname": "n1", "device": 3},
                                  {"rank": 1, "group": 0, "pid": 6, "hostname": "n2", "device": 0}]},
           "results": [{"size": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": "    -1",
                        "out_of_place": {"time": 203.2, "alg_bw": 5.16, "bus_bw": 9.68, "nwrong": 0.0},
                        "in_place": {"time": 207.2, "alg_bw": 5.06, "bus_bw": "nan", "nwrong": None}},
                       {"size": 8, "out_of_place": {"time": "nan"}}]}
    [r] = _decodes(parse(json.dumps(doc), ts=1764403200.0))
    assert (r.coll, r.host, r.gpu, r.nranks, r.nnodes, r.bytes) == ("ReduceScatter", "n1", 3, 2, 2, 1048576)
    assert (r.exec_time_us, r.algbw_gbs, r.busbw_gbs) == (203.2, 5.16, 9.68)
    assert r.labels["format"] == "json" and r.labels["root"] == "-1" and "in_busbw_gbs" not in r.labels
