"""Alerts carry the job (and pod/namespace) from the telemetry: DCGM records' labels (dcgm-exporter's
``pod``/``namespace``/``container``, ``hpc_job``, a ``job`` label) and NCCL records' ``job``; kept per
GPU (and host) in the engine's entity state, snapshotted and restored (docs/architecture.md §3)."""

from __future__ import annotations

import msgspec
import numpy as np

from pipeline.decode import Decoder
from pipeline.engine import Engine
from pipeline.engine.entities import Entities
from pipeline.schema import NcclRecord, dcgm, encode
from tests.factories import T0

HOT = {"clocks_event_reasons": 0x40, "gpu_util": 99, "gpu_temp": 90, "sm_clock": 1005}


def _run(eng: Engine, records, *, fast: bool = True):
    """Records through the wire format and the engine's own decoder (the fast path), or the
    full decoder (``fast=False``: labels as a dict, as the slow path and replay of all fields)."""
    dec = Decoder(fields=eng.decode_fields if fast else None)
    out = dec.decode_many([encode(r) for r in records], [f"t:{i}" for i in range(len(records))])
    assert not out.dead
    res = eng.process(out.records, out.origins)
    res.extend(eng.flush())
    return res.alerts


def test_a_gpu_alert_carries_the_job_pod_and_namespace_of_its_records():
    eng = Engine()
    labels = {"job": "train-42", "pod": "trainer-0", "namespace": "research", "container": "pytorch",
              "cluster": "c1", "UUID": "GPU-1"}
    alerts = _run(eng, [dcgm(T0 + t, "n1", 0, HOT, labels=labels) for t in range(20)])
    assert [a.fault for a in alerts] == ["thermal_throttling"]
    a = alerts[0]
    assert a.job == "train-42"
    assert a.labels == {"pod": "trainer-0", "namespace": "research", "container": "pytorch"}


def test_the_slow_path_labels_dict_and_hpc_job_are_read_too():
    eng = Engine()
    alerts = _run(eng, [dcgm(T0 + t, "n1", 0, HOT, labels={"hpc_job": "1234"}) for t in range(20)], fast=False)
    assert alerts[0].job == "1234" and alerts[0].labels == {}


def test_the_latest_job_wins():
    eng = Engine()
    recs = [dcgm(T0 + t, "n1", 0, HOT, labels={"job": "old" if t < 5 else "new", "namespace": "ns"})
            for t in range(20)]
    a = _run(eng, recs)[0]
    assert a.job == "new"
    ent = Entities()
    ent.gpu("n1", 0)
    assert ent.job_labels(0) == {}


def test_nccl_job_fills_in_where_dcgm_has_none():
    eng = Engine()
    nccl = [NcclRecord(ts=T0 + t, host="n1", gpu=0, job="llm-7", comm="c", rank=0, nranks=8, coll="AllReduce",
                       bytes=1 << 20, exec_time_us=100.0) for t in range(20)]
    dc = [dcgm(T0 + t, "n1", 0, HOT) for t in range(20)]
    recs = [r for pair in zip(dc, nccl) for r in pair]
    assert _run(eng, recs)[0].job == "llm-7"


def test_a_label_that_is_not_an_identifier_is_left_out():
    eng = Engine()
    alerts = _run(eng, [dcgm(T0 + t, "n1", 0, HOT, labels={"job": "a\nb", "pod": "p" * 300}) for t in range(20)])
    assert alerts[0].job is None and alerts[0].labels == {}


def test_host_level_job_is_the_one_its_gpus_agree_on():
    ent = Entities()
    recs = [dcgm(T0, "n1", g, labels={"job": "j1", "namespace": "ns"}) for g in range(4)]
    ids = ent.gpu_ids(["n1"] * 4, range(4))
    ent.note_labels(ids, recs)
    assert ent.host_job_labels(0) == {"job": "j1", "namespace": "ns"}
    ent.note_labels(ids[2:], [dcgm(T0, "n1", g, labels={"job": "j2", "namespace": "ns"}) for g in (2, 3)])
    assert ent.host_job_labels(0) == {"jobs": "j1,j2", "namespace": "ns"}
    # A host known from NCCL records only.
    ent.host("n2")
    ent.note_nccl([NcclRecord(ts=T0, host="n2", job="j9", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=1,
                              exec_time_us=1.0)])
    assert ent.host_job_labels(1) == {"job": "j9"}


def test_jobs_survive_snapshot_and_restore_and_old_snapshots_still_read():
    eng = Engine()
    _run(eng, [dcgm(T0 + t, "n1", 0, {"gpu_temp": 50}, labels={"job": "train-42", "pod": "p0"}) for t in range(5)])
    eng.entities.note_nccl([NcclRecord(ts=T0, host="n1", gpu=None, job="j-nccl", comm="c", rank=0, nranks=2,
                                       coll="AllReduce", bytes=1, exec_time_us=1.0)])
    blob = eng.snapshot()
    back = Engine()
    back.restore(blob)
    assert back.entities.job_labels(0) == {"job": "train-42", "pod": "p0"}
    assert back.entities.nccl_jobs["n1"] == "j-nccl"
    # Written before jobs were kept: no labels, no NCCL jobs; every job unknown, nothing else lost.
    data = msgspec.msgpack.decode(blob)
    del data["entities"]["labels"], data["entities"]["nccl_jobs"]
    old = Engine()
    old.restore(msgspec.msgpack.encode(data))
    assert old.entities.job_labels(0) == {} and old.entities.gpus == [("n1", 0)]
    np.testing.assert_array_equal(old.state.last_ts, back.state.last_ts)


def _wire(labels: bytes) -> bytes:
    return b'{"kind":"dcgm","ts":1764403200,"host":"h","gpu":0,"labels":' + labels + b',"fields":{}}'


def test_odd_labels_cost_only_themselves():
    # Reading labels must not start losing records it used to keep: a Slurm job id written as a
    # number is the job, null is no labels, a label of another type is dropped on its own.
    eng = Engine()
    for dec in (Decoder(fields=eng.decode_fields), Decoder()):
        out = dec.decode(_wire(b'{"job":1234}'), "t:1")
        assert len(out.records) == 1 and not out.dead
        ent = Entities()
        ent.note_labels(ent.gpu_ids(["h"], [0]), out.records)
        assert ent.job_labels(0) == {"job": "1234"}
        out = dec.decode(_wire(b"null"), "t:2")
        assert len(out.records) == 1 and not out.dead
        out = dec.decode(_wire(b'{"job":"j","pod":[1],"x":{"y":1}}'), "t:3")
        assert len(out.records) == 1
        assert [(d.reason, d.action, d.fields) for d in out.dead] == \
            [("wrong_type", "fields_dropped", ["labels.pod", "labels.x"])]
        out = dec.decode(_wire(b'"not an object"'), "t:4")
        assert len(out.records) == 1 and out.dead[0].fields == ["labels"]
