"""NCCL collective telemetry: one record per rank per communicator per interval.

Communicators of a typical 3D-parallel job, reduced to the two that telemetry tells apart:

* tensor-parallel ``tp<h>``: the 8 GPUs of host ``h`` over NVLink, AllReduce of 1 GiB,
  busbw ~400-465 GB/s (NVLink SHARP reaches ~480, plain ring ~370);
* data-parallel ``dp<g>``: local GPU ``g`` of every host, over the network (400 Gb/s NICs),
  ReduceScatter of 64 MiB per rank, busbw ~41-45 GB/s, moved job-wide by fabric congestion.

Each record aggregates the interval's collectives: ``seq`` is the last collective sequence
number, ``exec_time_us`` the mean execution time and the bandwidths follow from it with the NCCL
Inspector's formulas (``algbw = bytes moved / 1e9 / s``, where bytes moved is ``bytes`` for
AllReduce/Broadcast and ``bytes * nranks`` for AllGather/ReduceScatter, ``bytes`` being the
per-rank message size the Inspector prints; ``busbw = algbw * 2(n-1)/n`` for AllReduce,
``(n-1)/n`` for AllGather/ReduceScatter, 1 for Broadcast).

In a synchronous collective a slow rank arrives last: the *other* ranks' kernels start early and
spin, so their exec time grows by the wait; and the slow rank also drags the ring (its reductions
run slower), so everybody's busbw drops, the waiting ranks' most. Communicators without the slow
rank are untouched.
"""

from __future__ import annotations

import numpy as np

from .rng import comm_id, substream

GIB = 1 << 30
MIB = 1 << 20

NCCL_DEFAULTS = {
    "tp_bytes": GIB,
    "tp_rate_per_s": 40.0,  # TP all-reduces per second while training
    "dp_coll": "ReduceScatter",
    "dp_bytes": 64 * MIB,
    "dp_rate_per_s": 2.0,
    "dp_busbw_gbs": [41.0, 45.0],
    "wait_factor": 2.0,  # compute time between collectives, in units of a collective
}
COLLS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")


def bus_factor(coll: str, n: int) -> float:
    """busbw / algbw for a collective over ``n`` ranks (nccl-tests' PERFORMANCE.md)."""
    if coll == "AllReduce":
        return 2.0 * (n - 1) / n
    if coll in ("AllGather", "ReduceScatter"):
        return (n - 1) / n
    return 1.0


def traffic_bytes(coll: str, nbytes: int, n: int) -> int:
    """Bytes an ``algbw`` is computed from, given the per-rank message size (Inspector rule)."""
    return nbytes * n if coll in ("AllGather", "ReduceScatter") else nbytes


