"""Helpers of the host clock's tests: a plain reference of its release rule (docs/architecture.md §4,
one record at a time), the clock and an engine built for them, and messages fed to that engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.deadletters import Origins
from pipeline.engine import Engine, EngineConfig
from pipeline.engine.hostclock import (
    SAMPLE_SHIFT,
    STEP_RECOVERY,
    HostClock,
)
from pipeline.schema import DcgmRecord, NcclRecord, dcgm


@dataclass
class RefHost:
    hwm: float = math.nan
    seen: float = math.nan
    step: float = math.nan
    min_step: float = math.nan
    trusted: float = math.nan
    whole: bool = False
    lead: float = 0.0
    dcgm_ts: float = math.nan  # its newest DCGM sample as sent, and where it went (``move``)
    dcgm_at: float = math.nan


def ref_move(host: RefHost, t: float, tick: float) -> float:
    """Where a DCGM sample of ``host`` at ``t`` goes, as docs/architecture.md §4 says: a sample
    in the tick its host's newest sample went to, in that tick's last tenth and at least nine
    tenths of a tick after that sample as sent, goes to the next tick's start; another GPU of
    that sample (the same time) goes where it went; an older sample stays and is not the newest."""
    if not math.isfinite(t):
        return t
    margin = SAMPLE_SHIFT * tick
    new = t
    if t == host.dcgm_ts:
        new = host.dcgm_at
    elif t > host.dcgm_ts:
        k = math.floor(t / tick)
        if math.floor(host.dcgm_at / tick) == k and t >= (k + 1) * tick - margin and t - host.dcgm_ts >= tick - margin:
            new = (k + 1) * tick
    if not t < host.dcgm_ts:  # (NaN: its first)
        host.dcgm_ts, host.dcgm_at = t, new
    return new


@dataclass
class RefClock:
    """Each host's newest time, the stream's progress when its latest record came, its latest
    step forward, its shortest step (grown by 1 % a step; a longer step takes its place once it
    has grown past it) and the step that set that, the one it is trusted with."""

    config: EngineConfig
    hosts: dict[int, RefHost] = field(default_factory=dict)
    progress: float = -math.inf
    first_ts: float = math.inf
    fleet_step: float = math.nan  # the longest step of any host before the batch (``batch``)

    def batch(self) -> None:
        """A batch begins: a leap measures a host's second record by the fleet's steps then."""
        steps = [x.step for x in self.hosts.values() if not math.isnan(x.step)]
        self.fleet_step = max(steps) if steps else math.nan

    def hear(self, t: float, h: int) -> None:
        if math.isnan(t):
            return  # a time that is no number says nothing
        host = self.hosts.setdefault(h, RefHost())
        cfg = self.config
        # A leap: further than allowed_lateness past the stream's progress, in a step of its
        # own longer than allowed_lateness plus its step before (a first record: any step).
        ahead, own = t - self.progress, t - host.hwm
        # (No step of its own yet: the fleet's longest as the batch found it, ``fleet_step``.)
        before = self.fleet_step if math.isnan(host.step) else host.step
        leapt = math.isnan(own) or own > cfg.allowed_lateness + before
        if math.isfinite(self.progress) and ahead > cfg.allowed_lateness and leapt:
            host.lead = max(host.lead, min(ahead, cfg.max_ahead))
        self.progress = max(self.progress, t)
        host.seen = self.progress if math.isnan(host.seen) else max(host.seen, self.progress)
        if not math.isnan(host.hwm) and t > host.hwm:
            g = min(t - host.hwm, self.config.max_lag)
            host.step = g
            if math.isnan(host.min_step):
                host.min_step = host.trusted = g
            else:
                grown = host.min_step * STEP_RECOVERY
                if g < grown:
                    host.min_step, host.trusted = g, g
                elif g == grown:
                    host.min_step, host.trusted = g, min(host.trusted, g)
                else:
                    host.min_step = grown
        host.hwm = t if math.isnan(host.hwm) else max(host.hwm, t)

    def accept(self, t: float) -> None:
        if not math.isnan(t):
            self.first_ts = min(self.first_ts, t)

    def watermark(self, released: float, margin: dict[int, float]) -> tuple[float, dict[int, float] | None]:
        """The watermark and how far each active host is complete (replay: no wall clock).
        ``margin``: each host's jitter margin (how it is measured is tested apart)."""
        cfg, tick = self.config, self.config.tick
        known = {h: x for h, x in self.hosts.items() if not math.isnan(x.hwm)}
        if not known:
            return released, None
        newest = max(x.hwm for x in known.values())
        # Who is still sending is judged from the fleet's front: each host's newest time less
        # how far its clock once leapt ahead of the stream.
        front = max(x.hwm - x.lead for x in known.values())
        steps = [x.step for x in self.hosts.values() if not math.isnan(x.step)]
        fleet_step = max(steps) if steps else 0.0

        def wait(x: RefHost) -> float:
            s = fleet_step if math.isnan(x.step) else x.step
            return max(cfg.allowed_lateness + s, 2.5 * s)

        complete = {}
        for h, x in known.items():
            near = x.hwm >= front - cfg.allowed_lateness
            sending = front - x.seen <= wait(x)
            if not ((near or sending) and x.hwm >= front - cfg.max_lag):
                continue
            done = x.hwm
            if x.whole and not math.isnan(x.trusted):
                end = (math.floor(x.hwm / tick) + 1) * tick
                soonest = x.trusted - margin[h]
                upto = math.floor((x.hwm + soonest) / tick) * tick
                # Or its newest sample is its newest DCGM one, and its next, if in the tick that
                # one went to, is in its last tenth, nine tenths of a tick on: moved to the next.
                shift = SAMPLE_SHIFT * tick
                moved_end = (math.floor(x.dcgm_at / tick) + 1) * tick if math.isfinite(x.dcgm_at) else math.nan
                moves = x.dcgm_ts == x.hwm and soonest >= tick - shift and x.hwm + soonest >= moved_end - shift
                if moves:
                    end = moved_end
                if upto >= end or moves:
                    done = max(end, min(upto, math.floor(newest / tick) * tick))
            complete[h] = done - cfg.host_disorder
        wm = min(complete.values())
        hold = cfg.allowed_lateness + (fleet_step if steps else 0.0)
        if newest - self.first_ts < hold:
            return max(released, min(wm, newest - hold)), None
        return max(released, wm), complete


