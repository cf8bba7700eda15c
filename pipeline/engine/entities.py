"""Dense ids for GPUs and hosts, so per-entity state lives in numpy arrays indexed by id."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


_TABLE_MAX = 1024   # GPU indices at or above this (none in practice) take the dict path


def id_bound(ids: np.ndarray | slice) -> int:
    """One past the largest id of ``ids`` (ids as an array, or ``slice(0, n)``; see ``View.ids``)."""
    if isinstance(ids, slice):
        return ids.stop
    return int(ids.max()) + 1 if len(ids) else 0


class Entities:
    """Maps (host, gpu) and host names to dense integer ids, assigned in first-seen order."""

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.host_id: dict[str, int] = {}
        self.gpus: list[tuple[str, int]] = []
        self.gpu_id: dict[tuple[str, int], int] = {}
        self._gpu_host = np.zeros(16, dtype=np.int32)
        # GPU id by (host id, GPU index) for indices below _TABLE_MAX, -1 where not seen yet:
        # ids for a whole batch in one numpy gather instead of a tuple and a dict lookup each.
        self._table = np.full((16, 8), -1, dtype=np.int32)

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)

    @property
    def gpu_host(self) -> np.ndarray:
        """Host id of every GPU id."""
        return self._gpu_host[: self.n_gpus]

    def host(self, name: str) -> int:
        hid = self.host_id.get(name)
        if hid is None:
            hid = self.host_id[name] = len(self.hosts)
            self.hosts.append(name)
        return hid

    def gpu(self, host: str, index: int) -> int:
        key = (host, index)
        gid = self.gpu_id.get(key)
        if gid is None:
            gid = self.gpu_id[key] = len(self.gpus)
            self.gpus.append(key)
            if gid >= len(self._gpu_host):
                self._gpu_host = np.resize(self._gpu_host, 2 * len(self._gpu_host))
            hid = self._gpu_host[gid] = self.host(host)
            if index < _TABLE_MAX:
                rows, cols = self._table.shape
                if hid >= rows or index >= cols:
                    grown = np.full((max(hid + 1, 2 * rows), max(index + 1, cols)), -1, dtype=np.int32)
                    grown[:rows, :cols] = self._table
                    self._table = grown
                self._table[hid, index] = gid
        return gid

    def host_ids(self, names: Sequence[str], limit: int | None = None) -> np.ndarray:
        """Ids of many host names at once (new ones assigned in order; -1 for a new one once
        ``limit`` hosts are known).

        ``dict.get`` mapped in C: this runs for every record on the hot path.
        """
        try:
            return np.fromiter(map(self.host_id.get, names), np.int32, len(names))
        except TypeError:   # a host not seen before (get() gave None)
            return np.array([self.host(n) if limit is None or n in self.host_id or len(self.hosts) < limit else -1
                             for n in names], dtype=np.int32)

    def gpu_ids(self, hosts: Iterable[str], indices: Iterable[int]) -> np.ndarray:
        """Ids of many (host, gpu index) pairs at once (new ones assigned in order)."""
        keys = list(zip(hosts, indices))
        ids = list(map(self.gpu_id.get, keys))
        if None in ids:
            ids = [self.gpu(*k) if i is None else i for k, i in zip(keys, ids)]
        return np.array(ids, dtype=np.int32)

    def gpu_ids_of(self, host_ids: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """``gpu_ids`` for host ids (``host_ids``) rather than names: a table lookup when every
        pair is known, which is every batch but the first few."""
        rows, cols = self._table.shape
        if len(indices) and 0 <= int(indices.min()) and int(indices.max()) < cols and int(host_ids.max()) < rows:
            ids = self._table[host_ids, indices]
            if int(ids.min()) >= 0:
                return ids
        return self.gpu_ids([self.hosts[h] for h in host_ids.tolist()], indices.tolist())

    def to_state(self) -> dict:
        return {"hosts": self.hosts, "gpus": [list(k) for k in self.gpus]}

    @classmethod
    def from_state(cls, data: dict) -> "Entities":
        ent = cls()
        for h in data["hosts"]:
            ent.host(h)
        for h, g in data["gpus"]:
            ent.gpu(h, int(g))
        return ent


def grow(arr: np.ndarray, n: int, fill: float | int | bool, order: str = "C") -> np.ndarray:
    """``arr`` with at least ``n`` rows (amortised doubling), new rows set to ``fill``; a grown
    copy is laid out in ``order`` ("F": column-major)."""
    if len(arr) >= n:
        return arr
    size = max(n, 2 * len(arr), 16)
    out = np.full((size,) + arr.shape[1:], fill, dtype=arr.dtype, order=order)
    out[: len(arr)] = arr
    return out
