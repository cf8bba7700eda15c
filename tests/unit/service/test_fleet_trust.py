"""``<prefix>.fleet`` is a trust boundary (pipeline/service/fleet.py): each message is signed by
the host stage under a key derived from the state key, bound to the topic, the group and the
sending telemetry partition, and each mark is checked against what its partition forwarded. A
message that fails is a dead letter with its reason and origin; it costs only itself.

Each test is a row of issue #36's table; the same against a real broker:
tests/faults/test_service_stages.py::test_a_forged_fleet_mark_and_batch_are_dead_lettered.
"""

from __future__ import annotations

import math
import os

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.deadletters import REASONS
from pipeline.engine import Engine, EngineConfig
from pipeline.errors import StateError
from pipeline.incidents import IncidentStage, default_config
from pipeline.service.fleet import MAX_FORWARD_ALERTS, FleetTask
from pipeline.schema import AlertEvent, NcclRecord, dcgm
from pipeline.service.forwarded import MAX_FORWARD
from tests.factories import HEALTHY, T0
from tests.fleet_factories import (
    FLEET_KEY,
    GROUP,
    STATE_KEY,
    TOPIC,
    alerts_body,
    envelope,
    columns_body,
    fleet_message,
    json_records_body,
    mark_body,
    no_hang,
    records_body,
)

N = 2  # telemetry partitions
EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300"))


def _rec(ts: float, host: str = "n1"):
    """A healthy sample at ``ts`` (absolute: the hostile ones are far from T0)."""
    return dcgm(ts, host, 0, HEALTHY)


def _engine() -> Engine:
    return Engine(EngineConfig(), row_checks=[], tick_checks=[], screened=True)


def _task(key: bytes | None = FLEET_KEY, max_buffer: int = 2_000_000, incidents: bool = False,
          records: bool = True) -> FleetTask:
    stage = IncidentStage(default_config()) if incidents else None
    return FleetTask(_engine, N, max_buffer=max_buffer, topic=TOPIC, group=GROUP, key=key, incidents=stage,
                     records=records)


def _alert(i: int, ts: float, host: str = "n1", gpu: int | None = 0, **kw) -> AlertEvent:
    """A firing XID 48 alert at ``ts``: one that opens an incident alone and waits for no cause
    (only its GPU's alerts explain it, and those join it by GPU)."""
    fields = {"id": f"a{i}", "state": "firing", "fault": "hbm_ecc_xid", "severity": "critical",
              "rule": "hbm_ecc_xid", "host": host, "gpu": gpu, "ts": ts, "started_at": ts,
              "evidence": {"xid": 48}, **kw}
    return AlertEvent(**fields)


class Feeder:
    """Feeds a task messages at increasing offsets; keeps every dead letter."""

    def __init__(self, task: FleetTask) -> None:
        self.task, self.offset, self.dead = task, 0, []

    def send(self, *values: bytes) -> list:
        msgs = [fleet_message(v, self.offset + i) for i, v in enumerate(values)]
        self.offset += len(values)
        out = self.task.handle_guarded(msgs)
        self.dead += out.dead
        return out.dead

    def records(self, sender: int, ts: list[float], host: str = "n1", **kw) -> list:
        return self.send(envelope(records_body([_rec(t, host) for t in ts]), sender, **kw))

    def mark(self, sender: int, upto, final: bool = False, n=N, mark=None, **kw) -> list:
        return self.send(envelope(mark_body(sender if mark is None else mark, upto, final, n), sender, **kw))

    def alerts(self, sender: int, alerts: list, **kw) -> list:
        return self.send(envelope(alerts_body(alerts), sender, **kw))


def _reasons(dead: list) -> list[str]:
    return [d.reason for d in dead]


def test_signed_records_and_marks_from_every_partition_release():
    f = Feeder(_task())
    for p in range(N):
        assert f.records(p, [T0 + p, T0 + 5 + p], host=f"n{p}") == []
    assert f.mark(0, T0 + 3) == [] and f.mark(1, T0 + 3) == []
    assert f.task.stage.released == T0 + 3
    assert f.task.stage.stats["released"] == 2
    assert f.task.totals.dead == {}