def batches(recs: list, cuts: list[int]) -> list[list]:
    bounds = [0, *[c for c in cuts if 0 < c < len(recs)], len(recs)]
    return [recs[i:j] for i, j in zip(bounds, bounds[1:]) if i < j]


def host_clock(config: EngineConfig, n: int, whole: list[bool]) -> HostClock:
    clock = HostClock(config)
    clock.grow(n)
    clock.whole[:n] = whole
    return clock


CONFIG = EngineConfig()


def message(ts: float, host: str, gpus: int = 2) -> list[DcgmRecord]:
    return [dcgm(ts, host, g, {"gpu_temp": 60}) for g in range(gpus)]


def feed(eng: Engine, msgs: list[tuple[str, list[DcgmRecord]]], whole: bool = True):
    recs = [r for _, m in msgs for r in m]
    sizes = [len(m) for _, m in msgs] if whole else [-1] * len(recs)
    return eng.process(recs, Origins.of_messages([f"t@{i}" for i in range(len(sizes))], sizes))


def engine(config: EngineConfig | None = None) -> Engine:
    return Engine(config or EngineConfig(), row_checks=[], tick_checks=[])


def process_pieces(eng: Engine, pieces: list[list]):
    """Feed ``pieces`` (each a list of one host's records: one array message) in one call."""
    recs = [r for p in pieces for r in p]
    return eng.process(recs, Origins.of_messages([f"t@{i}" for i in range(len(pieces))], [len(p) for p in pieces]))


def nccl_record(ts: float, host: str) -> NcclRecord:
    """An NCCL record of ``host`` at ``ts`` (another producer's, beside its DCGM samples)."""
    return NcclRecord(ts=ts, host=host, comm="c", rank=0, nranks=2, coll="AllReduce", bytes=8, exec_time_us=1.0)
