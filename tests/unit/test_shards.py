"""The fleet stage's models in shards by host give one fleet stage's alerts (pipeline/shards.py)."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.detection import build_detector
from pipeline.errors import StateError
from pipeline.models.findings import lane_of
from pipeline.resources import rules_dir
from pipeline.schema import DcgmRecord, NcclRecord, NicRecord, ProgressRecord
from pipeline.shards import SCORER, ShardedFleet, shard_of
from producers.sim import Simulator

_DEC = msgspec.json.Decoder(list[DcgmRecord | NcclRecord | NicRecord | ProgressRecord])


@pytest.fixture(scope="module")
def llama3() -> list[list]:
    # 16 hosts: communicators of 8 ranks (a host's GPUs) and of 16 (one GPU of every host), two
    # NCCL lanes that 2 and 4 scorers score apart.
    sim = Simulator(hosts=16, duration=600, seed=2, scenario="llama3")
    return [_DEC.decode(msgspec.json.encode(b)) for b in sim.batches() if b]


def _run(batches: list[list], shards: int, cut: int = 1) -> tuple[list, object]:
    det, diags = build_detector([str(rules_dir())], "auto", shards=shards)
    assert det is not None, diags
    alerts = []
    flat = [r for b in batches for r in b]
    for i in range(0, len(flat), max(1, len(flat) // cut)):
        alerts += det.process(flat[i : i + max(1, len(flat) // cut)]).alerts
    alerts += det.flush().alerts
    return sorted(alerts, key=lambda a: (a.ts, a.id, a.state)), det


@pytest.mark.parametrize(("shards", "cut"), [(2, 7), (4, 1), (5, 40)])
def test_shards_give_one_fleet_stages_alerts(llama3, shards, cut):
    one, _ = _run(llama3, 1)
    split, det = _run(llama3, shards, cut)
    assert any(a.labels.get("source") == "model" and a.state == "firing" for a in one), "a model must alert"
    assert [(a.id, a.state, a.ts, a.summary, a.evidence) for a in split] == [
        (a.id, a.state, a.ts, a.summary, a.evidence) for a in one
    ]
    fleet = det.fleet
    assert isinstance(fleet, ShardedFleet)
    counts = fleet.shard_records()
    assert set(counts) == {*(f"{SCORER}-{i}" for i in range(shards)), *(f"shard-{i}" for i in range(shards))}
    # Every scorer with a lane scored its NCCL records, and none scored another's.
    sizes = {r.nranks for b in llama3 for r in b if isinstance(r, NcclRecord)}
    assert sizes == {8, 16}
    scoring = {lane_of(k) % shards for k in sizes}
    for i in range(shards):
        assert (counts[f"{SCORER}-{i}"] > 0) == (i in scoring)
    hosts = {r.host for b in llama3 for r in b}
    busy = {shard_of(h, shards) for h in hosts}
    # Every shard with hosts scored their DCGM records, and none scored another's.
    for i in range(shards):
        assert (counts[f"shard-{i}"] > 0) == (i in busy)


@pytest.mark.parametrize(("interval", "duration"), [(5.0, 1200), (30.0, 3600)])
def test_shards_at_sparse_sampling(interval, duration):
    """Hosts sampled every 5 and 30 s (and the scenario's silent hosts and lost GPUs): a shard
    has ticks without rows, epochs pass without a sample, and the answer is still one stage's."""
    sim = Simulator(hosts=6, duration=duration, seed=4, scenario="llama3", interval=interval)
    batches = [_DEC.decode(msgspec.json.encode(b)) for b in sim.batches() if b]
    one, _ = _run(batches, 1)
    split, _ = _run(batches, 3, cut=13)
    assert one and [(a.id, a.state, a.ts, a.evidence) for a in split] == [
        (a.id, a.state, a.ts, a.evidence) for a in one
    ]


def test_a_sharded_fleet_is_not_checkpointed(llama3):
    _, det = _run(llama3[:50], 2)
    with pytest.raises(StateError, match="not checkpointed"):
        det.snapshot()