@pytest.mark.parametrize("upto", [1e17, 1e300, T0 + 32.5])
@pytest.mark.parametrize("buffered", [False, True])
def test_a_mark_far_ahead_of_what_its_partition_forwarded_is_refused(upto, buffered):
    # Row 1: upto ~1e17 made _ticks_until spin for ever (float spacing above a second), and with
    # nothing buffered released jumped to it, was checkpointed, and every later record was late.
    # Unsigned (--insecure-state): nothing but the records it forwarded vouches for a mark.
    f = Feeder(_task(key=None))
    if buffered:
        f.records(0, [T0, T0 + 1])
        f.records(1, [T0, T0 + 1], host="n2")
    with no_hang(20):
        dead = f.mark(0, upto) + f.mark(1, upto)
    assert _reasons(dead) == ["early_mark", "early_mark"]
    assert dead[0].origin == f"{TOPIC}[0]@{f.offset - 2}" and "partition 0" in dead[0].detail
    assert f.task.stage.released == -math.inf and not f.task.stage.marks
    # The checkpoint holds nothing forged, and the next real record is not late.
    assert msgspec.msgpack.decode(f.task.snapshot())["released"] == -math.inf
    f.records(0, [T0 + 2])
    assert f.task.stage.stats["late"] == 0


def test_a_mark_within_the_lateness_of_its_partitions_newest_record_is_taken():
    f = Feeder(_task(key=None))
    f.records(0, [T0])
    assert f.mark(0, T0 + 31.0) == []          # allowed_lateness 30 s + tick 1 s
    assert _reasons(f.mark(0, T0 + 31.5)) == ["early_mark"]
    assert f.task.stage.marks == {0: T0 + 31.0}


def test_a_mark_with_nothing_forwarded_may_only_say_nothing_released():
    f = Feeder(_task(key=None))
    assert f.mark(0, None) == [] and f.mark(1, None, final=True) == []
    dead = f.mark(0, T0)
    assert _reasons(dead) == ["early_mark"] and "forwarded no record" in dead[0].detail


@pytest.mark.parametrize(
    ("hosts", "reason", "says"),
    [
        ('{"n1": 1e17}', "early_mark", "host ahead"),              # far past what partition 0 forwarded
        (f'{{"n1": {T0 + 40}}}', "early_mark", "host ahead"),     # past its newest record + the lead
        ('{"n1": "soon"}', "wrong_type", ""),
        ('["n1"]', "wrong_type", ""),
        ('{"": %s}' % (T0 + 1), "bad_mark", "characters"),
        ('{"%s": %s}' % ("n" * 300, T0 + 1), "bad_mark", "characters"),
    ],
)
def test_a_mark_with_hosts_ahead_it_cannot_have_released_is_refused(hosts, reason, says):
    f = Feeder(_task(key=None))
    f.records(0, [T0, T0 + 1])
    dead = f.send(envelope(mark_body(0, T0, False, N, hosts), 0))
    assert _reasons(dead) == [reason] and says in dead[0].detail
    assert f.task.stage.hosts_ahead == {} and 0 not in f.task.stage.marks



@pytest.mark.parametrize("upto", [1e17, 1e300, -1e300])
def test_a_signed_mark_is_bounded_by_the_decoders_range_only(upto):
    # Signed, a mark is the host stage's own: one past what its partition forwarded is taken (a
    # partition whose records stopped while its NIC port records, never forwarded, went on), and
    # only a time no record could have is refused.
    f = Feeder(_task())
    assert _reasons(f.mark(0, upto)) == ["early_mark"] and "outside" in f.dead[0].detail
    assert f.mark(0, T0) == []   # nothing forwarded yet


def test_a_partition_that_stops_forwarding_does_not_hold_the_others():
    # Its DCGM records stop at T0+29 while its host stage goes on releasing (its NIC port
    # records move it): its signed marks run past what it forwarded. Refused as early_mark, they
    # held every other partition's records until service.fleet_max_buffer forced them out.
    f = Feeder(_task())
    for t in range(0, 150, 10):
        if t < 30:
            f.records(0, [T0 + t + k for k in range(10)])
        f.records(1, [T0 + t + k for k in range(10)], host="n2")
        f.mark(0, T0 + t + 10)
        f.mark(1, T0 + t + 10)
    assert f.dead == []
    assert f.task.stage.released == T0 + 150 and f.task.stage.stats["released"] == 180

def test_a_mark_naming_more_hosts_ahead_than_an_engine_keeps_is_refused():
    f = Feeder(_task())
    f.records(0, [T0, T0 + 1])
    f.task.max_hosts = 3
    many = "{" + ", ".join(f'"n{i}": {T0 + 1}' for i in range(4)) + "}"
    assert _reasons(f.send(envelope(mark_body(0, T0, False, N, many), 0))) == ["bad_mark"]
    assert f.send(envelope(mark_body(0, T0, False, N, '{"n1": %s}' % (T0 + 1)), 0)) == []
    assert f.task.stage.hosts_ahead == {"n1": T0 + 1}


