"""The models split into shards by host give one process's alerts and scores (pipeline/models/cohorts.py).

Each shard is a fleet engine with the default models over some of the hosts; the shards meet
only through a ``SharedExchange`` of their epoch parts, and a driver releases each shard only
as far as every shard's parts allow. The NCCL records go to one more engine, the scorer: a
communicator spans hosts, so its models score where every rank is, and their findings go to
the shards of the GPUs they name (pipeline/models/findings.py). The reference is one engine
over everything, the way replay runs the fleet stage.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.engine import Engine
from pipeline.engine.config import EngineConfig
from pipeline.models.cohorts import EPOCH_S, LAG_EPOCHS, CohortExchange, LocalExchange, SharedExchange, epoch_of
from pipeline.models.config import load_model_specs, spec_from_mapping
from pipeline.models.modelset import ModelSet
from pipeline.resources import default_models
from pipeline.schema import DcgmRecord, NcclRecord


# The default models and a Half-Space forest small enough to be warm within a short run (its
# forest, window swaps and quantile decider are cohort state too).
SMALL_HST = {
    "name": "hst_small", "detector": "cohort_hst", "fault": "gpu_test_anomaly", "warmup": 100,
    "params": {"window_size": 50}, "decider": {"kind": "quantile", "q": 0.99, "margin": 1.1, "floor": 0.5},
}  # fmt: skip


def _fleet_engine(exchange: CohortExchange, shard: str) -> tuple[Engine, ModelSet]:
    ms = ModelSet([*load_model_specs(default_models()), spec_from_mapping(SMALL_HST, "models[6]")])
    ms.epochs.exchange, ms.epochs.shard = exchange, shard
    return Engine(EngineConfig(), row_checks=[], tick_checks=[], models=ms, screened=True), ms


def _scores(ms: ModelSet, seen: dict) -> None:
    """Keep every evaluated row's scores, by (host, GPU index, ts)."""
    orig = ms.evaluate

    def spy(view, entities):
        out = orig(view, entities)
        for name, sc in ms.scores.items():
            for g, t, s in zip(view.frame.gpu.tolist(), view.frame.ts.tolist(), sc.tolist()):
                seen[(name, *entities.gpus[g], t)] = s
        return out

    ms.evaluate = spy  # type: ignore[method-assign]


def run_sharded(records: list, shard_of: dict[str, int], n: int) -> tuple[list, dict]:
    """Alerts and per-row scores of ``n`` shards and an NCCL scorer (``n == 1``: one engine for
    everything, as replay runs it)."""
    names = [str(i) for i in range(n)]
    exchange: CohortExchange = LocalExchange() if n == 1 else SharedExchange(names)
    shards = [_fleet_engine(exchange, s) for s in names]
    seen: dict = {}
    for eng, ms in shards:
        _scores(ms, seen)
    dcgm = [r for r in records if isinstance(r, DcgmRecord)]
    nccl = [r for r in records if isinstance(r, NcclRecord)]
    scorer: tuple[Engine, ModelSet] | None = None
    if n == 1:
        shards[0][0].process(records)
    else:
        scorer = _fleet_engine(LocalExchange(), "nccl")
        scorer[1].nccl.out = []
        scorer[0].process(nccl)
        for i, (eng, ms) in enumerate(shards):
            ms.nccl.remote = True
            eng.process([r for r in dcgm if shard_of[r.host] % n == i])
    start, end = epoch_of(min(r.ts for r in records)), max(r.ts for r in records) + 1
    alerts = []
    released = -math.inf
    while released < end:
        b = exchange.bound() if isinstance(exchange, SharedExchange) else None
        upto = min(end, ((start if b is None else b) + (LAG_EPOCHS if b is None else 0)) * EPOCH_S)
        if n == 1:
            upto = end
        assert upto > released, "the shards' parts must let the release go on"
        if scorer is not None:
            alerts += scorer[0].advance_to(upto).alerts
            _hand_over(scorer[1], [ms for _, ms in shards], shard_of)
        for eng, _ in shards:
            alerts += eng.advance_to(upto).alerts
        released = upto
    for eng, _ in shards:
        alerts += eng.flush().alerts
    return sorted(alerts, key=lambda a: (a.ts, a.id, a.state)), seen


