"""What the NCCL models found in one tick, per entity: the hand-over between where NCCL records
are scored and where a GPU's alert lifecycle runs.

The NCCL models judge a communicator, whose ranks span hosts, so they score where every rank's
records are; a model's alert on a GPU lives with the GPU's rows. One ``Findings`` is one model's
verdict on one tick of NCCL records: per entity (a GPU, or a host for host-level models) the
worst score of the tick, whether the decider flagged it, the time of the record, the evidence of
a flagged one, and whether the model was warm after learning from the tick. In one process the
entities are the engine's ids (``ent``); between processes they travel by name (``named``,
``located``), since every engine numbers its GPUs in its own order.

>>> f = Findings("m", 10.0, np.array([0]), np.array([4.0]), np.array([True]), np.array([10.2]), {0: {"score": 4.0}}, True)
>>> f.named(["h1"], [("h1", 3)], level_gpu=True).keys
[('h1', 3)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass
class Findings:
    """One NCCL model's verdict on the tick starting at ``tick``; rows are entities."""

    model: str
    tick: float
    ent: np.ndarray  # entity ids in the engine that scored (-1 once located in another)
    score: np.ndarray
    flagged: np.ndarray
    obs_ts: np.ndarray
    evidence: dict[int, dict[str, Any]]  # row -> evidence, for flagged rows
    warm: bool
    keys: list[Any] = field(default_factory=list)  # per row: (host, gpu) or host, once named

    def named(self, hosts: Sequence[str], gpus: Sequence[tuple[str, int]], level_gpu: bool) -> "Findings":
        """The same findings with each entity's name (``keys``), for another engine."""
        ids = self.ent.tolist()
        keys = [gpus[i] for i in ids] if level_gpu else [hosts[i] for i in ids]
        return Findings(
            self.model, self.tick, self.ent, self.score, self.flagged, self.obs_ts, self.evidence, self.warm, keys
        )

    def located(self, gpu_id: dict[tuple[str, int], int], host_id: dict[str, int], level_gpu: bool) -> "Findings":
        """The rows whose entity this engine knows, with its ids (a GPU it has not seen yet has
        no rows here to carry a finding)."""
        table: dict[Any, int] = gpu_id if level_gpu else host_id
        ids = np.array([table.get(k, -1) for k in self.keys], dtype=np.int64)
        keep = np.flatnonzero(ids >= 0)
        ev = {int(j): self.evidence[int(i)] for j, i in enumerate(keep.tolist()) if int(i) in self.evidence}
        return Findings(
            self.model,
            self.tick,
            ids[keep],
            self.score[keep],
            self.flagged[keep],
            self.obs_ts[keep],
            ev,
            self.warm,
            [self.keys[i] for i in keep.tolist()],
        )

    def hosts(self, level_gpu: bool) -> list[str]:
        """Each row's host (named findings)."""
        return [k[0] for k in self.keys] if level_gpu else list(self.keys)

    def take(self, rows: Sequence[int]) -> "Findings":
        """The given rows (named findings), e.g. those of one shard's hosts."""
        r = list(rows)
        ev = {j: self.evidence[i] for j, i in enumerate(r) if i in self.evidence}
        idx = np.array(r, dtype=np.int64)
        return Findings(
            self.model,
            self.tick,
            self.ent[idx],
            self.score[idx],
            self.flagged[idx],
            self.obs_ts[idx],
            ev,
            self.warm,
            [self.keys[i] for i in r],
        )
