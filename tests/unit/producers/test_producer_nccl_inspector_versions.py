"""NCCL Inspector JSON "v4.1-v4.3" (issue 21 item 7): a per-dump ``dump_stats`` record (ring-buffer
losses), ``coll_algo``/``coll_proto``, and a dump marker that carries ``header``/``metadata`` once
for the operation lines after it. NVIDIA's plugin writes none of these (its README and C code,
through v2.30.7-1, only ever say ``"v4.0"``; see test_producer_nccl_inspector_real.py): they are
layouts the parser tolerates, not ones it has been seen to receive."""

from __future__ import annotations

import json

from producers.nccl_inspector import InspectorFollower, parse_record
from tests.unit.producers.nccl_inspector_factories import HDR, coll, dump_stats, meta


def write(dir_, *objs) -> None:
    with open(dir_ / "node-a-pid1639453.log", "a") as fh:
        for o in objs:
            fh.write(json.dumps(o) + "\n")


def test_v42_algorithm_and_protocol_are_kept_as_in_prometheus_mode():
    r = parse_record({"header": HDR, "metadata": meta("v4.2"), **coll(1407)})
    assert r.labels["algo"] == "RING" and r.labels["proto"] == "LL" and r.labels["algo_proto"] == "RING_LL"
    old = parse_record({"header": HDR, "metadata": meta("v4.0"), **coll(1, algo=None, proto=None)})
    assert "algo_proto" not in old.labels   # v4.0 has neither: nothing invented


def test_operations_with_another_algorithm_are_not_averaged_together(tmp_path):
    write(tmp_path, *({"header": HDR, "metadata": meta("v4.2"), **coll(i, algo=a, t=t)}
                      for i, (a, t) in enumerate([("RING", 100), ("RING", 120), ("TREE", 900)])))
    recs = InspectorFollower(tmp_path).poll()
    by = {r.labels["algo"]: r for r in recs}
    assert set(by) == {"RING", "TREE"} and by["RING"].exec_time_us == 110 and by["TREE"].exec_time_us == 900


def test_v41_dump_stats_losses_are_counted_and_warned(tmp_path, caplog):
    write(tmp_path, dump_stats("v4.1", since=512, total=4096), {"header": HDR, "metadata": meta("v4.1"), **coll(1)})
    fol = InspectorFollower(tmp_path)
    assert len(fol.poll()) == 1
    c = fol.summary()
    assert c["dropped.inspector_ring_overwritten"] == 512 and c["dump_stats"] == 1
    assert "dropped 512 operation record(s)" in caplog.text
    # Only the cumulative total: its growth is what was lost since the last dump.
    write(tmp_path, dump_stats("v4.1", total=4196))
    fol.poll()
    assert fol.summary()["dropped.inspector_ring_overwritten"] == 512 + 100


def test_v43_operation_lines_take_the_markers_header_and_metadata(tmp_path):
    write(tmp_path, dump_stats("v4.3", since=0), coll(1407), coll(1408))
    fol = InspectorFollower(tmp_path)
    recs = fol.poll()
    assert len(recs) == 1 and recs[0].labels["ops"] == "2"
    r = recs[0]
    assert (r.rank, r.nranks, r.comm, r.comm_name, r.host) == (2, 8, HDR["id"], "DP Group 0", "node-a")
    assert fol.summary()["dropped.inspector_ring_overwritten"] == 0


def test_records_without_an_operation_are_counted_by_reason(tmp_path):
    write(tmp_path, {"header": HDR, "metadata": meta("v4.0"), **coll(1, t="nan")},
          {"header": {**HDR, "rank": 9}, "metadata": meta("v4.0"), **coll(2)},
          {"proxy_trace": {"record_type": "proxy_step", "record_sn": 41}}, {"metadata": {}})
    fol = InspectorFollower(tmp_path)
    assert fol.poll() == []
    c = fol.summary()
    assert (c["dropped.no_time"], c["dropped.bad_rank"], c["dropped.proxy_trace"], c["dropped.no_operation"]) == \
        (1, 1, 1, 1)
