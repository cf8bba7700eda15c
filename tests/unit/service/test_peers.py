"""What model shards send each other over ``<prefix>.fleet`` is a trust boundary too
(pipeline/service/peers.py): signed under the fleet key as a fleet partition's message (envelope
version 2), and each part, finding, alert and time checked before anything is applied. A message
that fails is a dead letter with its reason and origin, and costs only itself; the host stage's
outbox routes each host's records to its shard."""

from __future__ import annotations

import dataclasses
import math
import os

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.deadletters import BAD_ALERT, BAD_ENVELOPE, BAD_MARK, BAD_SIGNATURE, TOO_LARGE, UNKNOWN_PARTITION, UNSIGNED, WRONG_TYPE
from pipeline.detection import build_stages
from pipeline.errors import StateError
from pipeline.incidents import IncidentStage, default_config
from pipeline.models.findings import LANES, Findings, lane_of
from pipeline.models.statecodec import decode_state, encode_state
from pipeline.resources import rules_dir
from pipeline.schema import AlertEvent, NcclRecord, dcgm
from pipeline.service import peers
from pipeline.service.fleet import FleetTask
from pipeline.service.outbox import Outbox
from pipeline.service.peers import PEER_ENVELOPE
from pipeline.shards import shard_of
from tests.factories import HEALTHY, T0
from tests.fleet_factories import FLEET_KEY, GROUP, TOPIC, envelope, fleet_message

SHARDS = 4
EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300")) // 3


@pytest.fixture(scope="module")
def make_engine():
    built, diags = build_stages([str(rules_dir())], "auto")
    assert built is not None and built.fleet is not None, diags
    return built.fleet


def _task(make_engine, shard: int, key: bytes | None = FLEET_KEY, incidents: bool = False) -> FleetTask:
    stage = IncidentStage(default_config()) if incidents else None
    return FleetTask(make_engine, 2, topic=TOPIC, group=GROUP, key=key, incidents=stage, shard=(shard, SHARDS),
                     forward_alerts=incidents and shard != 0)


def _peer(body: bytes, sender: int, offset: int = 0, to: int = 1, signed_for: int | None = None, **kw) -> object:
    """A shard's message on fleet partition ``to``, signed for partition ``signed_for`` (default ``to``)."""
    env = envelope(body, sender, v=PEER_ENVELOPE, to=to if signed_for is None else signed_for, **kw)
    return fleet_message(env, offset, partition=to)


def _part(task: FleetTask, epoch: int = 1_000, until: int = 1_001) -> dict:
    """A part as a shard of these models makes it, with one cohort of each DCGM model's detector."""
    ms = task.stage.models
    models = {}
    for name, m in ms.models.items():
        parts = {"_decider": m.decider.cohort_part()}
        if m.info.source == "dcgm":
            parts["H100"] = m.proto.clone().cohort_part()
        models[name] = parts
    part = {"epoch": epoch, "until": until, "n_gpus": {"H100": 8, "fleet": 8}, "models": models}
    if ms._context_on:
        part["context"] = ms.context.cohort_part(epoch)
    return decode_state(encode_state(part))


def _findings(model: str = "nccl_rank_straggler", host: str = "n1", lane: int = -1) -> Findings:
    """Findings of one GPU; lane -1: a build's before lanes, whose shard 0 scored them all."""
    return Findings(model, T0, np.array([-1]), np.array([3.0]), np.array([False]), np.array([T0 + 0.2]), {}, True,
                    [(host, 0)], lane)


LANE_OF_2 = next(k for k in range(LANES) if k % SHARDS == 2)  # a lane shard 2 scores


def test_a_signed_part_from_another_shard_reaches_the_exchange(make_engine):
    task = _task(make_engine, 1)
    part = _part(task)
    assert task.check(_peer(peers.encode({"parts": [part]}), 2)) == []
    assert task.stage.exchange.published["shard-2"][-1]["epoch"] == 1_000
    # Read again (its sender restarted from a checkpoint): the same part is not taken twice.
    assert task.check(_peer(peers.encode({"parts": [part]}), 2, offset=1)) == []
    assert len(task.stage.exchange.published["shard-2"]) == 1 and task.stage.stats["parts_again"] == 1


