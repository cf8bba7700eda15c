"""The fleet stage's models in shards by host, in one process (docs/models.md#cohort-state-by-epochs).

``ShardedFleet`` is a ``FleetStage`` whose released DCGM records go to ``n`` shard engines by
host (``shard_of``: crc32 of the host's name) and whose NCCL records go to ``n`` scorer engines
by lane (``scorer_of``: a communicator size's lane, ``findings.lane_of``), the progress records
to the first. The shards meet only through a ``SharedExchange`` of their cohort parts and the
scorers' NCCL findings (``pipeline/models/findings.py``), and each step of a release goes no
further than every shard's parts allow. Its alerts are one ``FleetStage``'s for any ``n``
(tests/unit/test_shards.py): the dataflow that lets the models' work spread over processes,
run without a broker, and what ``replay --fleet-shards`` runs to measure each shard's share.

>>> shard_of("gpu-node-000", 4), shard_of("gpu-node-001", 4)
(3, 1)
"""

from __future__ import annotations

import math
import time
import zlib
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pipeline import rows
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import StateError
from pipeline.models.cohorts import EPOCH_S, LAG_EPOCHS, SharedExchange, epoch_of
from pipeline.models.findings import Findings, lane_of
from pipeline.models.modelset import ModelSet
from pipeline.schema import NcclRecord, TelemetryRecord
from pipeline.fleetstage import FLEET_KEY, FleetStage

SCORER = "nccl"  # the key of an engine that scores NCCL lanes and runs no DCGM rows


def shard_of(host: str, n: int) -> int:
    """The shard of a host's GPUs: the same in every process (zlib's crc32, not ``hash``)."""
    return zlib.crc32(host.encode("utf-8", "surrogatepass")) % n


def shard_memo(host: str, n: int, memo: dict[str, int]) -> int:
    """``shard_of``, each host hashed once (``memo``: host -> shard, kept by the caller).

    >>> memo: dict[str, int] = {}
    >>> shard_memo("gpu-node-001", 4, memo) == shard_of("gpu-node-001", 4), memo
    (True, {'gpu-node-001': 1})
    """
    s = memo.get(host)
    if s is None:
        s = memo[host] = shard_of(host, n)
    return s


def by_shard(dcgm: Sequence[TelemetryRecord], n: int, memo: dict[str, int]) -> dict[int, Sequence[TelemetryRecord]]:
    """DCGM rows by the shard of their host (``shard_of``), each shard's in their order;
    columns stay columns. ``memo``: each host's shard, hashed once.

    >>> from pipeline.schema import dcgm
    >>> got = by_shard([dcgm(0.0, h, 0, {}) for h in ("gpu-node-001", "gpu-node-000", "gpu-node-001")], 4, {})
    >>> {s: [r.host for r in part] for s, part in got.items()}
    {1: ['gpu-node-001', 'gpu-node-001'], 3: ['gpu-node-000']}
    """
    by: dict[int, list[int]] = {}
    for i, h in enumerate(rows.hosts(dcgm)):
        by.setdefault(shard_memo(h, n, memo), []).append(i)
    return {s: rows.take(dcgm, np.array(ix, np.int64)) for s, ix in by.items()}


def scorer_of(rec: TelemetryRecord, n: int) -> int:
    """Which of ``n`` scorers takes a record that is not a DCGM sample: an NCCL record's lane's
    (``lane_of`` its communicator size, modulo ``n``); anything else (progress) the first's.

    >>> from pipeline.schema import NcclRecord
    >>> nccl = lambda k: NcclRecord(ts=1.0, host="a", comm="c", rank=0, nranks=k, coll="AllReduce", bytes=8, exec_time_us=1.0)
    >>> scorer_of(nccl(8), 8), scorer_of(nccl(64), 8), scorer_of(nccl(64), 1)
    (3, 7, 0)
    """
    return lane_of(rec.nranks) % n if isinstance(rec, NcclRecord) else 0


def by_scorer(other: Sequence[TelemetryRecord], n: int) -> dict[int, list[TelemetryRecord]]:
    """Records that are not DCGM samples by their scorer (``scorer_of``), each in order.

    >>> from pipeline.schema import NcclRecord, ProgressRecord
    >>> nccl = NcclRecord(ts=1.0, host="a", comm="c", rank=0, nranks=8, coll="AllReduce", bytes=8, exec_time_us=1.0)
    >>> {s: len(recs) for s, recs in by_scorer([nccl, nccl], 8).items()}
    {3: 2}
    """
    out: dict[int, list[TelemetryRecord]] = {}
    for r in other:
        out.setdefault(scorer_of(r, n), []).append(r)
    return out


def split_findings(found: Sequence[Findings], levels: Mapping[str, bool], n: int) -> list[list[Findings]]:
    """Named findings by the shard of the hosts they name, for each of ``n`` shards: every
    shard gets every tick's findings, its own rows or none (the model's warmth comes with
    them). ``levels``: ``ModelSet.nccl_levels``."""
    out: list[list[Findings]] = [[] for _ in range(n)]
    for f in found:
        where = [shard_of(h, n) for h in f.hosts(levels[f.model])]
        for i in range(n):
            out[i].append(f.take([j for j, w in enumerate(where) if w == i]))
    return out


