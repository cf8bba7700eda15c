"""Rows that ran before the other hosts' rows of their tick (``Engine._release_hosts``), kept
until the tick is whole for the stages' ``deferred`` checks (docs/architecture.md §4).

Only who and when is kept: a deferred check judges rows whose samples were folded in already
(``View.rows_only``). The rows are part of the engine's snapshot while any wait.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.engine.arrays import from_dict, numeric, to_dict
from pipeline.engine.entities import Entities
from pipeline.engine.frame import DcgmFrame
from pipeline.engine.state import View
from pipeline.errors import StateError


class EarlyRows:
    """The early rows of one tick, batch by batch, until ``take`` hands them over as one view.

    >>> rows = EarlyRows()
    >>> rows.add(DcgmFrame(np.array([3.2]), np.array([1], np.int32), np.array([0], np.int32), np.empty((1, 0))))
    >>> len(rows), rows.take(Entities(), 3.0).frame.gpu.tolist(), len(rows)
    (1, [1], 0)
    """

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None) -> None:
        self.parts = parts or []

    def __len__(self) -> int:
        return sum(len(p[0]) for p in self.parts)

    def add(self, chunk: DcgmFrame) -> None:
        """The rows of a chunk that ran early."""
        self.parts.append((chunk.ts, chunk.gpu, chunk.host))

    def take(self, entities: Entities, ts0: float) -> View | None:
        """Every row kept, by GPU as the engine orders a chunk, as the view of tick ``ts0``
        (None: none kept); nothing is kept after."""
        if not self.parts:
            return None
        parts, self.parts = self.parts, []
        ts, gpu, host = (np.concatenate([p[k] for p in parts]) for k in range(3))
        order = np.argsort(gpu, kind="stable")
        return View.rows_only(ts[order], gpu[order], host[order], entities, ts0)

    def to_state(self) -> list[list[dict[str, Any]]]:
        """The rows as a snapshot holds them (``early``): numeric arrays only."""
        return [[to_dict(a) for a in part] for part in self.parts]

    @classmethod
    def from_state(cls, data: Any, entities: Entities) -> "EarlyRows":
        """Rows of a snapshot (``to_state``), each of a GPU and host ``entities`` knows, or
        ``StateError``."""
        if not isinstance(data, list):
            raise StateError("snapshot: early rows are not a list")
        return cls([_part(p, entities) for p in data])


def _part(part: Any, entities: Entities) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not isinstance(part, list) or len(part) != 3:
        raise StateError("snapshot: early rows are not [ts, gpu, host]")
    ts, gpu, host = (numeric(from_dict(a), f"early {k}") for a, k in zip(part, ("ts", "gpu", "host")))
    if not len(ts) or not len(ts) == len(gpu) == len(host):
        raise StateError("snapshot: early rows of unequal or no length")
    if not ((0 <= gpu) & (gpu < entities.n_gpus)).all() or not ((0 <= host) & (host < entities.n_hosts)).all():
        raise StateError("snapshot: early rows of GPUs or hosts it does not know")
    return ts.astype(np.float64), gpu.astype(np.int32), host.astype(np.int32)
