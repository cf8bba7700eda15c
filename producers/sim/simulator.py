"""``Simulator``: a simulated GPU fleet running one training job, with labelled faults.

    sim = Simulator(hosts=4, duration=600.0, seed=1, scenario="mixed")
    for batch in sim.batches():      # one list of records per time step
        ...
    sim.labels()                     # ground truth, known before iterating

Same arguments and seed give identical records (and identical JSON). The simulator is a plain
library: no wall clock, no I/O, no global state. ``SimSource`` adapts it to a producer's
``Source`` (producers/common.py), paced by event time when asked, so ``gpuwarden sim --kafka``
publishes through the same bounded sender and Kafka sink as the real producers.
"""

from __future__ import annotations

import math
import os
from typing import Any, Generator, Iterator

import numpy as np

from pipeline.bus.publish import Pacer

from .faults import TYPES, Runtime
from .fields import GpuModelSpec, model_spec
from .fleet import FleetState, Mods
from .nccl import NcclModel
from .nic import PORTS_PER_HOST, NicPorts
from .plan import make_plan
from .progress import ProgressModel
from .records import DcgmBuilder, add_noise
from .rng import gpu_uuid, substream
from .scenarios import DATA_QUALITY_DEFAULTS, Scenario, ScenarioError, load_scenario, resolve_time


NIC_INTERVAL_S = 10.0  # ``gpuwarden produce ib-sysfs``'s default poll