def _hand_over(scorer: ModelSet, shards: list[ModelSet], shard_of: dict[str, int]) -> None:
    """Each finding's rows to the shard of their host (every shard gets every tick's, even with
    no rows of its own: the model's warmth comes with them)."""
    assert scorer.nccl.out is not None
    for f in scorer.nccl.out:
        level_gpu = isinstance(f.keys[0], tuple) if f.keys else True
        hosts = f.hosts(level_gpu)
        for i, ms in enumerate(shards):
            ms.nccl.inbox.append(f.take([j for j, h in enumerate(hosts) if shard_of[h] % len(shards) == i]))
    scorer.nccl.out.clear()


def _fleet(sim_streams, fault: str, duration: float, onset: float) -> list:
    _, batches = sim_streams(fault, hosts=4, duration=duration, onset=onset, seed=5)
    recs = [r for b in batches for r in b if isinstance(r, (DcgmRecord, NcclRecord))]
    # The fleet stage's canonical order (canonical.record_identity): DCGM rows, then NCCL records.
    return sorted(recs, key=lambda r: (r.ts, r.host, isinstance(r, NcclRecord), r.gpu if r.gpu is not None else -1,
                                       getattr(r, "comm", ""), getattr(r, "rank", 0)))


@pytest.fixture(scope="module")
def straggler_fleet(sim_streams) -> list[DcgmRecord]:
    return _fleet(sim_streams, "thermal_throttling", 1200.0, 700.0)


@pytest.mark.parametrize(
    ("fault", "duration", "onset", "n", "model"),
    [
        ("thermal_throttling", 1200.0, 700.0, 2, "thermal_hotter_than_load"),
        ("thermal_throttling", 1200.0, 700.0, 3, "thermal_hotter_than_load"),
        ("hbm_ecc_burst", 700.0, 400.0, 3, "hbm_sbe_rate"),
        ("nccl_straggler", 900.0, 500.0, 2, "nccl_rank_straggler"),
    ],
)
def test_shards_give_one_process_alerts_and_scores(sim_streams, fault, duration, onset, n, model):
    fleet = _fleet(sim_streams, fault, duration, onset)
    hosts = sorted({r.host for r in fleet})
    one, one_scores = run_sharded(fleet, {h: 0 for h in hosts}, 1)
    split, split_scores = run_sharded(fleet, {h: i for i, h in enumerate(hosts)}, n)
    assert {a.rule for a in one if a.state == "firing"} >= {model}, "the fault must raise its model's alert"
    hst = [v for k, v in one_scores.items() if k[0] == "hst_small" and np.isfinite(v)]
    assert hst and max(hst) > 0, "the forest must be warm and scoring"
    assert [(a.id, a.state, a.ts, a.evidence) for a in split] == [(a.id, a.state, a.ts, a.evidence) for a in one]
    assert split_scores.keys() == one_scores.keys()
    a = np.array([one_scores[k] for k in one_scores])
    b = np.array([split_scores[k] for k in one_scores])
    assert np.array_equal(a, b, equal_nan=True)


def test_a_shard_without_rows_still_closes_its_epochs(straggler_fleet):
    """A shard whose hosts all went elsewhere advances with the others (its parts are empty):
    it never holds them back, and the answer is the one process's."""
    hosts = sorted({r.host for r in straggler_fleet})
    one, _ = run_sharded(straggler_fleet, {h: 0 for h in hosts}, 1)
    split, _ = run_sharded(straggler_fleet, {h: 0 for h in hosts}, 2)  # shard 1 gets nothing
    assert [(a.id, a.state, a.ts) for a in split] == [(a.id, a.state, a.ts) for a in one]
