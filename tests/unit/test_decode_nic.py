"""NIC port records (``kind: "nic"``) through the decoder: accepted on the fast path beside DCGM
and NCCL records, and every hostile value answered as the other kinds' are (docs/architecture.md
§3, "Dead letters"): the record dropped with a reason, or one bad counter dropped alone."""

from __future__ import annotations

import json

import pytest

from pipeline.decode import MAX_NIC_COUNTERS, Decoder
from pipeline.schema import DcgmRecord, NicRecord, encode
from tests.factories import T0


def nic(**kw):
    """An ACTIVE 400 Gb/s InfiniBand port as the sysfs producer writes it (gpud's h100 fixture values)."""
    base = {"v": 1, "kind": "nic", "ts": T0, "host": "n1", "device": "mlx5_0", "port": 1,
            "link_layer": "InfiniBand", "rate_gbps": 400.0, "state": 4, "state_name": "ACTIVE",
            "phys_state": 5, "phys_state_name": "LinkUp", "netdev": "ibp26s0",
            "counters": {"link_downed": 0, "symbol_error": 0, "port_xmit_wait": 2489603687,
                         "excessive_buffer_overrun_errors": 15},
            "gpus": [0, 1]}
    base.update(kw)
    return base


def dec(obj, origin="t[0]@3"):
    return Decoder().decode(json.dumps(obj).encode(), origin)