@pytest.mark.parametrize("n", [2**64, 2**64 + 1, 10**400, 1000, 3, 1, 0, -1])
def test_a_mark_naming_another_partition_count_is_refused(n):
    # Row 2: n of 2^64 or more raised OverflowError in every checkpoint (msgpack): serve died on
    # every restart; a large n below that held the fleet stage until max_buffer.
    f = Feeder(_task())
    f.records(0, [T0, T0 + 1])
    f.records(1, [T0, T0 + 1], host="n2")
    dead = f.mark(0, T0 + 1, n=n)
    assert _reasons(dead) == ["bad_mark"] and "telemetry partitions" in dead[0].detail
    assert len(dead[0].detail) < 200
    assert f.task.stage.n_upstream == N
    msgspec.msgpack.decode(f.task.snapshot())   # a checkpoint can be taken
    f.mark(0, T0 + 1)
    f.mark(1, T0 + 1)
    assert f.task.stage.released == T0 + 1


@pytest.mark.parametrize("sender", [-5, N, 2**40])
def test_a_message_from_a_partition_that_does_not_exist_is_refused(sender):
    # Row 3: a mark from partition -5 counted towards "every upstream task has marked", so the
    # stage released before a real partition had marked, and that partition's records were late.
    f = Feeder(_task())
    f.records(0, [T0, T0 + 5])
    f.mark(0, T0 + 5)
    assert _reasons(f.mark(sender, None, final=True)) == ["unknown_partition"]
    assert _reasons(f.records(sender, [T0 + 9])) == ["unknown_partition"]
    assert f.task.stage.released == -math.inf
    f.records(1, [T0 + 1], host="n2")            # partition 1's record: not late
    f.mark(1, T0 + 5)
    assert f.task.stage.stats["late"] == 0 and f.task.stage.stats["released"] == 2


def test_a_mark_naming_another_partition_than_its_sender_is_refused():
    f = Feeder(_task())
    assert _reasons(f.mark(0, None, final=True, mark=1)) == ["bad_mark"]
    assert _reasons(f.mark(0, None, final=True, mark=-5)) == ["bad_mark"]
    assert not f.task.stage.final and not f.task.stage.marks


@pytest.mark.parametrize("key", [FLEET_KEY, None])
def test_early_and_final_forged_marks_release_nothing_early(key):
    # Row 3: an early or final mark forged for partition 1 released partition 0's seconds before
    # partition 1 had sent its own, which then were late. Signed (key): refused as unsigned; without
    # a key (--insecure-state) still refused as running ahead of what partition 1 forwarded.
    f = Feeder(_task(key))
    f.records(0, [T0 + t for t in range(10)])
    f.mark(0, T0 + 9)
    forged = {"key": None} if key is not None else {}
    assert _reasons(f.mark(1, T0 + 9, final=True, **forged)) == ["unsigned" if key else "early_mark"]
    assert _reasons(f.mark(1, T0 + 9, **forged)) == ["unsigned" if key else "early_mark"]
    assert f.task.stage.released == -math.inf
    f.records(1, [T0 + t for t in range(10)], host="n2")
    f.mark(1, T0 + 9)
    assert f.task.stage.stats["late"] == 0 and f.task.stage.stats["released"] == 18


def test_forged_records_cannot_fill_the_fleet_engines_hosts():
    # Row 3: 16,384 forged hosts skipped the host stage's screening, filled max_hosts, and the
    # real hosts' records were refused, counted only as dead_again.
    f = Feeder(_task())
    forged = [_rec(T0, f"forged-{i}") for i in range(16_384)]
    for i in range(0, len(forged), 400):
        assert _reasons(f.send(envelope(records_body(forged[i : i + 400]), 0, key=None))) == ["unsigned"]
    f.records(0, [T0, T0 + 1], host="real-0")
    f.records(1, [T0, T0 + 1], host="real-1")
    f.mark(0, T0 + 2, final=True)
    f.mark(1, T0 + 2, final=True)
    eng = f.task.stage.engine()
    assert eng.entities.n_hosts == 2 and f.task.stage.stats["dead_again"] == 0
    assert f.task.stage.stats["released"] == 4
    assert f.task.totals.dead == {"unsigned": 41}


