"""The serve path's interfaces (pipeline/protocols.py): each implementation conforms, and a
two-stage detector returns what its host stage forwarded."""

from __future__ import annotations

import math

from pipeline.detection import Stages, build_detector
from pipeline.engine import Engine, EngineOutput
from pipeline.protocols import Detector, FleetSide, PartitionTask
from pipeline.runner import Pipeline
from pipeline.service.fleet import FleetTask
from pipeline.service.outbox import Outbox
from pipeline.service.partitions import ForwardingPipeline
from pipeline.fleetstage import FleetStage
from pipeline.topology import Topology
from pipeline.decode import Decoder
from pipeline.resources import rules_dir
from pipeline.shards import shard_of
from tests.factories import sample


def _fleet_engine() -> Engine:
    return Engine(row_checks=[], tick_checks=[], screened=True)


def test_engines_and_topologies_are_detectors():
    det, _ = build_detector([str(rules_dir())], "auto")
    assert isinstance(det, Topology)
    for d in (Engine(), det, Topology(Engine(), _fleet_engine, local_fleet=False)):
        assert isinstance(d, Detector)
    checked: list[Detector] = [Engine(), det]  # mypy checks the same of pipeline/ (detection.py)
    assert len(checked) == 2


def test_the_fleet_stage_and_the_outbox_are_fleet_sides():
    assert isinstance(FleetStage(_fleet_engine), FleetSide)
    assert isinstance(Outbox(0, 1, "t.fleet"), FleetSide)


def test_pipelines_and_fleet_tasks_are_partition_tasks():
    topo = Topology(Engine(), _fleet_engine, local_fleet=False)
    for task in (Pipeline(Engine()), ForwardingPipeline(topo, Decoder(), Outbox(0, 1, "t.fleet")),
                 FleetTask(_fleet_engine, 1)):
        assert isinstance(task, PartitionTask)


def test_process_returns_what_the_host_stage_forwarded():
    recs = [sample(t, "n1", g, gpu_temp=50) for t in range(5) for g in range(2)]
    local = Topology(Engine(), _fleet_engine)
    out = local.process(recs)
    assert isinstance(out, EngineOutput) and list(out.forwarded) == recs
    assert local.fleet is not None and local.fleet.stats["fed"] == len(recs)
    assert list(local.process([]).forwarded) == []            # nothing is forwarded twice
    remote = Topology(Engine(), _fleet_engine, local_fleet=False)
    out = remote.process(recs)
    assert list(out.forwarded) == recs and remote.fleet is None and remote.pending == remote.host.pending
    # The decoder reads what either stage reads.
    assert set(_fleet_engine().decode_fields) <= set(remote.decode_fields)


def test_a_forwarding_pipeline_queues_what_it_forwarded_then_its_mark():
    from pipeline.bus.base import Message
    import msgspec

    outbox = Outbox(3, 4, "t.fleet")
    pipe = ForwardingPipeline(Topology(Engine(), _fleet_engine, local_fleet=False), Decoder(), outbox)
    msgs = [Message("t", 3, i, None, msgspec.json.encode(sample(i, "n1", 0, gpu_temp=50))) for i in range(4)]
    out = pipe.handle_guarded(msgs)
    assert len(out.forwarded) == 4 and outbox.upto == pipe.engine.released
    sends = outbox.take()
    assert len(sends) == 2 and not outbox.final_sent()     # the records, then the mark
    before = outbox.upto
    pipe.flush()
    assert outbox.upto == before and math.isfinite(before)
    assert len(outbox.take()) == 1 and outbox.final_sent()  # a final mark, the bound unchanged


def test_a_forwarding_pipeline_marks_the_hosts_its_engine_released_ahead():
    from pipeline.bus.base import Message
    import msgspec

    def marks(box: Outbox) -> list[dict]:
        bodies = [msgspec.msgpack.decode(v)[2] for _, _, v, _ in box.take()]
        return [msgspec.json.decode(b) for b in bodies if b.startswith(b'{"mark"')]

    host = Engine()
    host.release_hosts = True  # as the service's host stage
    outbox = Outbox(0, 1, "t.fleet")
    pipe = ForwardingPipeline(Topology(host, _fleet_engine, local_fleet=False), Decoder(), outbox)
    # n1 samples at .1 of each second, n2 at .8: n1's sample of the last second makes it complete
    # for it while n2 has not sent it yet.
    recs = [sample(s + phase, h, 0, gpu_temp=50) for s in range(40) for h, phase in (("n1", 0.1), ("n2", 0.8))]
    recs.append(sample(40.1, "n1", 0, gpu_temp=50))
    pipe.handle_guarded([Message("t", 0, i, None, msgspec.json.encode(r)) for i, r in enumerate(recs)])
    released = pipe.engine.released
    (mark,) = marks(outbox)
    assert mark["upto"] == released and mark["hosts"] == {"n1": released + 1}
    # A fleet stage whose models are not host-local (NCCL models on) runs none early: no hosts go.
    box = Outbox(0, 1, "t.fleet", hosts_ahead=False)
    box.mark(0, released, hosts={"n1": released + 1})
    assert [m["hosts"] for m in marks(box)] == [None]
    # With model shards each fleet partition's mark names the hosts of its shard.
    box = Outbox(0, 1, "t.fleet", shards=4)
    hosts = {f"n{i}": released + 1 for i in range(12)}
    box.mark(0, released, hosts=hosts)
    got: dict[str, int] = {}
    for _, _, value, partition in box.take():
        body = msgspec.msgpack.decode(value)[2]
        if body.startswith(b'{"mark"'):
            for h in msgspec.json.decode(body)["hosts"] or {}:
                got[h] = partition
    assert got == {h: shard_of(h, 4) for h in hosts} and len(set(got.values())) > 1
    # A host released further moves the mark though its bound does not.
    outbox.mark(0, released, hosts={"n1": released + 1})
    assert marks(outbox) == []
    outbox.mark(0, released, hosts={"n1": released + 1, "n2": released + 1})
    assert [m["hosts"] for m in marks(outbox)] == [{"n1": released + 1, "n2": released + 1}]


def test_stages_build_one_engine_or_two_stages():
    assert isinstance(Stages(Engine()).detector(), Engine)
    two = Stages(Engine(), _fleet_engine).detector(local_fleet=False)
    assert isinstance(two, Topology) and two.fleet is None
