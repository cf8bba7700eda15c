"""Dense ids for GPUs and hosts, so per-entity state lives in numpy arrays indexed by id.

Also whose work runs where: the latest job labels of each GPU (from DCGM records' ``labels``)
and the job of each host's latest NCCL record, which alerts carry (docs/architecture.md §3).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Sequence, TypeGuard

import numpy as np

from pipeline.rows import DcgmColumns
from pipeline.decode import bad_identifier
from pipeline.errors import StateError
from pipeline.numeric import grow as grow
from pipeline.numeric import id_bound as id_bound
from pipeline.recordchecks import MAX_GPU_INDEX
from pipeline.schema import JOB_LABELS, MAX_PODS_CHARS, POD_COUNT_LABEL, PODS_LABEL, DcgmJobLabels

_LABELS = operator.attrgetter("labels")
_HOST = operator.attrgetter("host")
_NCCL_JOB = operator.attrgetter("job")
MAX_JOBS_SHOWN = 8  # a host alert over more jobs than this names only the first ones


_TABLE_MAX = 1024  # GPU indices at or above this (none in practice) take the dict path


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
        # Latest labels object of each GPU id (a DcgmJobLabels, or the slow path's labels dict;
        # None: no DCGM record yet), and the job of each host's latest NCCL record.
        self._labels = np.full(16, None, dtype=object)
        self.nccl_jobs: dict[str, str | None] = {}

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
                self._labels = grow(self._labels, len(self._gpu_host), None)
            hid = self._gpu_host[gid] = self.host(host)
            if index < _TABLE_MAX:
                rows, cols = self._table.shape
                if hid >= rows or index >= cols:
                    grown = np.full((max(hid + 1, 2 * rows), max(index + 1, cols)), -1, dtype=np.int32)
                    grown[:rows, :cols] = self._table
                    self._table = grown
                self._table[hid, index] = gid
        return gid

    def host_ids(self, names: Sequence[str], limit: int | None = None, order: np.ndarray | None = None) -> np.ndarray:
        """Ids of many host names at once (new ones assigned in order, or in the order of the
        indices ``order`` where given; -1 for a new one once ``limit`` hosts are known).

        ``dict.get`` mapped in C: this runs for every record on the hot path.

        >>> Entities().host_ids(["b", "a", "b"], order=np.array([1, 0, 2])).tolist()
        [1, 0, 1]
        """
        try:
            return np.fromiter(map(self.host_id.get, names), np.int32, len(names))
        except TypeError:  # a host not seen before (get() gave None)
            pass
        ids = [-1] * len(names)
        for i in range(len(names)) if order is None else order.tolist():
            n = names[i]
            if limit is None or n in self.host_id or len(self.hosts) < limit:
                ids[i] = self.host(n)
        return np.array(ids, dtype=np.int32)

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

    # -- whose work runs where ----------------------------------------------------------------

    def note_labels(self, gpu_ids: np.ndarray, records: Sequence[Any]) -> None:
        """Keep each GPU's latest record's labels (the hot path: one gather and one store in C;
        they are read only when an alert is made)."""
        labels = records.labels if isinstance(records, DcgmColumns) else map(_LABELS, records)
        self._labels[gpu_ids] = np.fromiter(labels, object, len(records))

    def note_nccl(self, records: Sequence[Any]) -> None:
        """Keep the job of each host's latest NCCL record: one dict update in C. (By host, not by
        GPU: a fleet sends as many NCCL records as DCGM ones, and a tuple key for each cost
        more than the rest of this bookkeeping together.)"""
        self.nccl_jobs.update(zip(map(_HOST, records), map(_NCCL_JOB, records)))

    def job_labels(self, gpu_id: int) -> dict[str, str]:
        """``job``, ``pod``, ``namespace``, ``container`` of a GPU, where known (``job``: the
        ``job`` label, else dcgm-exporter's ``hpc_job``, else the host's NCCL job); on a GPU
        shared by pods also ``pods`` (every pod, ``namespace/pod``) and ``pod_count``."""
        out = _job_fields(self._labels[gpu_id] if gpu_id < len(self._labels) else None)
        if "job" not in out:
            job = self.nccl_jobs.get(self.gpus[gpu_id][0])
            if _usable(job):
                out["job"] = job
        return out

    def host_job_labels(self, host_id: int) -> dict[str, str]:
        """The job labels of a host: each one its GPUs (and NCCL) agree on; several jobs on the
        host leave ``job`` out and list them in ``jobs`` (comma-separated)."""
        gids = np.flatnonzero(self.gpu_host == host_id).tolist()
        per = [self.job_labels(g) for g in gids]
        host = self.hosts[host_id]
        nccl_job = self.nccl_jobs.get(host)
        if not gids and _usable(nccl_job):
            per = [{"job": nccl_job}]
        out: dict[str, str] = {}
        for key in ("job", "pod", "namespace", "container"):
            vals = sorted({p[key] for p in per if key in p})
            if len(vals) == 1:
                out[key] = vals[0]
            elif len(vals) > 1 and key == "job":
                out["jobs"] = ",".join(vals[:MAX_JOBS_SHOWN]) + (",..." if len(vals) > MAX_JOBS_SHOWN else "")
        return out

    def to_state(self) -> dict:
        labels = [_label_state(self._labels[i]) for i in range(self.n_gpus)]
        return {
            "hosts": self.hosts,
            "gpus": [list(k) for k in self.gpus],
            "labels": labels if any(labels) else [],
            "nccl_jobs": [[h, j] for h, j in self.nccl_jobs.items()],
        }

    @classmethod
    def from_state(cls, data: dict) -> "Entities":
        """From ``to_state``; snapshots written before jobs were kept have none (every job unknown)."""
        ent = cls()
        for h in data["hosts"]:
            ent.host(_state_host(h))
        for h, g in data["gpus"]:
            # A record's bounds: an index past them (or not an integer) fails a later tick or
            # the next snapshot, far from the snapshot behind it.
            if type(g) is not int or not 0 <= g <= MAX_GPU_INDEX:
                raise StateError(f"snapshot: GPU index {g!r} (0..{MAX_GPU_INDEX})")
            ent.gpu(_state_host(h), g)
        for i, lab in enumerate(data.get("labels") or []):
            if lab and i < ent.n_gpus:
                ent._labels[i] = DcgmJobLabels(**{k: str(v) for k, v in zip(JOB_LABELS, lab) if v is not None})
        for h, j in data.get("nccl_jobs") or []:
            ent.nccl_jobs[str(h)] = None if j is None else str(j)
        return ent


def _state_host(h: Any) -> str:
    """A host name read from a snapshot, or ``StateError``."""
    if not isinstance(h, str):
        raise StateError(f"snapshot: host name {h!r} is not a string")
    return h


def _usable(value: Any) -> TypeGuard[str]:
    # Alerts carry a label value only when it could be an identifier: labels are producers'
    # free text, and a job name reaches routes, audit records and (checked again) commands.
    return isinstance(value, str) and bad_identifier(value) is None


def _job_fields(lab: Any) -> dict[str, str]:
    if lab is None:
        return {}
    get_ = lab.get if isinstance(lab, dict) else (lambda k: getattr(lab, k, None))

    def get(k: str) -> Any:
        v = get_(k)
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    out = {}
    job = get("job") if _usable(get("job")) else get("hpc_job")
    if _usable(job):
        out["job"] = job
    for key in ("pod", "namespace", "container"):
        if _usable(v := get(key)):
            out[key] = v
    if _usable_pods(pods := get(PODS_LABEL)):
        out[PODS_LABEL] = pods
    if isinstance(count := get(POD_COUNT_LABEL), str) and count.isascii() and count.isdigit() and len(count) <= 9:
        out[POD_COUNT_LABEL] = count
    return out


def _usable_pods(value: Any) -> TypeGuard[str]:
    # A list of pod names, longer than one identifier: printable, no space, bounded as the producer bounds it.
    return isinstance(value, str) and 0 < len(value) <= MAX_PODS_CHARS and value.isprintable() and " " not in value


def _label_state(lab: Any) -> list[str | None] | None:
    if lab is None:
        return None
    get = lab.get if isinstance(lab, dict) else (lambda k: getattr(lab, k, None))
    vals = [str(v) if isinstance(v := get(k), (str, int)) and not isinstance(v, bool) else None for k in JOB_LABELS]
    return vals if any(v is not None for v in vals) else None