def test_a_port_record_decodes_whole_beside_other_kinds():
    dcgm = {"v": 1, "kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "fields": {}}
    out = dec([dcgm, nic(), nic(port=2, counters={})])
    assert out.dead == []
    a, b = out.records[1], out.records[2]
    assert isinstance(out.records[0], DcgmRecord) and isinstance(a, NicRecord) and isinstance(b, NicRecord)
    assert (a.device, a.port, a.state, a.state_name, a.phys_state, a.rate_gbps, a.gpus) == (
        "mlx5_0", 1, 4, "ACTIVE", 5, 400.0, [0, 1])
    assert a.counters["port_xmit_wait"] == 2489603687
    assert out.origins == ["t[0]@3#0", "t[0]@3#1", "t[0]@3#2"]
    # What a producer encodes is what the decoder reads back.
    assert msgspec_roundtrip(NicRecord(ts=T0, host="n1", device="mlx5_0", port=1, counters={"link_downed": 3}))


def msgspec_roundtrip(r):
    out = Decoder().decode(encode(r), "x")
    return out.dead == [] and out.records[0].counters == r.counters and out.records[0].device == r.device


def test_decode_many_takes_port_records_on_the_batch_path():
    d = Decoder()
    out = d.decode_many([json.dumps(nic()).encode(), json.dumps(nic(port=2)).encode()], ["a", "b"])
    assert out.dead == [] and [r.port for r in out.records] == [1, 2]


def test_unknown_fields_are_ignored_as_for_the_other_kinds():
    out = dec(nic(vendor_extra={"x": 1}, hca_type="MT4129"))
    assert out.dead == [] and out.records[0].device == "mlx5_0"


@pytest.mark.parametrize("change, reason", [
    ({"device": "mlx5 0"}, "bad_identifier"),
    ({"device": ""}, "bad_identifier"),
    ({"device": "m" * 65}, "bad_identifier"),
    ({"device": "mlx5_\ud800"}, "bad_identifier"),
    ({"netdev": "ib\x00"}, "bad_identifier"),
    ({"state_name": "\x1b[31mACTIVE"}, "bad_identifier"),
    ({"port": -1}, "negative_value"),
    ({"port": 65536}, "out_of_range"),
    ({"state": 16}, "out_of_range"),
    ({"phys_state": 2 ** 40}, "out_of_range"),
    ({"rate_gbps": -400}, "negative_value"),
    ({"rate_gbps": 4e8}, "out_of_range"),
    ({"gpus": [0, 4096]}, "out_of_range"),
    ({"gpus": list(range(65))}, "out_of_range"),
    ({"counters": {f"c{i}": 0 for i in range(MAX_NIC_COUNTERS + 1)}}, "out_of_range"),
    ({"counters": [1, 2]}, "wrong_type"),
    ({"ts": T0 * 1000}, "ts_out_of_range"),
    ({"v": 2}, "unsupported_version"),
    ({"port": "one"}, "wrong_type"),
    ({"peer": "s" * 65}, "bad_identifier"),
    ({"peer": "leaf\x1b[2J"}, "bad_identifier"),
    ({"peer_guid": "0x2c9020046c588"}, "bad_identifier"),
    ({"peer_guid": "0x0002C9020046C588"}, "bad_identifier"),
    ({"peer_port": 65536}, "out_of_range"),
    ({"peer_lid": -1}, "out_of_range"),
])
def test_a_bad_port_record_is_dropped_with_its_reason(change, reason):
    out = dec(nic(**change))
    assert out.records == []
    [d] = out.dead
    assert (d.reason, d.action, d.origin) == (reason, "record_dropped", "t[0]@3")
    encode(d)  # every dead letter encodes, whatever the record held


def test_the_link_partner_decodes_with_the_port():
    # A node description holds spaces and punctuation (``MF0;leaf01:MQM9700/U1``).
    out = dec(nic(peer="MF0;leaf01:MQM9700/U1", peer_guid="0x0002c9020046c588", peer_port=17, peer_lid=2))
    assert out.dead == []
    r = out.records[0]
    assert (r.peer, r.peer_guid, r.peer_port, r.peer_lid) == ("MF0;leaf01:MQM9700/U1", "0x0002c9020046c588", 17, 2)
    assert dec(nic()).records[0].peer is None


def test_a_missing_device_or_port_is_a_missing_key():
    for key in ("device", "port"):
        out = dec({k: v for k, v in nic().items() if k != key})
        assert [d.reason for d in out.dead] == ["missing_key"]


@pytest.mark.parametrize("value, reason", [
    (-1, "negative_value"), (2 ** 64, "out_of_range"), ("lots", "wrong_type"), (1.5, "nan_field"),
    (None, "wrong_type"), (True, "wrong_type"), ("٣", "wrong_type"),
])
def test_one_bad_counter_costs_only_itself(value, reason):
    out = dec(nic(counters={"link_downed": 2, "symbol_error": value}))
    [r] = out.records
    assert r.counters == {"link_downed": 2}
    [d] = out.dead
    assert (d.reason, d.action, d.fields, d.host) == (reason, "fields_dropped", ["counters.symbol_error"], "n1")


def test_counter_numbers_a_loose_producer_writes_are_still_numbers():
    out = dec(nic(counters={"a": 2 ** 64 - 1, "b": 7.0, "c": "12"}))
    assert out.dead == [] and out.records[0].counters == {"a": 2 ** 64 - 1, "b": 7, "c": 12}


def test_a_bad_counter_name_is_dropped_escaped():
    out = dec(nic(counters={"ok": 1, "bad name": 2, "x" * 70: 3}))
    assert out.records[0].counters == {"ok": 1}
    [d] = out.dead
    assert d.reason == "bad_identifier" and len(d.fields) == 2 and all(f.startswith("counters.'") for f in d.fields)


def test_one_poison_port_record_costs_only_itself_in_a_host_message():
    out = dec([nic(), nic(port=2, state=99), nic(port=3)])
    assert [r.port for r in out.records] == [1, 3]
    assert [(d.reason, d.origin) for d in out.dead] == [("out_of_range", "t[0]@3#1")]


def test_the_live_wall_clock_bounds_port_records_too():
    d = Decoder(wall_clock=lambda: T0 + 10 * 86400)
    out = d.decode(json.dumps(nic()).encode(), "x")
    assert [x.reason for x in out.dead] == ["ts_out_of_range"]




@pytest.mark.parametrize("kind, change", [
    (None, {}),
    ("nic", {"device": "mlx5 0"}),
    ("nic", {"netdev": "ib\x00"}),
    ("nic", {"peer": "leaf\x1b[2J"}),
    ("nic", {"peer_lid": -1}),
    ("nccl", {"comm": "c\x1b[2J"}),
    ("progress", {"job": "j\x1b[2J"}),
])
def test_records_of_every_kind_in_a_batch_decode_as_alone(kind, change):
    # decode_many's batch path checks the names of every kind in one pass: a batch of DCGM,
    # NCCL, progress and port records, one of them bad or none, comes out as decode() answers
    # each message.
    def spoilt(k, rec):
        return {**rec, **change} if k == kind else rec

    dcgm = {"v": 1, "kind": "dcgm", "ts": T0, "host": "n1", "gpu": 0, "model": "NVIDIA H100 80GB HBM3", "fields": {}}
    # As the simulator writes them (docs/architecture.md §3).
    nccl = {"v": 1, "kind": "nccl", "ts": T0, "host": "n1", "gpu": 0, "job": "pretrain", "comm": "0x481383d0ff65dd",
            "comm_name": "dp0", "rank": 0, "nranks": 64, "nnodes": 64, "coll": "ReduceScatter", "seq": 4171,
            "bytes": 67108864, "exec_time_us": 99028.0, "algbw_gbs": 43.371, "busbw_gbs": 42.693}
    prog = {"v": 1, "kind": "progress", "ts": T0, "host": "n1", "job": "pretrain", "rank": 0, "gpu": 0,
            "comm": "0x46360f16256fcf", "nranks": 8, "last_enqueued": 22534, "source": "ras", "state": "progress"}
    messages = [[dcgm], [spoilt("nccl", nccl)], [spoilt("progress", prog), prog]]
    if kind in (None, "nic"):
        messages.append([spoilt("nic", nic()), nic(port=2)])
    payloads = [json.dumps(m).encode() for m in messages]
    origins = [f"t[0]@{i}" for i in range(len(payloads))]
    batch = Decoder().decode_many(payloads, origins)
    alone = [Decoder().decode(p, o) for p, o in zip(payloads, origins)]
    assert [d.reason for d in batch.dead] == [d.reason for a in alone for d in a.dead]
    assert batch.records == [r for a in alone for r in a.records]
    assert len(batch.records) == (6 if kind is None else 3 if kind != "nic" else 5)