class NcclModel:
    """Accumulates per-GPU speed over an interval and emits the interval's records."""

    def __init__(
        self,
        hosts: int,
        gpus_per_host: int,
        host_names: list[str],
        seed: int,
        job: str,
        busbw_range: tuple[float, float],
        opts: dict | None = None,
    ) -> None:
        self.H, self.G = hosts, gpus_per_host
        self.host_names, self.job = host_names, job
        o = {**NCCL_DEFAULTS, **(opts or {})}
        self.opts = o
        r = substream(seed, "nccl-static")
        self.tp_on = gpus_per_host >= 2
        self.dp_on = hosts >= 2
        self.tp_busbw = r.uniform(busbw_range[0], busbw_range[1], hosts)
        self.dp_busbw = r.uniform(o["dp_busbw_gbs"][0], o["dp_busbw_gbs"][1], gpus_per_host)
        self.tp_ids = [comm_id(seed, job, f"tp{h}") for h in range(hosts)]
        self.dp_ids = [comm_id(seed, job, f"dp{g}") for g in range(gpus_per_host)]
        self.seed = seed
        self.incarnation = 0
        self.tp_seq = r.integers(1_000, 50_000, hosts).astype(np.int64)
        self.dp_seq = r.integers(100, 5_000, gpus_per_host).astype(np.int64)
        self._noise = substream(seed, "nccl-noise")
        self.congestion = 0.0
        n = hosts * gpus_per_host
        self.acc_speed = np.zeros(n)
        self.acc_train = np.zeros(n)
        self.acc_tp = np.zeros(hosts)
        self.acc_dp = np.zeros(gpus_per_host)
        self.acc_job = 0.0

    def accumulate(
        self, dt: float, training: np.ndarray, speed: np.ndarray, tp_h: np.ndarray, dp_bw: np.ndarray | None = None
    ) -> None:
        """Add one step: which GPUs trained, at what speed, the hosts' NVLink factor and each
        GPU's inter-host bandwidth factor (``dp_bw``: a ring runs at its slowest link's pace, so
        a DP communicator gets its ranks' lowest)."""
        self.acc_speed += speed * dt
        self.acc_train += training * dt
        if training.any():
            self.acc_tp += tp_h * dt
            self.acc_dp += (1.0 if dp_bw is None else dp_bw.reshape(self.H, self.G).min(axis=0)) * dt
            self.acc_job += dt

    def restart(self) -> None:
        """The job was restarted: its new incarnation builds new communicators (new ids, seq 0)."""
        self.incarnation += 1
        k, seed, job = self.incarnation, self.seed, self.job
        self.tp_ids = [comm_id(seed, job, f"tp{h}#{k}") for h in range(self.H)]
        self.dp_ids = [comm_id(seed, job, f"dp{g}#{k}") for g in range(self.G)]
        self.tp_seq = np.zeros(self.H, np.int64)
        self.dp_seq = np.zeros(self.G, np.int64)

    def _reset(self) -> None:
        self.acc_speed.fill(0.0)
        self.acc_train.fill(0.0)
        self.acc_tp.fill(0.0)
        self.acc_dp.fill(0.0)
        self.acc_job = 0.0

    def _group(self, T, S, alive, busbw, nbytes, coll, rate, factor):
        """Exec times of a set of same-size communicators: rows = comms, cols = ranks."""
        rnd = self._noise
        rows, n = T.shape
        ok = alive & (T > 0)
        mean_speed = np.where(ok, S / np.maximum(T, 1e-9), 1.0)
        slow = np.where(ok, 1.0 / np.maximum(mean_speed, 0.05) - 1.0, 0.0)
        slow = np.maximum(slow, 0.0)
        max_slow = slow.max(axis=1, keepdims=True)
        bf = bus_factor(coll, n)
        moved = traffic_bytes(coll, nbytes, n)
        algbw0 = busbw * factor / bf
        exec0 = (moved / 1e9 / algbw0 * 1e6)[:, None]
        wait = self.opts["wait_factor"] * (max_slow - slow) * exec0
        exec_us = exec0 * (1.0 + 0.25 * max_slow) + wait
        exec_us *= (1.0 + rnd.normal(0.0, 0.012, (rows, 1))) * (1.0 + rnd.normal(0.0, 0.004, (rows, n)))
        exec_us = np.round(np.maximum(exec_us, 1.0), 1)
        algbw = np.round(moved / 1e9 / (exec_us * 1e-6), 3)
        busbw_out = np.round(algbw * bf, 3)
        # Collectives completed this interval: bounded by the comm's slowest rank and its time.
        t_comm = np.where(ok, T, 0.0).max(axis=1)
        count = np.rint(rate * t_comm / (1.0 + max_slow[:, 0]) * factor**0.5).astype(np.int64)
        count = np.where(t_comm > 0, np.maximum(count, 1), 0)
        return ok, exec_us, algbw, busbw_out, count

    def emit(self, ts: float, alive: np.ndarray) -> list[list[dict]] | None:
        """Records for the interval just ended, one list per host (rank order), or None when the
        job did not run at all during the interval (checkpoint: NCCL traffic stops)."""
        if self.acc_job <= 0.0:
            self._reset()
            return None
        H, G, o = self.H, self.G, self.opts
        T = self.acc_train.reshape(H, G)
        S = self.acc_speed.reshape(H, G)
        A = alive.reshape(H, G)
        out: list[list[dict]] = [[] for _ in range(H)]
        recs_tp = recs_dp = None
        if self.tp_on:
            tp_factor = self.acc_tp / self.acc_job
            ok, ex, al, bb, cnt = self._group(
                T, S, A, self.tp_busbw, o["tp_bytes"], "AllReduce", o["tp_rate_per_s"], tp_factor
            )
            self.tp_seq += cnt
            recs_tp = (ok.tolist(), ex.tolist(), al.tolist(), bb.tolist(), self.tp_seq.tolist())
        if self.dp_on:
            # Job-wide fabric congestion, an AR(1) shared by every DP communicator.
            self.congestion = 0.8 * self.congestion + self._noise.normal(0.0, 0.02)
            dp_factor = max(0.5, 1.0 - abs(self.congestion)) * (self.acc_dp / self.acc_job)
            ok, ex, al, bb, cnt = self._group(
                T.T, S.T, A.T, self.dp_busbw, o["dp_bytes"], o["dp_coll"], o["dp_rate_per_s"], dp_factor
            )
            self.dp_seq += cnt
            recs_dp = (ok.tolist(), ex.tolist(), al.tolist(), bb.tolist(), self.dp_seq.tolist())
        self._reset()
        # Records are copies of a per-communicator template (cheaper than building 17-key dicts)
        # with the per-rank values filled in; key order is the template's, so output is stable.
        job, names = self.job, self.host_names
        tp_b, dp_b, dp_coll = int(o["tp_bytes"]), int(o["dp_bytes"]), o["dp_coll"]
        dp_tmpl = (
            [
                {
                    "v": 1,
                    "kind": "nccl",
                    "ts": ts,
                    "host": "",
                    "gpu": g,
                    "job": job,
                    "comm": self.dp_ids[g],
                    "comm_name": f"dp{g}",
                    "rank": 0,
                    "nranks": H,
                    "nnodes": H,
                    "coll": dp_coll,
                    "seq": recs_dp[4][g],
                    "bytes": dp_b,
                    "exec_time_us": 0.0,
                    "algbw_gbs": 0.0,
                    "busbw_gbs": 0.0,
                }
                for g in range(G)
            ]
            if recs_dp is not None
            else None
        )
        for h in range(H):
            host = names[h]
            lst = out[h]
            tp_t = None
            if recs_tp is not None:
                tp_t = {
                    "v": 1,
                    "kind": "nccl",
                    "ts": ts,
                    "host": host,
                    "gpu": 0,
                    "job": job,
                    "comm": self.tp_ids[h],
                    "comm_name": f"tp{h}",
                    "rank": 0,
                    "nranks": G,
                    "nnodes": 1,
                    "coll": "AllReduce",
                    "seq": recs_tp[4][h],
                    "bytes": tp_b,
                    "exec_time_us": 0.0,
                    "algbw_gbs": 0.0,
                    "busbw_gbs": 0.0,
                }
                t_ok, t_ex, t_al, t_bb = recs_tp[0][h], recs_tp[1][h], recs_tp[2][h], recs_tp[3][h]
            for g in range(G):
                if dp_tmpl is not None and recs_dp is not None and recs_dp[0][g][h]:
                    d = dp_tmpl[g].copy()
                    d["host"] = host
                    d["rank"] = h
                    d["exec_time_us"] = recs_dp[1][g][h]
                    d["algbw_gbs"] = recs_dp[2][g][h]
                    d["busbw_gbs"] = recs_dp[3][g][h]
                    lst.append(d)
                if tp_t is not None and t_ok[g]:
                    d = tp_t.copy()
                    d["gpu"] = g
                    d["rank"] = g
                    d["exec_time_us"] = t_ex[g]
                    d["algbw_gbs"] = t_al[g]
                    d["busbw_gbs"] = t_bb[g]
                    lst.append(d)
        return out