@pytest.mark.parametrize("body", [records_body, json_records_body])
def test_a_host_past_the_fleet_engines_limit_is_refused_with_its_fleet_messages_origin(body):
    # Unsigned, forged records can fill the fleet engine's hosts; the records it then refuses must
    # say which fleet message and place they came in, as every dead letter does, not "batch#N".
    f = Feeder(FleetTask(lambda: Engine(EngineConfig(max_hosts=2), row_checks=[], tick_checks=[], screened=True),
                         N, topic=TOPIC, group=GROUP, key=None))
    f.records(0, [T0, T0 + 1], host="forged-0")
    f.records(0, [T0, T0 + 1], host="forged-1")
    # GPU 1 before GPU 0 in the message: the engine refuses them in canonical order (GPU 0 first).
    real = [dcgm(T0, "real", 1, HEALTHY), dcgm(T0, "real", 0, HEALTHY), dcgm(T0 + 1, "real", 0, HEALTHY)]
    f.send(envelope(body(real), 1, key=None))
    at = f.offset - 1
    f.mark(0, T0 + 2, final=True)
    f.mark(1, T0 + 2, final=True)
    refused = [d for d in f.dead if d.reason == "entity_limit"]
    assert [(d.host, d.ts, d.origin) for d in refused] == [
        ("real", T0, f"{TOPIC}[0]@{at}#1"), ("real", T0, f"{TOPIC}[0]@{at}#0"), ("real", T0 + 1, f"{TOPIC}[0]@{at}#2")
    ]
    assert f.task.stage._went == []      # what a release held is not kept past it


@pytest.mark.parametrize(
    "how, forge",
    [
        ("flipped byte", lambda body: envelope(body, 0)[:-1] + bytes([envelope(body, 0)[-1] ^ 1])),
        ("another partition's MAC", lambda body: envelope(body, 0, signed_as=1)),
        ("another group's MAC", lambda body: envelope(body, 0, group="other")),
        ("another topic's MAC", lambda body: envelope(body, 0, topic="other.fleet")),
        ("the state key itself", lambda body: envelope(body, 0, key=STATE_KEY)),
        ("another key", lambda body: envelope(body, 0, key=b"x" * 32)),
    ],
)
def test_a_mac_that_does_not_verify_is_refused(how, forge):
    f = Feeder(_task())
    f.records(0, [T0])
    dead = f.send(forge(mark_body(0, T0, final=True)))
    assert _reasons(dead) == ["bad_signature"], how
    assert dead[0].origin == f"{TOPIC}[0]@1" and dead[0].raw.startswith('{"mark"')
    assert not f.task.stage.marks


def test_a_message_of_one_partition_cannot_be_replayed_as_anothers():
    # The MAC binds the sender: partition 0's genuine final mark, its envelope re-labelled as
    # partition 1's (and the body's mark too), verifies as neither.
    import msgspec as m

    from pipeline.service.fleetwire import Envelope

    f = Feeder(_task())
    f.records(1, [T0], host="n2")
    genuine = m.msgpack.decode(envelope(mark_body(0, None, final=True), 0), type=Envelope)
    relabelled = Envelope(genuine.v, 1, mark_body(1, None, final=True), genuine.mac)
    assert _reasons(f.send(m.msgpack.encode(relabelled))) == ["bad_signature"]
    moved = Envelope(genuine.v, 1, genuine.body, genuine.mac)
    assert _reasons(f.send(m.msgpack.encode(moved))) == ["bad_signature"]


def test_without_a_key_messages_are_unsigned_and_still_validated():
    f = Feeder(_task(key=None))
    assert f.records(0, [T0], key=None) == [] and f.mark(0, T0, key=None) == []
    assert _reasons(f.mark(0, 1e17, key=None)) == ["early_mark"]
    # A MAC on a message to a service without a key is not checked (there is nothing to check it with).
    assert f.mark(1, None) == []


@pytest.mark.parametrize(
    "value, reason",
    [
        (b"", "bad_envelope"),
        (b"[1,2,3]", "bad_envelope"),
        (b'{"mark": 0, "upto": 1e17, "final": true, "n": 2}', "bad_envelope"),   # the old format
        (msgspec.msgpack.encode([4, 0, b"[]", b""]), "bad_envelope"),
        (msgspec.msgpack.encode([2, 0, b"[]", b""]), "bad_envelope"),               # an earlier build's shard's
        (msgspec.msgpack.encode([3, 0, b"[]", b""]), "unsigned"),                   # a model shard's, unsigned
        (envelope(b"not json", 0), "malformed_json"),
        (envelope(b'{"mark": "0", "upto": null}', 0), "wrong_type"),
        (envelope(b'{"mark": 0, "upto": 1e999, "n": 2}', 0), "wrong_type"),
        (envelope(b'[{"kind": "dcgm"}]', 0), "wrong_type"),
        (envelope(b'{"mark": 0, "upto": null, "n": ' + b"9" * 5000 + b"}", 0), "wrong_type"),
    ],
)
def test_what_is_not_a_host_stage_message_is_a_dead_letter(value, reason):
    f = Feeder(_task())
    dead = f.send(value)
    assert _reasons(dead) == [reason]
    assert dead[0].origin == f"{TOPIC}[0]@0" and dead[0].detail
    assert f.task.totals.dead == {reason: 1} and f.task.totals.messages == 1