@pytest.mark.parametrize(("how", "reason"), [
    (dict(key=None), UNSIGNED),
    (dict(key=b"another-key-0123456789abcdef0123"), BAD_SIGNATURE),
    (dict(signed_as=3), BAD_SIGNATURE),          # shard 3's MAC on a message that names shard 2
    (dict(group="other"), BAD_SIGNATURE),
    (dict(signed_for=3), BAD_SIGNATURE),         # shard 2's message for partition 3, copied onto 1
])
def test_a_peer_message_that_does_not_verify_is_refused(make_engine, how, reason):
    task = _task(make_engine, 1)
    dead = task.check(_peer(peers.encode({"parts": [_part(task)]}), 2, **how))
    assert [d.reason for d in dead] == [reason]
    assert task.stage.exchange.published["shard-2"] == []


def test_a_host_stage_message_cannot_be_replayed_as_a_shards():
    # The same sender number, body and key, signed as a telemetry partition's (version 1): the
    # MAC binds the version, so it does not verify as a fleet partition's.
    from pipeline.service.fleetwire import mac

    body = peers.encode({"parts": [{"epoch": 1, "until": 2}]})
    v1 = mac(FLEET_KEY, TOPIC, GROUP, 2, body)
    assert v1 != mac(FLEET_KEY, TOPIC, GROUP, 2, body, PEER_ENVELOPE)


@pytest.mark.parametrize("sender", [-1, 1, SHARDS, 2**40])
def test_a_peer_message_from_no_other_shard_is_refused(make_engine, sender):
    task = _task(make_engine, 1)
    dead = task.check(_peer(peers.encode({}), sender))
    assert [d.reason for d in dead] == [UNKNOWN_PARTITION]


def test_a_peer_message_to_a_service_without_shards_is_refused(make_engine):
    task = FleetTask(make_engine, 2, topic=TOPIC, group=GROUP, key=FLEET_KEY)
    dead = task.check(_peer(peers.encode({}), 1))
    assert [d.reason for d in dead] == [BAD_ENVELOPE]


def _bad_parts(task: FleetTask) -> list:
    good = _part(task)
    hst = next(n for n, m in task.stage.models.models.items() if m.spec.detector == "cohort_hst")
    counters = next(n for n, m in task.stage.models.models.items() if m.spec.detector == "counter_rate")
    thermal = next(n for n, m in task.stage.models.models.items() if m.spec.detector == "thermal_residual")
    bad = []
    for change in (
        {"epoch": 5, "until": 4},
        {"epoch": 1.5},
        {"until": "x"},
        {"secret": 1},
        {"models": {"not-a-model": {}}},
        {"n_gpus": {"H100": -3}},
        {"n_gpus": {"H100": 1.5}},
        {"context": {"epoch": 999, "seen": np.zeros(18, np.int64), "capped": np.zeros(18, np.int64)}},
    ):
        bad.append({**good, **change})
    for name, cohort_part in (
        (hst, {"n": 3, "mass": np.zeros(7, np.int64)}),                    # not this forest's shape
        (hst, {"n": -1}),
        (counters, {"rates": np.array([np.nan]), "counts": np.array([1])}),
        (counters, {"rates": np.array([0.1]), "counts": np.array([-1])}),
        (counters, {"rates": np.array([0.1]), "counts": np.array([0.5])}),  # counts as floats
        (thermal, {"sums": [1] * 3}),
        (thermal, {"sums": [2**63] * 9}),                                 # past an int64
    ):
        bad.append({**good, "models": {**good["models"], name: {"_decider": {}, "H100": cohort_part}}})
    return bad


def test_a_part_that_no_shard_makes_is_refused_whole(make_engine):
    task = _task(make_engine, 1)
    for i, part in enumerate(_bad_parts(task)):
        dead = task.check(_peer(peers.encode({"parts": [part]}), 2, offset=i))
        assert [d.reason for d in dead] == [WRONG_TYPE], part
    assert task.stage.exchange.published["shard-2"] == []


def test_too_many_parts_in_one_message_are_refused(make_engine):
    task = _task(make_engine, 1)
    parts = [{"epoch": e, "until": e + 1} for e in range(peers.MAX_PARTS + 1)]
    dead = task.check(_peer(peers.encode({"parts": parts}), 2))
    assert [d.reason for d in dead] == [TOO_LARGE]


