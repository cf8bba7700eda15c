"""Collective progress: the ``progress`` records a job's ranks give ``produce ncclras`` and
``produce torch-watchdog`` (``pipeline.schema.ProgressRecord``), sent when a scenario's
``sources`` has ``progress``.

* NCCL RAS, polled every ``RAS_INTERVAL_S`` (30 s) as ``ncclras -f json`` would be: every rank of
  every communicator (``tp<h>``, ``dp<g>``, the ids of ``nccl.py``) with its count of launched
  operations (``last_enqueued``), which is the communicator's collective sequence number.
  ``state`` is ``lagging`` for a rank below the communicator's highest count, else ``progress``.
  Ranks of a GPU that is gone (``gpu_lost``) are left out.
* PyTorch's NCCL watchdog, only when a collective times out: one ``timeout`` record per rank of
  a communicator whose collective has been in flight for the timeout (``Mods.hang_timeout_s``),
  naming the sequence number it waited on (``WorkNCCL(SeqNum=...)``), its last enqueued and last
  completed work; the communicator is the process group's id (``1`` + its index; the default
  group ``0`` carries no collectives here), so it differs from RAS's hash as it does in a real job.

A hung rank (``Mods.hung``, the ``hang_collective`` fault) is stuck in the collective after the
last one its peers completed: from the hang's first step (the communicator's sequence number then
``C``), its count is ``C + 1`` while its peers have completed ``C + 1`` and launched ``C + 2``, and
nothing moves until the hang ends, when the counts go on from the sequence number again, never
below what the ranks last reported.
"""

from __future__ import annotations

import numpy as np

from .nccl import NcclModel

RAS_INTERVAL_S = 30.0  # how often RAS status is polled (``ncclras`` run by a cron-like loop)
WATCHDOG_OPS = {"tp": "ALLREDUCE", "dp": "_REDUCE_SCATTER_BASE"}