def test_unsigned_records_out_of_the_decoders_time_range_cost_only_themselves():
    f = Feeder(_task(key=None))
    recs = [_rec(T0, "n1"), _rec(1e17, "n1"), _rec(-5.0, "n1"), _rec(T0 + 1, "n1")]
    dead = f.send(envelope(records_body(recs), 0, key=None))
    assert _reasons(dead) == ["ts_out_of_range", "ts_out_of_range"]
    assert [d.origin for d in dead] == [f"{TOPIC}[0]@0#1", f"{TOPIC}[0]@0#2"]
    assert f.task.stage.forwarded == {0: T0 + 1} and f.task.stage.stats["fed"] == 2


def test_columns_out_of_the_decoders_time_range_cost_only_themselves():
    # The DCGM rows are #0.. and the NCCL records after them, whatever order they were fed in.
    f = Feeder(_task())
    nccl = NcclRecord(ts=1e17, host="n2", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=1, exec_time_us=1.0)
    dead = f.send(envelope(records_body([_rec(T0, "n1"), nccl, _rec(-5.0, "n3"), _rec(T0 + 1, "n1")]), 0))
    assert _reasons(dead) == ["ts_out_of_range", "ts_out_of_range"]
    assert [(d.origin, d.host) for d in dead] == [(f"{TOPIC}[0]@0#1", "n3"), (f"{TOPIC}[0]@0#3", "n2")]
    assert f.task.stage.forwarded == {0: T0 + 1} and f.task.stage.stats["fed"] == 2


def test_a_json_array_of_records_from_an_earlier_build_is_still_read():
    f = Feeder(_task())
    assert f.send(envelope(json_records_body([_rec(T0), _rec(T0 + 1)]), 0)) == []
    assert f.records(1, [T0 + 1], host="n2") == []
    assert f.mark(0, T0 + 2) == [] and f.mark(1, T0 + 2) == []
    assert f.task.stage.stats["released"] == 3


@pytest.mark.parametrize("body", ["json", "columns"])
def test_a_record_with_a_gpu_past_an_int64_is_refused_not_a_crash_at_release(body):
    # The canonical order holds GPUs in int64 columns: such a record raised OverflowError from
    # the stage's release, outside the per-message guard, and took the partition down with it.
    f = Feeder(_task())
    rec = NcclRecord(ts=T0, host="n1", gpu=2**63, comm="c", rank=0, nranks=2, coll="AllReduce", bytes=1,
                     exec_time_us=1.0)
    encode = json_records_body if body == "json" else records_body
    assert _reasons(f.send(envelope(encode([rec]), 0))) == ["wrong_type"]
    f.records(0, [T0])
    f.records(1, [T0], host="n2")
    assert f.mark(0, T0 + 1) == [] and f.mark(1, T0 + 1) == []
    assert f.task.stage.stats["released"] == 2


_TWO = [dcgm(T0, "n1", 0, HEALTHY), dcgm(T0, "n2", 1, HEALTHY)]


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"cols": 2}, "bad_envelope"),                           # another encoding's version
        ({"n": MAX_FORWARD + 1}, "too_large"),
        ({"n": 10**12}, "too_large"),
        ({"n": -1}, "too_large"),
        ({"other": [NcclRecord(ts=T0, host="n", comm="c", rank=0, nranks=2, coll="A", bytes=1,
                               exec_time_us=1.0)] * (MAX_FORWARD - 1)}, "too_large"),
        ({"n": 3}, "wrong_type"),                                # columns of 2 rows
        ({"ts": b"\0" * 8}, "wrong_type"),
        ({"values": b""}, "wrong_type"),
        ({"host": b"\xff\xff\xff\xff" * 2}, "wrong_type"),    # an index past the host table
        ({"label": b"\x05\0\0\0" * 2}, "wrong_type"),
        ({"hosts": ["h"] * 3}, "wrong_type"),                    # a table longer than the rows
        ({"fields": ["DCGM_FI_DEV_GPU_TEMP"] * 2, "values": b"\0" * 32}, "wrong_type"),
        ({"fields": ["x"] * 1000, "values": b""}, "wrong_type"),
    ],
)
def test_a_columns_body_that_does_not_hold_what_it_declares_is_refused_whole(change, reason):
    f = Feeder(_task())
    dead = f.send(envelope(columns_body(_TWO, **change), 0))
    assert _reasons(dead) == [reason] and dead[0].origin == f"{TOPIC}[0]@0"
    assert f.task.stage.stats["fed"] == 0 and f.task.stage.forwarded == {}