def _int_arg(name: str, v: object, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return int(v)


def _pos_arg(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: expected a positive number, got {v!r}")
    return float(v)


class Simulator:
    """A fleet of ``hosts`` x ``gpus_per_host`` GPUs running job ``job``, sampled every
    ``interval`` seconds of event time for ``duration`` seconds from ``start_ts``.

    ``scenario`` is a built-in name, a YAML path, a ``Scenario`` or None (healthy).
    ``nccl_interval`` is how often each rank reports its communicators' aggregate.
    """

    def __init__(
        self,
        hosts: int = 4,
        duration: float = 600.0,
        interval: float = 1.0,
        seed: int = 1,
        scenario: str | os.PathLike | Scenario | None = None,
        start_ts: float = 1764403200.0,
        gpus_per_host: int = 8,
        gpu_model: str = "NVIDIA H100 80GB HBM3",
        nccl_interval: float = 5.0,
        job: str = "pretrain",
        cluster: str = "sim",
    ) -> None:
        n_hosts = _int_arg("hosts", hosts, 1)
        self.gpus_per_host = _int_arg("gpus_per_host", gpus_per_host, 1)
        self.seed = _int_arg("seed", seed, 0)
        self.duration = _pos_arg("duration", duration)
        self.interval = _pos_arg("interval", interval)
        self.nccl_interval = _pos_arg("nccl_interval", nccl_interval)
        if isinstance(start_ts, bool) or not isinstance(start_ts, (int, float)) or not math.isfinite(start_ts):
            raise ValueError(f"start_ts: expected an epoch time in seconds, got {start_ts!r}")
        self.start_ts = float(start_ts)
        for name, v in (("gpu_model", gpu_model), ("job", job), ("cluster", cluster)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name}: expected a non-empty string, got {v!r}")
        self.gpu_model, self.job, self.cluster = gpu_model, job, cluster
        self.scenario: Scenario = load_scenario(scenario)
        self.spec = model_spec(gpu_model)
        width = max(3, len(str(n_hosts - 1)))
        self.hosts: list[str] = [f"gpu-node-{h:0{width}d}" for h in range(n_hosts)]
        self.host_kinds = self._host_kinds(n_hosts)
        self.delivery = self._delivery()
        self.n_steps = max(1, int(math.floor(self.duration / self.interval + 1e-9)))
        self.uuids: list[str] = [gpu_uuid(self.seed, h, g) for h in self.hosts for g in range(self.gpus_per_host)]
        self._plan = make_plan(
            self.scenario,
            host_names=self.hosts,
            gpus_per_host=self.gpus_per_host,
            duration=self.duration,
            seed=self.seed,
            start_ts=self.start_ts,
            job=job,
        )

    def _host_kinds(self, n_hosts: int) -> list[tuple[str, GpuModelSpec, bool]]:
        """Per host (GPU model, its spec, DCGM 4.6 field names?): ``gpu_models`` in host blocks."""
        gms = self.scenario.gpu_models
        if not gms:
            return [(self.gpu_model, self.spec, False)] * n_hosts
        shares = np.array([float(g.get("share", 1.0)) for g in gms])
        ends = np.rint(np.cumsum(shares) / max(shares.sum(), 1e-9) * n_hosts).astype(int)
        out: list[tuple[str, GpuModelSpec, bool]] = []
        for h in range(n_hosts):
            g = gms[min(int(np.searchsorted(ends, h, side="right")), len(gms) - 1)]
            out.append((g["model"], model_spec(g["model"]), g.get("field_names", "pre-4.6") == "4.6"))
        return out

    def _host_index(self, h: Any, where: str) -> int:  # a YAML key: a name, an index or junk
        if isinstance(h, str) and not h.isdigit():
            if h not in self.hosts:
                raise ScenarioError(f"{where}: no host named {h!r}")
            return self.hosts.index(h)
        i = int(h)
        if not 0 <= i < len(self.hosts):
            raise ScenarioError(f"{where}: host index {i} out of range (the fleet has {len(self.hosts)} hosts)")
        return i

    def _delivery(self) -> dict:
        """Per-host timestamp offsets, arrival delays and join times (``Scenario.delivery``)."""
        d = self.scenario.delivery
        H = len(self.hosts)
        rng = substream(self.seed, "delivery-static")
        phase = rng.uniform(0.0, self.interval, H) if d.get("phase") else np.zeros(H)
        skew = np.zeros(H)
        for h, v in (d.get("skew_s") or {}).items():
            skew[self._host_index(h, f"delivery.skew_s.{h}")] = float(v)
        late = {
            self._host_index(h, f"delivery.late_s.{h}"): (float(v[0]), float(v[1]))
            for h, v in (d.get("late_s") or {}).items()
        }
        join = np.zeros(H)
        for h, v in (d.get("join_s") or {}).items():
            join[self._host_index(h, f"delivery.join_s.{h}")] = resolve_time(v, self.duration)
        return {
            "offset": phase + skew,
            "jitter": float(d.get("jitter_s", 0.0)),
            "late": late,
            "join": join,
            "on": bool(d),
        }

    @property
    def n_gpus(self) -> int:
        return len(self.hosts) * self.gpus_per_host

    def labels(self) -> list[dict]:
        """Ground truth: one dict per fault (``fault`` set) or benign condition (``condition``
        set, ``fault`` None), in (onset, id) order; JSON-serialisable, a fresh copy each call."""
        return [{**lab, "params": dict(lab["params"])} for lab in self._plan.labels]

    def records(self) -> Iterator[dict]:
        """Every record of the run, in order (``batches()`` flattened)."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Generator[list[dict], None, None]:
        """One list of records per time step, in (ts, host, kind, gpu) order. Each call replays
        the run from the start and yields the same records."""
        H, G, dt = len(self.hosts), self.gpus_per_host, self.interval
        events = self._plan.events
        first_paused = any(e.type == "checkpoint" and e.t0 <= 0.0 < e.t1 for e in events)
        specs = [k[1] for k in self.host_kinds]
        fleet = FleetState(
            H,
            G,
            specs if len(set(specs)) > 1 else self.spec,
            self.seed,
            dt,
            self.scenario.ambient,
            start_paused=first_paused,
            start_ts=self.start_ts,
        )
        mods = Mods(fleet.N, H, fleet.board_w if len(set(specs)) > 1 else self.spec.power_limit_w)
        nccl = NcclModel(H, G, self.hosts, self.seed, self.job, self.spec.nvlink_busbw_gbs, self.scenario.nccl)
        mixed = len(set(self.host_kinds)) > 1 or self.host_kinds[0][2]
        dcgm = DcgmBuilder(
            fleet,
            self.spec,
            self.hosts,
            self.uuids,
            self.gpu_model,
            self.cluster,
            self.job,
            host_kinds=self.host_kinds if mixed else None,
            sources=tuple(self.scenario.sources),
        )
        progress = ProgressModel(nccl, self.hosts, self.job) if "progress" in self.scenario.sources else None
        dq = {**DATA_QUALITY_DEFAULTS, **self.scenario.data_quality}
        dq_rng = substream(self.seed, "data-quality")
        runtimes = [
            Runtime(
                event=e,
                rng=substream(self.seed, "event", e.id, e.type),
                gi=None if e.gpu is None or e.host is None else e.host * G + e.gpu,
            )
            for e in events
        ]
        # Checkpoints first: other effects (e.g. NVLink errors, which need traffic) look at it.
        pauses = [(e.t0, e.t1) for e in events if e.type in ("checkpoint", "job_restart")]
        restarts = sorted(e.t1 for e in events if e.type == "job_restart")
        all_idx = np.arange(fleet.N)
        host_of = fleet.host_of
        next_nccl = 1
        # The NIC ports' records (the ``nic`` source), every NIC_INTERVAL_S like ``produce
        # ib-sysfs``; stamped half a sample after the step so no DCGM record shares their time.
        nic = (
            NicPorts(self.hosts, [k[0] for k in self.host_kinds], G, self.seed)
            if "nic" in self.scenario.sources
            else None
        )
        next_nic = 0
        deliver = _Delivery(self, H) if self.delivery["on"] else None

        for k in range(self.n_steps):
            t = k * dt
            ts = round(self.start_ts + t, 3)
            while restarts and restarts[0] <= t + 1e-9:
                restarts.pop(0)
                nccl.restart()
            mods.reset()
            mods.paused = any(a - 1e-9 <= t < b - 1e-9 for a, b in pauses)
            for rt in runtimes:
                ev = rt.event
                if ev.t0 > t + 1e-9:
                    break  # events are in onset order
                if TYPES[ev.type].instant:
                    if not rt.done:
                        rt.done = True
                        TYPES[ev.type].apply(rt, t, dt, fleet, mods)
                elif t < ev.t1 - 1e-9:
                    TYPES[ev.type].apply(rt, t, dt, fleet, mods)
            out = fleet.step(ts, mods)

            # NCCL: the interval that ended at this step is reported now, then this step starts
            # the next interval.
            nccl_recs = None
            if t + 1e-9 >= next_nccl * self.nccl_interval:
                nccl_recs = nccl.emit(ts, ~mods.dead)
                next_nccl = int(math.floor((t + 1e-9) / self.nccl_interval)) + 1
            nccl.accumulate(dt, out.training, out.speed, mods.tp_h, mods.dp_bw)
            if progress is not None:
                prog_recs = progress.step(t, ts, mods.hung, mods.hang_timeout_s, mods.dead)
                if prog_recs is not None:
                    # A host's progress records follow its NCCL records.
                    nccl_recs = prog_recs if nccl_recs is None else [a + b for a, b in zip(nccl_recs, prog_recs)]
            nic_recs = None
            if nic is not None:
                nic.step(dt, self._nic_load(out.training, mods), mods.nic_down, mods.nic_polling,
                         mods.nic_sym_per_s, mods.nic_wait)  # fmt: skip
                if t + 1e-9 >= next_nic * NIC_INTERVAL_S:
                    nic_recs = nic.records(round(ts + dt / 2, 3), mods.host_hidden)
                    next_nic = int(math.floor((t + 1e-9) / NIC_INTERVAL_S)) + 1

            visible = ~(mods.gpu_hidden | mods.host_hidden[host_of])
            idx = all_idx if visible.all() else all_idx[visible]
            recs = dcgm.build(ts, out, idx)
            add_noise(recs, dq_rng, dq["blank_rate"], dq["missing_rate"])
            if deliver is not None:
                yield deliver.step(t, recs, nccl_recs, nic_recs)
                continue
            if nccl_recs is None and nic_recs is None:
                yield recs
                continue
            # Interleave per host: the host's DCGM records, then its NCCL and NIC records.
            batch: list[dict] = []
            bounds = np.searchsorted(host_of[idx], np.arange(H + 1)).tolist()
            for h in range(H):
                batch.extend(recs[bounds[h] : bounds[h + 1]])
                if nccl_recs is not None and not mods.host_hidden[h]:
                    batch.extend(nccl_recs[h])
                if nic_recs is not None:
                    batch.extend(nic_recs[h])
            yield batch
        if deliver is not None:
            yield deliver.rest()

    def _nic_load(self, training: np.ndarray, mods) -> np.ndarray:
        """Each port's share of line rate: its GPU's DP traffic while that GPU trains (a third of
        the link, less when the fabric is slower), a trickle otherwise; ports without a GPU idle."""
        H, G = len(self.hosts), self.gpus_per_host
        per_gpu = np.where(training, 0.33 * np.minimum(mods.dp_bw, 1.0), 0.01).reshape(H, G)
        load = np.full((H, PORTS_PER_HOST), 0.01)
        k = min(G, PORTS_PER_HOST)
        load[:, :k] = per_gpu[:, :k]
        return load


class _Delivery:
    """Per-host sampling phase, jitter and clock skew on the records' timestamps; a joining host
    sends nothing before it joins; a late host's records arrive in a later step's batch."""

    def __init__(self, sim: Simulator, H: int) -> None:
        d = sim.delivery
        self.offset, self.jitter, self.late, self.join = d["offset"], d["jitter"], d["late"], d["join"]
        self.hosts = {name: i for i, name in enumerate(sim.hosts)}
        self.rng = substream(sim.seed, "delivery")
        self.held: dict[int, list[tuple[float, list[dict]]]] = {h: [] for h in self.late}
        self.last_release = {h: -np.inf for h in self.late}
        self.H = H

    def step(
        self, t: float, recs: list[dict], nccl_recs: list[list[dict]] | None, nic_recs: list[list[dict]] | None = None
    ) -> list[dict]:
        by_host: list[list[dict]] = [[] for _ in range(self.H)]
        for r in recs:
            by_host[self.hosts[r["host"]]].append(r)
        if nccl_recs is not None:
            for h in range(self.H):
                by_host[h].extend(r for r in nccl_recs[h] if r["host"])
        if nic_recs is not None:
            for h in range(self.H):
                by_host[h].extend(nic_recs[h])
        noise = (
            np.clip(self.rng.normal(0.0, self.jitter, self.H), -3 * self.jitter, 3 * self.jitter)
            if self.jitter > 0
            else np.zeros(self.H)
        )
        delay = {h: float(self.rng.uniform(lo, hi)) for h, (lo, hi) in self.late.items()}
        out: list[dict] = []
        for h in range(self.H):
            if t + 1e-9 < self.join[h] or not by_host[h]:
                continue
            shift = float(self.offset[h] + noise[h])
            if shift:
                for r in by_host[h]:
                    r["ts"] = round(r["ts"] + shift, 3)
            if h in self.late:
                # A late host's records keep their order: each step's arrive no sooner than the last.
                release = max(self.last_release[h], t + delay[h])
                self.last_release[h] = release
                self.held[h].append((release, by_host[h]))
                continue
            out.extend(by_host[h])
        for h, q in self.held.items():
            while q and q[0][0] <= t + 1e-9:
                out.extend(q.pop(0)[1])
        return out

    def rest(self) -> list[dict]:
        out: list[dict] = []
        for q in self.held.values():
            for _, recs in q:
                out.extend(recs)
            q.clear()
        return out


class SimSource:
    """A ``Simulator`` as a producer ``Source``: each ``poll`` returns the next non-empty time
    step's records, held back until ``pacer`` says their event time is due (``speed`` times
    event time; None: as fast as they are asked for). ``done`` once the run is over."""

    def __init__(self, sim: Simulator, *, speed: float | None = None, pacer: Pacer | None = None) -> None:
        self.sim = sim
        self.pacer = pacer if pacer is not None else Pacer(speed)
        self.done = False
        self.steps = 0
        self.records = 0
        self._batches = sim.batches()

    def poll(self) -> list[dict]:
        """The next step's records (a step with none is skipped); [] once ``done``."""
        for batch in self._batches:
            if not batch:
                continue
            self.pacer.wait(batch[0]["ts"])
            self.steps += 1
            self.records += len(batch)
            return batch
        self.done = True
        return []

    def close(self) -> None:
        """Stop the run where it is."""
        self._batches.close()

    def summary(self) -> dict[str, int]:
        """Steps and records produced so far (the simulator drops nothing)."""
        return {"steps": self.steps, "records": self.records}