def test_findings_come_only_from_their_lanes_scorer_and_only_well_formed(make_engine):
    task = _task(make_engine, 1)
    mine = _findings(lane=LANE_OF_2)
    assert task.check(_peer(peers.encode({"findings": [mine], "scored": T0 + 1}), 2)) == []
    assert task.stage.scored_by[2] == T0 + 1 and len(task.stage.models.nccl.inbox) == 1
    assert task.stage.scored == -math.inf  # the other scorers have said nothing yet
    # Read again: the lane's tick is not taken twice; another lane's of the same tick is.
    assert task.check(_peer(peers.encode({"findings": [mine], "scored": T0 + 1}), 2, offset=1)) == []
    assert len(task.stage.models.nccl.inbox) == 1
    other = _findings(lane=LANE_OF_2 + SHARDS)
    assert task.check(_peer(peers.encode({"findings": [other], "scored": T0 + 1}), 2, offset=2)) == []
    assert len(task.stage.models.nccl.inbox) == 2
    hostile = [
        (peers.encode({"findings": [mine], "scored": T0 + 2}), 3),                   # not its lane's scorer
        (peers.encode({"findings": [_findings()], "scored": T0 + 2}), 2),            # all lanes: only shard 0's
        (peers.encode({"findings": [_findings("thermal_hotter_than_load")], "scored": T0 + 2}), 0),   # a DCGM model
        (peers.encode({"findings": [_findings(host="")], "scored": T0 + 2}), 0),
        (peers.encode({"scored": math.nan}), 0),
        (peers.encode({"scored": 5.0}), 0),                                          # before the decoder's range
        (peers.encode({"done": T0}), 0),                                             # alerts' progress, not to shard 1
    ]
    for i, (body, sender) in enumerate(hostile):
        assert [d.reason for d in task.check(_peer(body, sender, offset=3 + i))] == [WRONG_TYPE]
    assert task.stage.scored_by == [-math.inf, -math.inf, T0 + 1, -math.inf]


def test_findings_over_several_messages_all_arrive_and_the_progress_comes_last(make_engine):
    task = _task(make_engine, 1)
    found = [dataclasses.replace(_findings(), tick=T0 + i) for i in range(peers.MAX_FINDINGS + 10)]
    bodies = peers.chunks([], found, [], T0 + len(found), None)
    assert len(bodies) == 2
    for i, body in enumerate(bodies):
        assert task.check(_peer(body, 0, offset=i)) == []
        assert task.stage.scored_by[0] == (-math.inf if i == 0 else T0 + len(found))
    assert [f.tick for f in task.stage.models.nccl.inbox] == [f.tick for f in found]


def test_a_shards_alerts_reach_shard_0s_incident_stage_and_a_bad_one_costs_only_itself(make_engine):
    task = _task(make_engine, 0, incidents=True)
    good = AlertEvent(id="a1", state="firing", fault="f", severity="warning", rule="model:x", host="n1", ts=T0,
                      started_at=T0)
    bad = msgspec.structs.replace(good, id="a2", state="maybe")
    dead = task.check(_peer(peers.encode({"alerts": [good, bad], "done": T0 + 5}), 3, to=0))
    assert [d.reason for d in dead] == [BAD_ALERT]
    assert len(task.feed) == 1 and task.peer_done == {3: T0 + 5}
    # An array where an alert should be (msgpack's extension type): refused, not an internal error.
    raw = encode_state({"parts": [], "findings": [], "scored": None, "alerts": [np.zeros(3)], "done": None})
    assert [d.reason for d in task.check(_peer(raw, 3, offset=1, to=0))] == [WRONG_TYPE]


def test_a_peer_message_survives_a_checkpoint(make_engine):
    task = _task(make_engine, 1)
    part = _part(task)
    task.check(_peer(peers.encode({"parts": [part]}), 2))
    task.check(_peer(peers.encode({"findings": [_findings()], "scored": T0 + 1}), 0, offset=1))
    again = _task(make_engine, 1)
    again.restore(task.snapshot())
    assert again.stage.exchange.published["shard-2"][-1]["epoch"] == 1_000
    assert again.stage.scored_by == [T0 + 1, -math.inf, -math.inf, -math.inf]
    assert len(again.stage.models.nccl.inbox) == 1
    with pytest.raises(StateError, match="shard 1 of 4"):
        _task(make_engine, 2).restore(task.snapshot())


def _mark(upto: float, nccl) -> bytes:
    body = {"mark": 0, "upto": upto, "final": False, "n": 2}
    if nccl != "absent":
        body["nccl"] = nccl
    return envelope(msgspec.json.encode(body), 0)


def test_a_shard_waits_for_the_scorers_the_marks_name_and_tells_its_progress_if_named(make_engine):
    task = _task(make_engine, 1)
    assert task.stage.waits_on == set() and not task.stage.tells_progress()
    assert task.check(fleet_message(_mark(T0, [2]), 0, partition=1)) == []
    assert task.check(fleet_message(_mark(T0 + 1, [1]), 1, partition=1)) == []
    assert task.stage.waits_on == {1, 2} and task.stage.tells_progress()
    task.stage.scored_by = [T0 + 9, T0 + 5, T0 + 3, -math.inf]
    assert task.stage.scored == T0 + 3  # scorers 1 and 2 only: 0 and 3 have nothing to score
    again = _task(make_engine, 1)
    again.restore(task.snapshot())
    assert again.stage.waits_on == {1, 2}
    # A mark that does not say (a host stage of an earlier build): every scorer, from then on.
    assert task.check(fleet_message(_mark(T0 + 2, "absent"), 2, partition=1)) == []
    assert task.stage.waits_on is None and task.stage.scored == -math.inf