def test_what_a_partition_forwarded_survives_a_checkpoint():
    f = Feeder(_task(key=None))
    f.records(0, [T0, T0 + 3])
    again = _task(key=None)
    again.restore(f.task.snapshot())
    assert again.stage.forwarded == {0: T0 + 3}
    g = Feeder(again)
    assert g.mark(0, T0 + 3) == [] and _reasons(g.mark(0, T0 + 40)) == ["early_mark"]


# -- alerts for the incident stage -------------------------------------------------------------------


def test_signed_alerts_reach_the_incident_stage_once_every_partition_marked_past_them():
    f = Feeder(_task(incidents=True))
    for p in range(N):
        f.records(p, [T0, T0 + 5], host=f"n{p}")
    assert f.alerts(1, [_alert(2, T0 + 2, "n1")]) == [] and f.alerts(0, [_alert(1, T0 + 1, "n0")]) == []
    f.mark(0, T0 + 3)
    assert f.task.take_incidents() == []               # partition 1 has not marked
    f.mark(1, T0 + 5)
    got = f.task.take_incidents()
    assert [(e.state, e.host, e.members) for e in got] == [("opened", "n0", ["a1"]), ("opened", "n1", ["a2"])]
    assert f.task.take_incidents() == []
    f.alerts(0, [_alert(1, T0 + 1, "n0")])            # sent again (an upstream replay): nothing new
    f.mark(0, T0 + 5, final=True)
    f.mark(1, T0 + 5, final=True)
    assert f.task.take_incidents() == [] and f.task.feed.stats["late"] == 1


@pytest.mark.parametrize(("change", "reason"), [
    ({"ts": 1e17}, "ts_out_of_range"),
    ({"ts": -5.0}, "ts_out_of_range"),
    ({"state": "pending"}, "bad_alert"),
    ({"id": ""}, "bad_alert"),
    ({"id": "x" * 300}, "bad_alert"),
    ({"host": "h" * 300}, "bad_alert"),
    ({"gpu": 2**40}, "bad_alert"),
    ({"link": -1}, "bad_alert"),
    ({"severity": "s" * 300}, "bad_alert"),
    ({"summary": "s" * 5000}, "bad_alert"),
    ({"evidence": {f"k{i}": i for i in range(100)}}, "bad_alert"),
])
def test_a_malformed_alert_costs_only_itself(change, reason):
    f = Feeder(_task(incidents=True))
    f.records(0, [T0, T0 + 5])
    bad = msgspec.structs.replace(_alert(2, T0 + 2), **change)
    dead = f.alerts(0, [_alert(1, T0 + 1), bad, _alert(3, T0 + 3, gpu=1)])
    assert _reasons(dead) == [reason] and dead[0].origin == f"{TOPIC}[0]@1#1"
    assert len(dead[0].detail) < 200 and dead[0].raw
    assert len(f.task.feed) == 2


def test_alerts_arriving_unsigned_or_in_too_large_a_message_are_refused_whole():
    f = Feeder(_task(incidents=True))
    assert _reasons(f.alerts(0, [_alert(1, T0)], key=None)) == ["unsigned"]
    many = [_alert(i, T0) for i in range(MAX_FORWARD_ALERTS + 1)]
    assert _reasons(f.alerts(0, many)) == ["too_large"]
    assert _reasons(f.send(envelope(b'{"alerts": 5}', 0))) == ["wrong_type"]
    assert _reasons(f.send(envelope(b'{"alerts":[{"kind":"alert","id":"a"}]}', 0))) == ["wrong_type"]
    assert _reasons(f.send(envelope(b'{"alerts":[', 0))) == ["malformed_json"]
    assert len(f.task.feed) == 0


def test_rules_only_marks_need_no_records_and_stay_in_the_decoders_range():
    f = Feeder(_task(incidents=True, records=False))
    assert f.mark(0, T0) == [] and f.mark(1, T0 + 2) == []
    assert _reasons(f.mark(0, 1e17)) == ["early_mark"]
    assert f.task.stage.released == T0