class ShardedFleet(FleetStage):
    """A fleet stage whose models run in ``shards`` engines by host plus ``shards`` NCCL scorers
    by lane (``scorers``, keys ``nccl-i``)."""

    def __init__(self, make_engine: Callable[[], Engine], shards: int, **kw: Any) -> None:
        super().__init__(make_engine, **kw)
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.keys = [f"shard-{i}" for i in range(shards)]
        self.scorers = [f"{SCORER}-{i}" for i in range(shards)]
        self.exchange = SharedExchange(self.keys)
        for key in self.keys:
            _models(self.engine(key)).as_shard(self.exchange, key)
        for key in self.scorers:
            _models(self.engine(key)).as_scorer()
        self._first: int | None = None  # the epoch of the first record released
        self._where: dict[str, int] = {}  # each host's shard, hashed once
        # Seconds each engine spent on its records and ticks (process, release), by key: what
        # one process per shard (shard i and scorer i) would spend.
        self.busy: dict[str, float] = dict.fromkeys([*self.keys, *self.scorers], 0.0)

    def engine(self, key: str = FLEET_KEY) -> Engine:
        """An engine by key; the fleet key names the first scorer (what drivers read of the
        stage's engine: its fields and models are every engine's)."""
        return super().engine(self.scorers[0] if key == FLEET_KEY else key)

    def shard_records(self) -> dict[str, int]:
        """DCGM records each shard's models scored, and NCCL records each scorer's."""
        return {k: int(e.stats["records.dcgm"] + e.stats["records.nccl"]) for k, e in self.engines.items()}

    def _release(self, batches: dict[str, Sequence[TelemetryRecord]], out: EngineOutput) -> None:
        for key, recs in batches.items():
            t0 = time.perf_counter()
            super()._release({key: recs}, out)
            self.busy[key] = self.busy.get(key, 0.0) + time.perf_counter() - t0

    def _take(self, wm: float) -> dict[str, Sequence[TelemetryRecord]]:
        """The released records in canonical order, DCGM by the shard of their host, the rest
        by their scorer (``scorer_of``)."""
        batches = super()._take(wm)
        out: dict[str, Sequence[TelemetryRecord]] = {}
        n = len(self.keys)
        for recs in batches.values():
            dcgm, other = rows.split(recs)
            for s, part in by_shard(dcgm, n, self._where).items():
                out[self.keys[s]] = part
            by = by_scorer(other, n)
            for i in sorted(by):
                out[self.scorers[i]] = by[i]
            if len(recs) and self._first is None:
                self._first = epoch_of(float(rows.times(recs).min()))
        return out

    def _advance_engines(self, wm: float, out: EngineOutput) -> None:
        """Step the engines to ``wm``, each step only as far as every shard's parts allow: the
        scorers first, their findings to the shards, then the shards."""
        while True:
            bound = self.exchange.bound()
            if bound is None:
                bound = self._first + LAG_EPOCHS if self._first is not None else None
            upto = wm if bound is None else min(wm, bound * EPOCH_S)
            self._step(upto, out, final=False)
            if upto >= wm:
                return

    def _flush_engines(self, out: EngineOutput) -> None:
        newest = max((e.clock.newest(e.entities.n_hosts) for e in self.engines.values()), default=-math.inf)
        if math.isfinite(newest):
            self._advance_engines(newest + self.engine().config.tick, out)
        self._step(math.inf, out, final=True)

    def _step(self, upto: float, out: EngineOutput, final: bool) -> None:
        for key in (*self.scorers, *self.keys):
            eng = self.engines[key]
            t0 = time.perf_counter()
            self._collect(eng.flush if final else partial(eng.advance_to, upto), out)
            self.busy[key] += time.perf_counter() - t0
            if key.startswith(SCORER):
                self._hand_over(key)

    def _hand_over(self, key: str) -> None:
        """A scorer's findings, each to every shard with the rows of its hosts (a shard takes
        every tick's findings, its own rows or none: the model's warmth comes with them)."""
        scorer = _models(self.engines[key])
        found = scorer.nccl.out or []
        if not found:
            return
        for shard, mine in zip(self.keys, split_findings(found, scorer.nccl_levels(), len(self.keys))):
            _models(self.engines[shard]).nccl.inbox.extend(mine)
        found.clear()

    def snapshot(self, replayable: bool = False) -> bytes:
        """Not kept: the shards' parts and findings in flight live in this process only (replay
        and evaluation run to the end; the service checkpoints its own stages)."""
        raise StateError("a sharded fleet stage is not checkpointed")


def _models(engine: Engine) -> ModelSet:
    ms = engine.models
    if not isinstance(ms, ModelSet):
        raise ValueError("a sharded fleet stage needs the models")
    return ms