@pytest.mark.parametrize("nccl", [[SHARDS], [-1], [0] * (SHARDS + 1), ["1"]])
def test_a_mark_naming_partitions_that_are_not_scorers_is_refused(make_engine, nccl):
    task = _task(make_engine, 1)
    dead = task.check(fleet_message(_mark(T0, nccl), 0, partition=1))
    assert [d.reason for d in dead] == [BAD_MARK if nccl != ["1"] else WRONG_TYPE]
    assert task.stage.waits_on == set()


def test_a_shards_checkpoint_from_before_lanes_is_read(make_engine):
    """Shard state version 1: shard 0 scored every lane, so its progress word was the only one."""
    task = _task(make_engine, 1)
    task.check(_peer(peers.encode({"findings": [_findings()], "scored": T0 + 1}), 0))
    outer = msgspec.msgpack.decode(task.snapshot())
    st = decode_state(outer["stage"])
    st.update(shard_stage=1, scored=st.pop("scored_by")[0], last_tick={"nccl_rank_straggler": T0})
    outer["stage"] = encode_state(st)
    again = _task(make_engine, 1)
    again.restore(msgspec.msgpack.encode(outer))
    assert again.stage.scored_by == [T0 + 1, -math.inf, -math.inf, -math.inf]
    # Shard 0's findings of that tick, read again after the upgrade: not taken twice.
    assert again.check(_peer(peers.encode({"findings": [_findings()], "scored": T0 + 1}), 0, offset=1)) == []
    assert len(again.stage.models.nccl.inbox) == 1 and again.stage.stats["findings_again"] == 1


def test_the_outbox_sends_each_hosts_records_to_its_shard_and_each_mark_to_every_shard():
    box = Outbox(1, 2, TOPIC, group=GROUP, key=FLEET_KEY, shards=SHARDS)
    hosts = [f"gpu-node-{i:03d}" for i in range(12)]
    box.feed([dcgm(T0, h, 0, HEALTHY) for h in hosts])
    box.feed([NcclRecord(ts=T0, host="gpu-node-000", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=1,
                         exec_time_us=1.0, busbw_gbs=1.0)])
    box.mark(1, T0 + 1)
    sends = box.take()
    by_part: dict[int, list[bytes]] = {}
    for topic, _key, value, partition in sends:
        assert topic == TOPIC and partition is not None
        by_part.setdefault(partition, []).append(msgspec.msgpack.decode(value)[2])
    marks = [(p, b) for p, bodies in by_part.items() for b in bodies if b.startswith(b'{"mark"')]
    assert sorted(p for p, _ in marks) == list(range(SHARDS))
    # Each mark names the partitions the task has sent NCCL records to: whose scorers to wait for.
    assert {msgspec.json.decode(b)["nccl"] == [lane_of(2) % SHARDS] for _, b in marks} == {True}
    from pipeline.service.forwarded import Columns

    nccl_to = []
    for p, bodies in by_part.items():
        for b in bodies:
            if not b.startswith(b"{"):
                cols = msgspec.msgpack.decode(b, type=Columns)
                assert {shard_of(h, SHARDS) for h in cols.hosts} <= {p}
                nccl_to += [p] * len(cols.other)
    assert nccl_to == [lane_of(2) % SHARDS] != [0]  # the NCCL record: to its lane's scorer


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
                    | st.binary(max_size=8) | st.builds(np.zeros, st.integers(0, 4), st.sampled_from(["i8", "f8", "?"])),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=20),
       st.sampled_from(["parts", "findings", "alerts", "scored", "done"]),
       st.integers(0, SHARDS - 1))
def test_fuzz_any_signed_peer_body_is_applied_or_dead_lettered(make_engine, value, where, sender):
    task = _task(make_engine, 0 if sender else 1, incidents=True)
    body = {"parts": [], "findings": [], "scored": None, "alerts": [], "done": None}
    body[where] = value
    raw = encode_state(body)
    dead = task.check(_peer(raw, sender, to=task.stage.shard))
    assert all(d.reason in (WRONG_TYPE, TOO_LARGE, BAD_ALERT, UNKNOWN_PARTITION) for d in dead)
    task.stage.advance()