class ProgressModel:
    """The job's progress records, step by step (``step``); deterministic (no draws)."""

    def __init__(self, nccl: NcclModel, host_names: list[str], job: str, ras_interval: float = RAS_INTERVAL_S) -> None:
        self.nccl, self.host_names, self.job = nccl, host_names, job
        self.H, self.G = nccl.H, nccl.G
        self.ras_interval = ras_interval
        self.next_poll = 1
        # Per hung GPU (global index): the step the hang was first seen, the counts it froze at
        # per communicator, and whether its watchdogs have reported.
        self.hangs: dict[int, dict] = {}
        # After a hang, a communicator's counts never go below what its ranks last reported
        # (its sequence number may trail them by the collectives of the hang's first interval).
        self.floor: dict[str, int] = {}

    def _comms(self) -> list[tuple[str, int, str, int, list[int]]]:
        """(kind, index, RAS id, sequence number, global GPU of each rank) of every communicator."""
        H, G, n = self.H, self.G, self.nccl
        out: list[tuple[str, int, str, int, list[int]]] = []
        if n.tp_on:
            out += [("tp", h, n.tp_ids[h], int(n.tp_seq[h]), [h * G + g for g in range(G)]) for h in range(H)]
        if n.dp_on:
            out += [("dp", g, n.dp_ids[g], int(n.dp_seq[g]), [h * G + g for h in range(H)]) for g in range(G)]
        return out

    def step(
        self, t: float, ts: float, hung: np.ndarray, timeout_s: np.ndarray, gone: np.ndarray
    ) -> list[list[dict]] | None:
        """Records of the step at ``t`` (seconds from the start; ``ts`` its event time), one list
        per host, or None when there are none: ``hung``/``timeout_s`` per GPU (``Mods``), ``gone``
        the GPUs without a rank. Call after the step's NCCL records were emitted."""
        poll = t + 1e-9 >= self.next_poll * self.ras_interval
        if not (poll or self.hangs or hung.any()):
            return None  # most steps: no poll, no hang
        comms = self._comms()
        for gi in [gi for gi in self.hangs if not hung[gi]]:
            hg = self.hangs.pop(gi)  # the hang ended: counts follow the communicators again
            for k, i, cid, _, _ in comms:
                if (k, i) in hg["frozen"]:
                    self.floor[cid] = max(self.floor.get(cid, 0), hg["frozen"][(k, i)] + 2)
        for gi in np.flatnonzero(hung).tolist():
            if gi not in self.hangs:
                frozen = {(k, i): seq for k, i, _, seq, ranks in comms if gi in ranks}
                self.hangs[gi] = {"t0": t, "frozen": frozen, "reported": False}
        out: list[list[dict]] = [[] for _ in range(self.H)]
        any_out = False
        if poll:
            self.next_poll = int(np.floor((t + 1e-9) / self.ras_interval)) + 1
            any_out = self._ras(ts, comms, gone, out)
        for gi, hg in self.hangs.items():
            if not hg["reported"] and t - hg["t0"] + 1e-9 >= float(timeout_s[gi]):
                hg["reported"] = True
                any_out = self._watchdog(ts, gi, hg, comms, float(timeout_s[gi]), out) or any_out
        return out if any_out else None

    def _counts(self, kind: str, idx: int, cid: str, seq: int, ranks: list[int]) -> list[int]:
        """Each rank's launched operations: the sequence number, or the frozen counts of a hang."""
        for gi, hg in self.hangs.items():
            if (kind, idx) in hg["frozen"]:
                c = hg["frozen"][(kind, idx)]
                return [c + 1 if r == gi else c + 2 for r in ranks]
        return [max(seq, self.floor.get(cid, 0))] * len(ranks)

    def _ras(self, ts: float, comms: list, gone: np.ndarray, out: list[list[dict]]) -> bool:
        G, names, job = self.G, self.host_names, self.job
        sent = False
        for kind, idx, cid, seq, ranks in comms:
            counts = self._counts(kind, idx, cid, seq, ranks)
            top = max(counts)
            for rank, (gi, c) in enumerate(zip(ranks, counts)):
                if gone[gi]:
                    continue
                out[gi // G].append(
                    {
                        "v": 1,
                        "kind": "progress",
                        "ts": ts,
                        "host": names[gi // G],
                        "job": job,
                        "rank": rank,
                        "gpu": gi % G,
                        "comm": cid,
                        "nranks": len(ranks),
                        "last_enqueued": c,
                        "source": "ras",
                        "state": "lagging" if c < top else "progress",
                    }
                )
                sent = True
        return sent

    def _watchdog(
        self, ts: float, hung_gi: int, hg: dict, comms: list, timeout_s: float, out: list[list[dict]]
    ) -> bool:
        G, H, names, job = self.G, self.H, self.host_names, self.job
        timeout_ms = int(round(timeout_s * 1000.0))
        sent = False
        for kind, idx, _, _, ranks in comms:
            if (kind, idx) not in hg["frozen"]:
                continue
            c = hg["frozen"][(kind, idx)]
            pg = str(1 + idx if kind == "tp" else 1 + H + idx)
            for rank, gi in enumerate(ranks):
                enq, done = (c + 1, c) if gi == hung_gi else (c + 2, c + 1)
                out[gi // G].append(
                    {
                        "v": 1,
                        "kind": "progress",
                        "ts": ts,
                        "host": names[gi // G],
                        "job": job,
                        "rank": rank,
                        "gpu": gi % G,
                        "comm": pg,
                        "comm_name": f"{kind}{idx}",
                        "last_enqueued": enq,
                        "last_completed": done,
                        "seq": enq,
                        "op": WATCHDOG_OPS[kind],
                        "timeout_ms": timeout_ms,
                        "ran_ms": timeout_ms + 1 + (rank * 37) % 1000,  # the watchdog's poll adds up to a second
                        "source": "watchdog",
                        "state": "timeout",
                    }
                )
                sent = True
        return sent