def test_a_possible_symptom_waits_for_its_cause_and_the_cause_opens_the_incident():
    # A GPU's XID 79 at T0+1, its host's PCIe AER error at T0+3 (pcie_path): the XID waits in the
    # feed until every partition marked the hold (5 s) past it, and joins the AER's incident.
    f = Feeder(_task(incidents=True))
    for p in range(N):
        f.records(p, [T0, T0 + 9], host=f"n{p}")
    xid = _alert(1, T0 + 1, rule="gpu_fallen_off_bus", fault="gpu_fallen_off_bus", evidence={"xid": 79})
    aer = _alert(2, T0 + 3, gpu=None, rule="pcie_aer_fatal", fault="pcie_aer_fatal", evidence={})
    f.alerts(0, [xid, aer])
    f.mark(0, T0 + 6)
    f.mark(1, T0 + 6)
    assert f.task.take_incidents() == [] and len(f.task.feed) == 2
    f.mark(0, T0 + 7)
    f.mark(1, T0 + 7)
    got = f.task.take_incidents()
    assert [(e.state, e.root.rule, e.members) for e in got] == [
        ("opened", "pcie_aer_fatal", ["a2"]), ("updated", "pcie_aer_fatal", ["a2", "a1"])]
    again = _task(incidents=True)  # a held alert survives a checkpoint
    f2 = Feeder(_task(incidents=True))
    for p in range(N):
        f2.records(p, [T0, T0 + 9], host=f"n{p}")
    f2.alerts(0, [xid])
    f2.mark(0, T0 + 6)
    f2.mark(1, T0 + 6)
    again.restore(msgspec.msgpack.encode(msgspec.msgpack.decode(f2.task.snapshot())))
    assert len(again.feed) == 1 and again.feed.released == T0 + 6


def test_the_incident_stage_and_its_feed_survive_a_checkpoint():
    f = Feeder(_task(incidents=True))
    for p in range(N):
        f.records(p, [T0, T0 + 9], host=f"n{p}")
    f.alerts(0, [_alert(1, T0 + 1), _alert(2, T0 + 8, gpu=3)])
    f.mark(0, T0 + 5)
    f.mark(1, T0 + 5)
    (opened,) = f.task.take_incidents()
    again = _task(incidents=True)
    again.restore(msgspec.msgpack.encode(msgspec.msgpack.decode(f.task.snapshot())))
    assert again.incidents.open_count == 1 and len(again.feed) == 1
    g = Feeder(again)
    g.offset = f.offset
    g.alerts(0, [_alert(4, T0 + 6)])        # joins the open incident
    g.mark(0, T0 + 9, final=True)
    g.mark(1, T0 + 9, final=True)
    got = again.take_incidents()
    assert [(e.incident, e.state) for e in got] == [(opened.incident, "updated"), (got[1].incident, "opened")]
    assert got[1].members == ["a2"]


def test_a_checkpoint_without_incidents_restores_and_another_version_is_refused():
    f = Feeder(_task())
    f.records(0, [T0, T0 + 3])
    with_incidents = _task(incidents=True)
    with_incidents.restore(f.task.snapshot())
    assert with_incidents.stage.forwarded == {0: T0 + 3} and with_incidents.incidents.open_count == 0
    blob = msgspec.msgpack.decode(with_incidents.snapshot())
    blob["fleet_task"] = 2
    with pytest.raises(StateError, match="version 2"):
        _task(incidents=True).restore(msgspec.msgpack.encode(blob))
    blob["fleet_task"] = 1
    blob["incidents"]["open"] = [["forged"]]
    with pytest.raises(StateError, match="incident stage state"):
        _task(incidents=True).restore(msgspec.msgpack.encode(blob))


# -- fuzz: whatever the topic holds ------------------------------------------------------------------

_num = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([T0, T0 + 1, 1e17, 1e300, -1e300, 2**64]),
)
_hosts_ahead = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["a", "b", "", "x" * 300]), _num, max_size=3).map(
        lambda d: "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}"
    ),
    st.sampled_from(["[]", '{"a": "x"}', '{"a": null}', "7"]),
)
_mark = st.builds(
    lambda mark, upto, final, n, hosts: mark_body(mark, upto, final, n, hosts),
    st.one_of(st.integers(-6, 3), st.integers(min_value=-(2**70), max_value=2**70)),
    st.one_of(st.none(), _num),
    st.booleans(),
    st.one_of(st.just(N), _num),
    _hosts_ahead,
)
_record_lists = st.lists(
    st.builds(lambda t, h: _rec(t, h), st.one_of(st.floats(T0 - 100, T0 + 100), _num.filter(lambda x: isinstance(x, float))), st.sampled_from(["a", "b", "c"])),
    max_size=5,
)
_u32s = st.lists(st.integers(0, 2**32 - 1), max_size=6).map(lambda xs: b"".join(x.to_bytes(4, "little") for x in xs))
# A columns body with any of its members replaced by what a forger might write.
_hostile_columns = st.builds(
    lambda recs, change: columns_body(recs, **change),
    _record_lists,
    st.fixed_dictionaries(
        {},
        optional={
            "cols": st.integers(-2, 3),
            "n": st.one_of(st.integers(-3, 8), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
            "ts": st.binary(max_size=48),
            "host": _u32s,
            "gpu": st.binary(max_size=24),
            "link": st.binary(max_size=24),
            "model": _u32s,
            "label": _u32s,
            "hosts": st.lists(st.text(max_size=4), max_size=6),
            "fields": st.lists(st.sampled_from(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "x", ""]),
                               max_size=4),
            "values": st.binary(max_size=96),
        },
    ),
)
_records = st.one_of(_record_lists.map(records_body), _record_lists.map(json_records_body), _hostile_columns)
_alerts = st.lists(
    st.builds(
        lambda i, t, gpu, state: _alert(i, t, gpu=gpu, state=state),
        st.integers(0, 5),
        st.one_of(st.floats(T0 - 100, T0 + 100), _num.filter(lambda x: isinstance(x, float))),
        st.one_of(st.none(), st.integers(-3, 5), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
        st.sampled_from(["firing", "resolved", "pending"]),
    ),
    max_size=5,
).map(alerts_body)
_body = st.one_of(_mark, _records, _alerts, st.binary(max_size=64))
_value = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda body, sender, signed, signed_as: envelope(body, sender, key=FLEET_KEY if signed else None, signed_as=signed_as),
        _body,
        st.one_of(st.integers(-6, 3), st.integers(min_value=-(2**63), max_value=2**64 - 1)),
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 2)),
    ),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_value, max_size=12), key=st.sampled_from([FLEET_KEY, None]))
