"""Collective-progress records (``kind: progress``, docs/architecture.md §3) through the decoder:
well-formed ones decode on the fast path and the slow path alike, and every hostile one is a
dead letter with the reason the contract names, costing only itself."""

from __future__ import annotations

import json

import pytest

from pipeline.decode import MAX_RANKS, MAX_SEQ, Decoder
from pipeline.schema import ProgressRecord, encode
from tests.factories import T0, progress

GOOD = {
    "kind": "progress", "v": 1, "ts": T0, "host": "gpu-node-007", "job": "pretrain", "rank": 3, "gpu": 3,
    "comm": "0", "comm_name": "default_pg", "nranks": 8, "last_enqueued": 2635, "last_completed": 2634,
    "seq": 2635, "op": "ALLREDUCE", "timeout_ms": 1800000, "ran_ms": 1800024, "source": "watchdog",
    "state": "timeout",
}  # fmt: skip


def _one(obj) -> tuple[list, list]:
    out = Decoder().decode(json.dumps(obj).encode(), "f:1")
    return out.records, out.dead


def test_a_full_record_decodes_with_every_field():
    recs, dead = _one(GOOD)
    assert not dead
    (r,) = recs
    assert isinstance(r, ProgressRecord)
    assert (r.rank, r.nranks, r.last_enqueued, r.last_completed, r.seq, r.op, r.timeout_ms, r.state) == (
        3, 8, 2635, 2634, 2635, "ALLREDUCE", 1800000, "timeout")


def test_only_rank_source_and_state_are_required_beside_the_envelope():
    recs, dead = _one({"kind": "progress", "ts": T0, "host": "h", "rank": 0, "source": "ras", "state": "dead"})
    assert not dead and recs[0].comm is None and recs[0].job is None


def test_minus_one_is_none_completed_yet():
    recs, dead = _one({**GOOD, "last_completed": -1, "last_enqueued": -1})
    assert not dead and recs[0].last_completed == -1


def test_a_record_round_trips_through_encode():
    r = progress(5.0, "n2", 1, nranks=2, last_enqueued=10, last_completed=9)
    out = Decoder().decode(encode(r), "f:1")
    (got,) = out.records
    assert isinstance(got, ProgressRecord) and encode(got) == encode(r)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"rank": 8}, "wrong_type"),  # rank outside nranks
        ({"rank": -1}, "out_of_range"),
        ({"rank": MAX_RANKS}, "out_of_range"),
        ({"nranks": MAX_RANKS + 1}, "out_of_range"),
        ({"gpu": 4096}, "out_of_range"),
        ({"last_completed": -2}, "out_of_range"),
        ({"last_enqueued": MAX_SEQ + 1}, "out_of_range"),
        ({"last_completed": 10**400}, "out_of_range"),
        ({"seq": -5}, "out_of_range"),
        ({"timeout_ms": -1}, "out_of_range"),
        ({"ran_ms": 2**64}, "out_of_range"),
        ({"state": "hung"}, "wrong_type"),
        ({"source": "syslog"}, "wrong_type"),
        ({"last_completed": "twenty"}, "wrong_type"),
        ({"last_completed": 2634.5}, "wrong_type"),
        ({"op": ""}, "bad_identifier"),
        ({"op": "x" * 257}, "bad_identifier"),
        ({"comm": "pg\n0"}, "bad_identifier"),
        ({"job": "\ud800"}, "bad_identifier"),
        ({"host": "two words"}, "bad_identifier"),
        ({"ts": T0 * 1000}, "ts_out_of_range"),
        ({"ts": "now"}, "wrong_type"),
        ({"v": 2}, "unsupported_version"),
        ({"rank": None}, "wrong_type"),
    ],
)
def test_hostile_fields_are_dead_letters_with_their_reason(change, reason):
    recs, dead = _one({**GOOD, **change})
    assert not recs
    assert [d.reason for d in dead] == [reason]
    assert dead[0].origin == "f:1" and dead[0].action == "record_dropped"


@pytest.mark.parametrize("key", ["rank", "source", "state", "ts", "host"])
def test_a_missing_required_key_is_named(key):
    recs, dead = _one({k: v for k, v in GOOD.items() if k != key})
    assert not recs and dead[0].reason == "missing_key" and key in dead[0].detail


def test_a_number_written_as_text_is_read_as_the_number_as_for_every_kind():
    recs, dead = _one({**GOOD, "last_completed": "2634"})
    assert not dead and recs[0].last_completed == 2634


def test_nan_time_is_nan_value():
    out = Decoder().decode(json.dumps({**GOOD, "ts": float("nan")}).encode(), "f:1")
    assert [d.reason for d in out.dead] == ["nan_value"]


def test_a_poison_progress_record_costs_only_itself_in_a_host_message():
    msg = json.dumps([GOOD, {**GOOD, "rank": 99}, {"kind": "dcgm", "ts": T0, "host": "h", "gpu": 0, "fields": {}}])
    out = Decoder().decode(msg.encode(), "t[0]@5")
    assert [type(r).__name__ for r in out.records] == ["ProgressRecord", "DcgmRecord"]
    assert [(d.reason, d.origin) for d in out.dead] == [("wrong_type", "t[0]@5#1")]


def test_a_batch_decodes_as_each_message_does():
    good = json.dumps(GOOD).encode()
    bad = json.dumps({**GOOD, "last_enqueued": -7}).encode()
    many = Decoder().decode_many([good, bad, good], ["a", "b", "c"])
    assert len(many.records) == 2
    assert [(d.reason, d.origin) for d in many.dead] == [("out_of_range", "b")]
    clean = Decoder().decode_many([good, good], ["a", "b"])
    assert len(clean.records) == 2 and not clean.dead