def test_fuzz_any_fleet_message_is_applied_or_dead_lettered_and_state_stays_bounded(values, key):
    task = _task(key, incidents=True)
    f = Feeder(task)
    with no_hang(20):
        for v in values:
            before = (dict(task.stage.marks), set(task.stage.final), task.stage.stats["fed"] + task.stage.stats["late"])
            dead = f.send(v)
            after = (task.stage.marks, task.stage.final, task.stage.stats["fed"] + task.stage.stats["late"])
            # Each message is taken, or costs only itself: a dead letter with a known reason and its origin.
            assert all(d.reason in REASONS and d.origin.startswith(f"{TOPIC}[0]@{f.offset - 1}") for d in dead)
            if any(d.origin == f"{TOPIC}[0]@{f.offset - 1}" for d in dead):
                assert (before[0], before[1], before[2]) == (dict(after[0]), set(after[1]), after[2])
        task.flush()
    stage = task.stage
    assert stage.n_upstream == N and set(stage.marks) <= set(range(N)) and stage.final <= set(range(N))
    assert set(stage.forwarded) <= set(range(N))
    assert all(1e9 <= t <= 4.1e9 for t in stage.forwarded.values())
    assert stage.released == -math.inf or stage.released <= 4.1e9 + task.lead
    assert "internal" not in task.totals.dead
    assert all(1e9 <= e.ts <= 4.1e9 for e in task.take_incidents())
    again = _task(key, incidents=True)
    again.restore(task.snapshot())


# -- in the service ----------------------------------------------------------------------------------


def test_the_service_dead_letters_and_counts_forged_fleet_messages():
    from tests.unit.service.service_factories import sim_services

    bus, host, fleet, clock = sim_services(30)
    assert fleet.upstream == host.upstream == 2      # the fleet stage knows the telemetry topic's count
    p = bus.producer()
    topic = fleet.topics.fleet
    p.send(topic, envelope(mark_body(0, 1e17, final=True), 0, key=None), b"fleet")
    group, key = fleet.cfg.kafka.group, fleet.fleet_key  # signed as the host stage signs
    p.send(topic, envelope(mark_body(-5, None, final=True, n=2**64), -5, key=key, group=group), b"fleet")
    p.send(topic, envelope(records_body([_rec(T0, "forged")]), 1, key=b"k" * 32, group=group), b"fleet")
    p.send(topic, b"\xff not an envelope", b"fleet")
    for _ in range(30):
        host.step()
        fleet.step()
        clock.t += 0.5
    dlq = [msgspec.json.decode(m.value) for m in bus.messages(fleet.topics.dlq)]
    forged = sorted(d["reason"] for d in dlq if d["origin"].startswith(topic + "["))
    assert forged == ["bad_envelope", "bad_signature", "unknown_partition", "unsigned"]
    for reason in ("unsigned", "unknown_partition", "bad_signature", "bad_envelope"):
        assert fleet.metrics.dead.labels(reason)._value.get() == 1
    stages = [ps.pipe.stage for ps in fleet.parts.values()]
    assert all(s.released < 4.1e9 and set(s.marks) <= {0, 1} for s in stages)
    assert sum(s.stats["released"] for s in stages) > 0      # the real records went on
