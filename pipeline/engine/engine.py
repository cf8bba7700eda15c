"""The engine: a plain object fed batches of telemetry records in event time.

``Engine.process(records)`` returns the alert state changes and dead letters that batch caused.
The Kafka service, file replay, rule tests, the demo and the benchmarks all drive this same
object; they differ only in where records come from and where the output goes.

Time (docs/architecture.md §4): every host has a high-water mark (its newest event time). The
watermark is the oldest high-water mark among active hosts (near the front, or still sending), so
a lagging host holds processing back instead of losing its data, and a dead host stops doing so
after ``allowed_lateness`` (live: ``idle_timeout`` of wall clock). A host sending per-host
messages counts up to the end of its newest sample's tick, so a second goes as soon as every
active host has sent it. Records are buffered and processed in event-time order once the
watermark passes them, tick by tick, skipping ticks with nothing due; a record older than what
was already processed is dead-lettered as ``late``. Hence any interleaving of hosts' streams
(each in order) gives the same alerts.

What a tick's rows are checked by comes in stages, run in order (``pipeline/engine/stage.py``):
the models, the built-in row checks, the rules, and any of one's own. The engine knows them by
that protocol only, so it imports neither ``pipeline.rules`` nor ``pipeline.models``. The rows
waiting for the watermark are in ``pending.py``, the snapshot's layout in ``snapshot.py``.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Callable, Sequence, cast, overload

import msgspec
import numpy as np

from pipeline.deadletters import ENTITY_LIMIT, LATE, TS_OUT_OF_RANGE, Origins, take_origins
from pipeline.engine.checks import GPU, HOST, RowCheck, TickCheck, absent_after, builtin_checks
from pipeline.engine.config import EngineConfig
from pipeline.engine.entities import Entities
from pipeline.engine.frame import Columnizer, DcgmFrame, NcclFrame, nccl_frame
from pipeline.engine.lifecycle import Lifecycle, Transition, alert_id
from pipeline.engine.pending import Pending, in_time_order, span
from pipeline.engine.snapshot import SNAPSHOT_VERSION, TelemetryRecordT, read_snapshot, write_snapshot
from pipeline.engine.stage import CheckStage, Stage, StageCheck
from pipeline.engine.state import GpuState, advance
from pipeline.numeric import grow
from pipeline.schema import AlertEvent, DcgmRecord, DcgmSample, DeadLetter, NcclRecord, TelemetryRecord

# Where they were defined before pending.py and snapshot.py: tests and tools import them from here.
_Pending, _span, _in_time_order = Pending, span, in_time_order
__all__ = ["SNAPSHOT_VERSION", "Engine", "EngineOutput", "TelemetryRecordT"]

_LATE, _AHEAD = 1, 2  # why _screen refuses a record
_REFUSED = {_LATE: LATE, _AHEAD: TS_OUT_OF_RANGE}
_TS, _HOST, _GPU = operator.attrgetter("ts"), operator.attrgetter("host"), operator.attrgetter("gpu")


@dataclass
class EngineOutput:
    alerts: list[AlertEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    def extend(self, other: "EngineOutput") -> None:
        self.alerts.extend(other.alerts)
        self.dead.extend(other.dead)


class Engine:
    """Detection over a stream of telemetry records.

    >>> from pipeline.schema import dcgm
    >>> eng = Engine()
    >>> out = eng.process([dcgm(1764403200.0 + t, "n1", 0, {"clocks_event_reasons": 0x40, "gpu_util": 99,
    ...                                                   "gpu_temp": 90, "sm_clock": 1005}) for t in range(20)])
    >>> out.extend(eng.flush())
    >>> [(a.state, a.fault, a.host, a.gpu, a.ts - a.started_at) for a in out.alerts]
    [('firing', 'thermal_throttling', 'n1', 0, 10.0)]
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        row_checks: Sequence[RowCheck] | None = None,
        tick_checks: Sequence[TickCheck] | None = None,
        rules: Stage | None = None,
        models: Stage | None = None,
        stages: Sequence[Stage] = (),
        forward: Callable[[list[TelemetryRecord]], None] | None = None,
        screened: bool = False,
    ) -> None:
        """Built-in checks run unless ``row_checks``/``tick_checks`` are given; with ``rules``,
        the YAML rules replace the built-in row checks (the absence checks stay). ``models``:
        online anomaly models (``pipeline.models``), evaluated each tick before the rules, which
        read their scores. ``stages``: more stages (``pipeline.engine.stage``), run after those
        in this order, each seeing what the earlier ones published.

        ``forward``: called with every batch's accepted records (after screening: what this engine
        will process), for a later stage of the topology (``pipeline/topology.py``).
        ``screened``: the records come from such a stage, already screened, ordered and released
        by its watermark (``advance_to``): only lateness is checked, never the fleet's clock."""
        self.config = config or EngineConfig()
        self.forward = forward
        self.screened = screened
        default_rows, default_ticks = builtin_checks()
        if row_checks is None and tick_checks is None:
            row_checks, tick_checks = ([] if rules is not None else default_rows), default_ticks
        self.tick_checks = list(tick_checks or [])
        # Models first: the rules' score() reads what they publish for the tick.
        self.stages: list[Stage] = [s for s in (models, CheckStage(row_checks or []), rules) if s is not None]
        self.stages += stages
        kinds = [s.kind for s in self.stages]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"two stages of one kind: {sorted(k for k in kinds if kinds.count(k) > 1)}")
        names = self._check_names(self.stages)
        self.entities = Entities()
        self.state = GpuState()
        self.host_hwm = np.full(0, np.nan)
        self.host_arrival = np.full(0, np.nan)  # wall clock of each host's latest arrival (live only)
        # Whether each host's latest records came as per-host messages, one host's GPUs at one
        # time each: such a host is complete for the tick of its newest sample.
        self.host_whole = np.zeros(0, bool)
        # Stream progress (the newest event time accepted) when each host's latest record came:
        # a host whose records keep coming is alive however far it lags (docs/architecture.md §4).
        self.host_seen = np.full(0, np.nan)
        # Event time of a host's latest record refused as ahead of the fleet (NaN: none since its
        # last good one): when half the fleet claims a jump, the fleet's present follows.
        self.host_jump = np.full(0, np.nan)
        # Each host's sampling interval (its latest step forward in event time): a host sampled
        # every 30 s is not gone 30 s after its last sample.
        self.host_step = np.full(0, np.nan)
        # The shortest step a host has sampled at, forgotten by 1 % a step (STEP_RECOVERY): how
        # far it is trusted not to sample again (_whole_bound), so that missed samples do not
        # stretch the promise and a host that samples more slowly for good is trusted so in time.
        self.host_min_step = np.full(0, np.nan)
        # How far a host's steps stray from whole multiples of its shortest step (a running
        # maximum that fades by JITTER_FADE a step), and over how many steps it was measured:
        # the margin the release rule gives a host for jitter (_whole_bound).
        self.host_jitter = np.full(0, np.nan)
        self.host_jitter_n = np.zeros(0)
        # Whether a host's rows of the tick after ``released`` run as soon as that host is
        # complete for it (_release_hosts): the service's host stage turns it on; replay leaves
        # it off, so that a replay's alerts come out in an order set by event time alone.
        self.release_hosts = False
        # How far each host's rows have been processed so, ahead of ``released`` (-inf: not).
        self.host_done = np.full(0, -np.inf)
        self._live_since: float | None = None  # wall clock of the first live arrival (not persisted)
        self.released = -math.inf  # every record with ts < released has been processed
        self.first_ts = math.inf  # oldest event time ever accepted: the stream's start
        self.next_tick = math.nan
        self.lifecycles = {n: self._new_lifecycle(n) for n in names}
        self._columnizer = Columnizer(self._columns())
        # Records waiting for the watermark: one chunk per batch, in arrival order. A release
        # takes whole chunks the watermark has passed and splits at most the chunks it cuts, so
        # its cost does not grow with what stays pending (the start-up hold can be 30 s of data).
        self._chunks: list[Pending] = []
        self.stats: Counter[str] = Counter()
        self._summaries: dict[str, str] = {}  # alert id -> summary, while firing

    # -- stages ------------------------------------------------------------------------------

    def stage(self, kind: str) -> Any:
        """The stage of ``kind`` ("checks", "models", "rules", ...), or None. Typed ``Any``: the
        engine knows stages by their protocol only, the caller that built it knows its class."""
        return next((s for s in self.stages if s.kind == kind), None)

    @property
    def rules(self) -> Any:
        """The rule set (``pipeline.rules.RuleSet``) this engine runs, or None."""
        return self.stage("rules")

    @property
    def models(self) -> Any:
        """The model set (``pipeline.models.ModelSet``) this engine runs, or None."""
        return self.stage("models")

    @property
    def row_checks(self) -> list[RowCheck]:
        """The built-in (or given) row checks."""
        return self.stage("checks").checks

    def _check_names(self, stages: Sequence[Stage]) -> list[str]:
        """Every check's name, or ValueError on a duplicate. In the order snapshots have always
        listed the lifecycles: row checks, tick checks, rules, models, then any other stage's."""
        rows = [s for s in stages if s.kind == "checks"]
        rest = sorted((s for s in stages if s.kind != "checks"), key=lambda s: s.kind != "rules")
        names = (
            [c.meta.name for s in rows for c in s.checks]
            + [c.meta.name for c in self.tick_checks]
            + [c.meta.name for s in rest for c in s.checks]
        )
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate check names: {sorted(n for n in names if names.count(n) > 1)}")
        return names

    def _columns(self) -> list[int]:
        cols: set[int] = set()
        for s in self.stages:
            cols.update(s.columns)
        return sorted(cols)

    @property
    def _reads_nccl(self) -> bool:
        return any(s.reads_nccl for s in self.stages)

    @property
    def decode_fields(self) -> tuple[str, ...]:
        """The DCGM field names (both spellings) this engine reads: what a decoder must keep."""
        return self._columnizer.names

    def _all_checks(self) -> list[StageCheck | TickCheck]:
        return [*self.tick_checks, *(c for s in self.stages for c in s.checks)]

    def _new_lifecycle(self, name: str) -> Lifecycle:
        check = next(c for c in self._all_checks() if c.meta.name == name)
        return Lifecycle(check.meta.for_s, check.meta.keep_firing_for_s)

    def set_rules(self, rules: Stage) -> None:
        """Swap in a new rule set (hot reload). Rules whose definition is unchanged keep their
        state (pending/firing alerts, windows); new or changed ones start fresh."""
        self.set_stage(rules)

    def set_stage(self, stage: Stage) -> None:
        """Swap in ``stage`` for the stage of its kind (one without such a stage gets it after
        the built-in row checks). What ``stage.adopt`` keeps of the old one keeps its state;
        the rest of its checks start fresh."""
        old = self.stage(stage.kind)
        if old is not None:
            stages = [stage if s is old else s for s in self.stages]
        else:
            at = next(i for i, s in enumerate(self.stages) if s.kind == "checks") + 1
            stages = self.stages[:at] + [stage] + self.stages[at:]
        self._check_names(stages)
        kept = stage.adopt(old) if old is not None else set()
        self.stages = stages
        for c in stage.checks:
            if c.meta.name not in kept:
                self.lifecycles[c.meta.name] = self._new_lifecycle(c.meta.name)
        self._columnizer = Columnizer(self._columns())
        live = {c.meta.name for c in self._all_checks()}
        for name in list(self.lifecycles):
            if name not in live:
                del self.lifecycles[name]

    # -- feeding ---------------------------------------------------------------------------

    def process(
        self, records: Sequence[TelemetryRecord], origins: Sequence[str] | None = None, now: float | None = None
    ) -> EngineOutput:
        """Take a batch (any order within the allowed lateness); return what it made happen.

        ``now``: the wall clock (monotonic seconds) of a live consumer; see ``idle_timeout``.
        Replay passes none, so its results depend on event time alone.
        """
        out = EngineOutput()
        n = len(records)
        if n:
            if origins is None:
                # Each record its own message: a caller that hands the engine records has said
                # nothing about per-host messages, so no host counts as whole (see _note_whole).
                origins = Origins(_Numbered("batch", n), np.arange(n), np.full(n, -1))
            # map() over C-level attribute getters: this runs once per record on the hot path.
            ts = np.fromiter(map(_TS, records), np.float64, n)
            hosts = self.entities.host_ids(list(map(_HOST, records)), limit=self.config.max_hosts)
            if (hosts < 0).any():
                records, origins, ts, hosts = self._refuse_new_hosts(records, origins, ts, hosts, out)
            nh = self.entities.n_hosts
            self.host_hwm = grow(self.host_hwm, nh, np.nan)
            self.host_seen = grow(self.host_seen, nh, np.nan)
            self.host_jump = grow(self.host_jump, nh, np.nan)
            self.host_step = grow(self.host_step, nh, np.nan)
            self.host_min_step = grow(self.host_min_step, nh, np.nan)
            self.host_jitter = grow(self.host_jitter, nh, np.nan)
            self.host_jitter_n = grow(self.host_jitter_n, nh, 0.0)
            self.host_done = grow(self.host_done, nh, -np.inf)
            # Live, a consumer may drain a backlog partition by partition, hours apart in event
            # time: there the decoder bounds time against the wall clock and aliveness is by
            # arrival, so one host ahead cannot carry the watermark; only replay screens here.
            screened = self._screen(ts, hosts) if now is None and not self.screened else self._screen_late(ts)
            if self.release_hosts:
                screened = self._screen_done(ts, hosts, records, screened)
            heard_ts, heard_hosts = ts, hosts
            if screened is not None:
                why, ref = screened
                bad = why != 0
                for i in np.flatnonzero(bad).tolist():
                    out.dead.append(self._refused(int(why[i]), records[i], origins[i], float(ref[i])))
                for code, reason in _REFUSED.items():
                    if c := int((why == code).sum()):
                        self.stats["dead." + reason] += c
                keep = np.flatnonzero(~bad)
                records = [records[i] for i in keep.tolist()]
                origins = take_origins(origins, keep)
                # A late record still says its host is there: a host first seen late (it joined
                # behind the others) holds the watermark from now on instead of losing every
                # record to lateness. Records refused as ahead say nothing of the kind.
                heard = why != _AHEAD
                heard_ts, heard_hosts = ts[heard], hosts[heard]
                ts, hosts = ts[keep], hosts[keep]
            if len(heard_ts):
                # Stream progress at each record (a running max): the same whatever the batching.
                prior = self.host_hwm[:nh]
                start = float(np.nanmax(prior)) if nh and not np.isnan(prior).all() else -math.inf
                np.fmax.at(self.host_seen, heard_hosts, np.maximum(np.maximum.accumulate(heard_ts), start))
                # Before latest_steps moves the shortest step its deviations are measured from.
                step_jitter(
                    self.host_jitter, self.host_jitter_n, heard_ts, heard_hosts, self.host_hwm, self.host_min_step
                )
                # The step the release rule waits by (docs/architecture.md §4); absence scales with
                # the step of released samples instead (GpuState.host_step, see _rows).
                latest_steps(
                    self.host_step,
                    heard_ts,
                    heard_hosts,
                    self.host_hwm,
                    self.config.max_lag,
                    shortest=self.host_min_step,
                )
                np.fmax.at(self.host_hwm, heard_hosts, heard_ts)
                # host_jump is kept by _screen_in_order record by record (the fast path runs only
                # when no host claims a jump): clearing it here for every host heard would make a
                # claim depend on whether its next record came in the same batch.
            if now is not None:
                self.host_arrival = grow(self.host_arrival, self.entities.n_hosts, np.nan)
                self.host_arrival[hosts] = now
                if self._live_since is None:
                    self._live_since = now
            self._note_whole(origins, hosts)
            self.first_ts = min(self.first_ts, float(ts.min())) if len(ts) else self.first_ts
            if len(ts):
                self._chunks.append(self._ingest(records, origins, ts, hosts, out))
                if self.forward is not None:
                    self.forward(list(records))
        if not self.screened:
            wm, complete = self._watermark(now)
            self._release(self._release_bound(wm), out, final=False)
            if self.release_hosts and complete is not None and self.host_local:
                self._release_hosts(complete, out)
        return out

    def advance_to(self, upto: float) -> EngineOutput:
        """Process everything before ``upto`` (whole ticks): the watermark of an engine fed by an
        earlier stage, which alone knows when every record of a second has come."""
        out = EngineOutput()
        if upto > self.released:
            self._release(self._release_bound(upto), out, final=False)
        return out

    def _ingest(
        self,
        records: Sequence[TelemetryRecord],
        origins: Sequence[str],
        ts: np.ndarray,
        hosts: np.ndarray,
        out: EngineOutput,
    ) -> Pending:
        """Arriving records -> the columns the engine keeps until the watermark passes them.

        Done on arrival, not on release: the record objects are freed at once (the start-up hold
        buffers ~30 s of the fleet, and a checkpoint carries what is buffered), and a release
        works on arrays only. Fields dropped as bad data are dead-lettered here.
        """
        k = len(records)
        # By type, not isinstance(): a type's membership in a set is ~3x cheaper per record.
        types = list(map(type, records))
        dcgm_types = {t for t in set(types) if issubclass(t, DcgmSample)}
        kinds = list(map(dcgm_types.__contains__, types))
        is_dcgm = np.array(kinds, dtype=bool)
        n = int(is_dcgm.sum())
        # The casts say what the type test above found: compact() reads any DcgmSample's fields.
        if n == k:
            drecs, dorig, dts, dhost = cast("list[DcgmRecord]", records), origins, ts, hosts
            nrecs: list[NcclRecord] = []
        else:  # compress(): the split in C, not a Python loop over the batch
            drecs, dorig = cast("list[DcgmRecord]", list(compress(records, kinds))), take_origins(origins, is_dcgm)
            dts, dhost = ts[is_dcgm], hosts[is_dcgm]
            nrecs = cast("list[NcclRecord]", list(compress(records, map(operator.not_, kinds))))
        cols = self._columnizer.columns
        if n:
            gpu = self.entities.gpu_ids_of(dhost, np.fromiter(map(_GPU, drecs), np.int64, n))
            self.entities.note_labels(gpu, drecs)  # the job on each GPU, for its alerts
            for stage in self.stages:
                stage.ingest(gpu, drecs)
            values, dead = self._columnizer.compact(drecs, dorig)
            for d in dead:
                self.stats["dead." + d.reason] += 1
            out.dead.extend(dead)
        else:
            gpu, values = np.empty(0, np.int32), np.empty((0, len(cols)))
        nts = ts[~is_dcgm] if n < k else np.empty(0)
        if nrecs:
            self.entities.note_nccl(nrecs)
        # The models' NCCL detectors need the records' columns; without such a stage they are counted.
        nccl = self._nccl_frame(nrecs, hosts[~is_dcgm]) if nrecs and self._reads_nccl else None
        return Pending(dts, dhost, gpu, values, cols, nts, nccl, float(ts.min()), float(ts.max()))

    def _ingest_buffered(self, records: list[TelemetryRecord], origins: list[str]) -> None:
        """Records a version-1 snapshot buffered, ingested as on arrival; their dropped-field
        dead letters were not written yet (they are counted in stats)."""
        if records:
            ts = np.array([r.ts for r in records], dtype=np.float64)
            hosts = self.entities.host_ids([r.host for r in records])
            self._chunks.append(self._ingest(records, origins, ts, hosts, EngineOutput()))

    def _refuse_new_hosts(
        self,
        records: Sequence[TelemetryRecord],
        origins: Sequence[str],
        ts: np.ndarray,
        hosts: np.ndarray,
        out: EngineOutput,
    ) -> tuple:
        """Records of hosts beyond ``max_hosts`` -> ``entity_limit`` dead letters."""
        for i in np.flatnonzero(hosts < 0).tolist():
            r = records[i]
            out.dead.append(
                DeadLetter(
                    reason=ENTITY_LIMIT,
                    detail=f"host {r.host!r} would be host number "
                    f"{self.entities.n_hosts + 1}; this engine keeps at most "
                    f"{self.config.max_hosts} (engine.max_hosts)",
                    origin=origins[i],
                    ts=r.ts,
                    host=r.host,
                )
            )
        self.stats["dead." + ENTITY_LIMIT] += int((hosts < 0).sum())
        keep = np.flatnonzero(hosts >= 0)
        return [records[i] for i in keep.tolist()], take_origins(origins, keep), ts[keep], hosts[keep]

    # -- screening arrivals against the fleet's clock ------------------------------------------

    def _note_whole(self, origins: Sequence[str], hosts: np.ndarray) -> None:
        """Which hosts of this batch sent per-host messages only (docs/architecture.md §4)."""
        nh = self.entities.n_hosts
        self.host_whole = grow(self.host_whole, nh, False)
        if not len(hosts):
            return
        if isinstance(origins, Origins):
            m = origins.msg
            whole = origins.pos >= 0  # an element of an array message, not a bare record
        else:  # decoded message by message (a batch of one, or a doubtful one): "<origin>#<i>"
            parts = [o.rpartition("#") for o in origins]
            whole = np.array([sep == "#" and i.isdigit() for _, sep, i in parts], bool)
            ids: dict[str, int] = {}
            m = np.array([ids.setdefault(name, len(ids)) for name, _, _ in parts], np.int64)
        mixed = (m[1:] == m[:-1]) & (hosts[1:] != hosts[:-1])
        if mixed.any():  # a message with several hosts' records: not per host
            whole &= ~np.isin(m, m[1:][mixed])
        self.host_whole[hosts] = True
        self.host_whole[hosts[~whole]] = False

    def _wait(self, n: int, step: np.ndarray | None = None) -> np.ndarray:
        """How much stream progress each host may go without a record and still count as there:
        ``allowed_lateness`` plus its sampling step (a host seen once: the fleet's longest), and
        at least two and a half steps, as absence has it (checks.absent_after): a host that
        misses one sample still counts when its next one comes. At 30 s sampling and the default
        lateness, one missed sample is 60 s of silence, and the next sample, falling in a tick
        the other hosts had completed meanwhile, was late. ``step``: the hosts' steps, when not
        ``host_step``'s."""
        step = grow(self.host_step, n, np.nan)[:n] if step is None else step
        known = step[~np.isnan(step)]
        step = np.where(np.isnan(step), known.max() if len(known) else 0.0, step)
        return np.maximum(self.config.allowed_lateness + step, 2.5 * step)

    def _alive(self) -> np.ndarray:
        """Hosts near the front, or whose records kept coming within ``allowed_lateness`` of stream
        progress: the hosts whose clocks say where the fleet is."""
        n = self.entities.n_hosts
        hwm, seen = self.host_hwm[:n], self.host_seen[:n]
        if not n or np.isnan(hwm).all():
            return np.zeros(n, bool)
        newest, lateness = float(np.nanmax(hwm)), self.config.allowed_lateness
        wait = self._wait(n)
        with np.errstate(invalid="ignore"):
            return (hwm >= newest - lateness) | (newest - seen <= wait)

    def _newest(self) -> float:
        """The newest event time accepted so far (-inf before any)."""
        hwm = self.host_hwm[: self.entities.n_hosts]
        return float(np.nanmax(hwm)) if len(hwm) and not np.isnan(hwm).all() else -math.inf

    @staticmethod
    def _present(claimed: np.ndarray, alive: np.ndarray) -> float:
        """The fleet's present: the lower median of what the live hosts claim (NaN: none yet)."""
        known = claimed[alive & ~np.isnan(claimed)]
        if not len(known):
            return math.nan
        k = (len(known) - 1) // 2
        return float(np.partition(known, k)[k])

    def _screen_late(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Only what is older than what was processed (the live engine's screen)."""
        late = ts < self.released
        if not late.any():
            return None
        return np.where(late, _LATE, 0).astype(np.int8), np.full(len(ts), self.released)

    def _screen_done(
        self,
        ts: np.ndarray,
        hosts: np.ndarray,
        records: Sequence[TelemetryRecord],
        screened: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``screened`` and, as ``late``, each DCGM sample older than what its host's early
        release processed already (``host_done``, ``_release_hosts``). NCCL records are never
        released early: they wait for ``released`` as before."""
        done = self.host_done[hosts]
        late = (ts < done) & (ts >= self.released)
        if screened is not None:
            late &= screened[0] == 0
        if not late.any():
            return screened
        idx = np.flatnonzero(late)
        late[idx] = [isinstance(records[i], DcgmSample) for i in idx.tolist()]
        if not late.any():
            return screened
        why, ref = screened if screened is not None else (np.zeros(len(ts), np.int8), np.full(len(ts), self.released))
        return np.where(late, _LATE, why).astype(np.int8), np.where(late, done, ref)

    def _screen(self, ts: np.ndarray, hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Why each arriving record is refused (0: it is not) and the present it was judged
        against, or None when none is refused.

        ``late``: older than what was processed, or further behind the fleet than ``max_lag``;
        ``ts_out_of_range``: further ahead of the fleet's present than ``max_ahead`` (one bad
        clock, or one record dated 2096, must not carry the watermark, and every other host's
        data, with it; nor make the engine walk 46 hours of ticks). Judged record by record in
        stream order, so the answer does not depend on the batching; the common case (nothing
        ahead, no jump claimed) is one vectorised comparison.
        """
        nh = self.entities.n_hosts
        cfg = self.config
        claimed = np.fmax(self.host_hwm[:nh], self.host_jump[:nh])
        alive = self._alive()
        present = self._present(claimed, alive)
        k = (len(ts) - 1) // 2
        median = float(np.partition(ts, k)[k])
        if not np.isnan(self.host_jump[:nh]).all():
            return self._screen_in_order(ts, hosts, claimed, median)
        # Not the present now but the lowest it can fall to within the batch: record by record a
        # host can come to count or one at the median stop, and the answer must not change.
        low = median if math.isnan(present) else self._lowest_present(ts, hosts, claimed, alive)
        if (ts > low + cfg.max_ahead).any():
            return self._screen_in_order(ts, hosts, claimed, median)
        # Behind: against the stream's progress when the record came (a running max), which
        # nothing ahead can have inflated here, and which is the same whatever the batching.
        clock = np.maximum.accumulate(ts)
        np.maximum(clock, self._newest(), out=clock)
        behind = (ts < self.released) | (ts < clock - cfg.max_lag)
        if not behind.any():
            return None
        return np.where(behind, _LATE, 0).astype(np.int8), clock

    def _lowest_present(self, ts: np.ndarray, hosts: np.ndarray, claimed: np.ndarray, alive: np.ndarray) -> float:
        """The lowest the present can fall to while ``_screen_in_order`` judges this batch, as
        long as none of its records is ahead (its premise: it is the check of that).

        Claims only rise then, so the present falls only as the set of live hosts changes: a host
        comes to count (one heard in the batch, or one seen once, whose wait the fleet's longest
        step can lengthen) or stops (one alive now that the batch's newest record can outrun).
        The lowest lower median over those sets keeps every host sure to stay alive and adds
        the others' lowest claims from the bottom while they pull it down."""
        cfg = self.config
        n = len(claimed)
        newest = max(self._newest(), float(ts.max()))
        hwm, seen = self.host_hwm[:n], self.host_seen[:n]
        sending = np.zeros(n, bool)
        sending[hosts] = True
        first = np.full(n, np.inf)
        np.minimum.at(first, hosts, ts)
        low = np.where(np.isnan(claimed), first, claimed)  # a new host claims at least its first record
        with np.errstate(invalid="ignore"):
            # Alive through to the batch's newest record whatever comes (wait >= allowed_lateness).
            sure = alive & ((hwm >= newest - cfg.allowed_lateness) | (seen >= newest - cfg.allowed_lateness))
        may = (alive | sending | np.isnan(self.host_step[:n])) & ~sure & np.isfinite(low)
        if not may.any():
            return self._present(claimed, sure)
        counted = np.sort(low[sure]).tolist()
        for c in np.sort(low[may]).tolist():
            if counted and c > counted[(len(counted) - 1) // 2]:
                break  # this one and every one after it would only raise the median
            bisect.insort(counted, c)
        return counted[(len(counted) - 1) // 2]

    def _screen_in_order(
        self, ts: np.ndarray, hosts: np.ndarray, claimed: np.ndarray, first: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``_screen`` one record at a time (a host or the fleet claims a jump: rare).

        Each record is judged on the state process() would have left had the records before it
        come one batch each: marks, stream progress and sampling steps are kept up to date here
        as process() keeps them, on copies (process() reads the state before the batch)."""
        cfg = self.config
        n = self.entities.n_hosts
        claimed = claimed.copy()
        hwm, seen, jump = self.host_hwm[:n].copy(), self.host_seen[:n].copy(), self.host_jump
        step = self.host_step[:n].copy()
        wait = self._wait(n)
        why = np.zeros(len(ts), np.int8)
        ref = np.empty(len(ts))
        newest = self._newest()
        for i, (t, h) in enumerate(zip(ts.tolist(), hosts.tolist())):
            # Aliveness as _alive() has it (a host that went silent in the middle of this batch
            # stops counting for the present); the sending host counts only if it did already.
            with np.errstate(invalid="ignore"):
                alive = (hwm >= newest - cfg.allowed_lateness) | (newest - seen <= wait)
            present = self._present(claimed, alive)
            start = math.isnan(present)  # no host yet: the batch's median judges what is ahead
            ref[i] = present = first if start else present
            if t > present + cfg.max_ahead:
                why[i] = _AHEAD
                jump[h] = t
                claimed[h] = t if math.isnan(claimed[h]) else max(t, claimed[h])
                continue  # a record refused as ahead says nothing of its host (see process())
            if t < self.released or t < newest - cfg.max_lag:
                why[i] = _LATE
                ref[i] = newest
            else:
                jump[h] = np.nan
            # Heard, late or not: as process() has it, the host's mark, step and progress move.
            if math.isnan(hwm[h]) or t > hwm[h]:
                if not math.isnan(hwm[h]):
                    step[h] = min(t - hwm[h], cfg.max_lag)
                    wait = self._wait(n, step)
                hwm[h] = t
            claimed[h] = hwm[h] if math.isnan(jump[h]) else max(hwm[h], jump[h])
            newest = max(newest, t)
            seen[h] = newest if math.isnan(seen[h]) else max(seen[h], newest)
        return why, ref

    def _refused(self, code: int, r: TelemetryRecord, origin: str, present: float) -> DeadLetter:
        raw = msgspec.json.encode(r).decode()[:2048]
        if code == _AHEAD:
            return DeadLetter(
                reason=TS_OUT_OF_RANGE,
                detail=f"ts {r.ts} is {r.ts - present:.0f}s ahead of the "
                f"fleet's present {present} (max ahead {self.config.max_ahead}s)",
                origin=origin,
                ts=r.ts,
                host=r.host,
                raw=raw,
            )
        hid = self.entities.host_id.get(r.host)
        if r.ts >= self.released and hid is not None and r.ts < self.host_done[hid]:
            detail = (
                f"ts {r.ts} is behind {self.host_done[hid]}, up to which host {r.host!r}'s samples "
                f"were processed already (its message of that tick held every GPU's sample)"
            )
        elif r.ts >= self.released:
            detail = (
                f"ts {r.ts} is {present - r.ts:.0f}s behind the newest record {present} "
                f"(max lag {self.config.max_lag}s)"
            )
        else:
            detail = (
                f"ts {r.ts} is {self.released - r.ts:.1f}s behind the watermark {self.released} "
                f"(allowed lateness {self.config.allowed_lateness}s)"
            )
        return DeadLetter(reason=LATE, detail=detail, origin=origin, ts=r.ts, host=r.host, raw=raw)

    def flush(self) -> EngineOutput:
        """End of stream (replay, demo): process everything still buffered."""
        out = EngineOutput()
        self._release(math.inf, out, final=True)
        return out

    def watermark(self, now: float | None = None) -> float:
        """Event time before which every record has come (or will count as late): what a
        release may process. ``now``: the wall clock of a live consumer (``process``)."""
        return self._watermark(now)[0]

    def _watermark(self, now: float | None) -> tuple[float, np.ndarray | None]:
        """The watermark, and how far each host is complete (-inf: not one the watermark waits
        for; None: neither start-up hold is over, so no host's word is taken yet)."""
        n = self.entities.n_hosts
        hwm = self.host_hwm[:n]
        known = ~np.isnan(hwm)
        if not known.any():
            return self.released, None
        if (
            now is not None
            and self._live_since is not None
            and now - self._live_since < self.config.idle_timeout
            and self.pending < self.config.max_pending
        ):
            return self.released, None  # live start-up: let every partition deliver first
        newest, lateness = float(hwm[known].max()), self.config.allowed_lateness
        seen = grow(self.host_seen, n, np.nan)[:n]
        wait = self._wait(n)
        with np.errstate(invalid="ignore"):
            # Near the front, or still sending (however far behind, up to max_lag).
            active = known & ((hwm >= newest - lateness) | (newest - seen <= wait))
            active &= hwm >= newest - self.config.max_lag
        if now is not None:
            arrival = grow(self.host_arrival, n, np.nan)[:n]
            heard = ~np.isnan(arrival)
            with np.errstate(invalid="ignore"):
                recent = now - arrival <= self.config.idle_timeout
            # Live, a host heard from holds the watermark while its records keep arriving on the
            # wall clock, however far behind (a backlog drained partition by partition), and
            # stops holding it ``idle_timeout`` after its last one, however near the front.
            live = np.where(heard, known & recent, active)
            if live.any():  # (the whole fleet silent: as replay has it, until the idle flush)
                active = live
        complete = np.where(active, self._whole_bound(hwm, active, newest) - self.config.host_disorder, -np.inf)
        wm = float(complete[active].min())
        # A host's first sample may come up to its sampling interval after the stream's start:
        # at 30 s sampling, 30 s of lateness alone is not time enough for every host to appear.
        hold = (
            lateness + float(np.nanmax(self.host_step[:n], initial=0.0))
            if n and not np.isnan(self.host_step[:n]).all()
            else lateness
        )
        if newest - float(np.nanmin(self.first_ts)) < hold:
            # Start-up: hosts come online a little apart and one not seen yet cannot hold the
            # watermark, so wait out the allowed lateness before trusting the per-host marks.
            return max(self.released, min(wm, newest - hold)), None
        return max(self.released, wm), complete

    def _whole_bound(self, hwm: np.ndarray, active: np.ndarray, newest: float) -> np.ndarray:
        """How far each host is complete: its newest sample, or more for a host sending per-host
        messages (its message held every GPU at that time). Its next sample is not due before
        ``hwm + step`` (``step``: the shortest step it has sampled at, ``host_min_step``; less a
        margin for jitter, ``_jitter_margin``: 5 % of the step until the host has shown its
        own), so the tick of ``hwm`` is whole
        when that falls in a later tick: at 1 Hz and a 1 s tick a second goes once every live
        host has sent it, not the next one. And every later tick before that one is whole too,
        up to the tick of the fleet's newest sample: with a tick shorter than the step
        (``engine.tick`` 0.1 s at 1 Hz) a sample goes within a tick or so, whatever the other
        hosts' phases. Not past the newest sample's tick: a host back from a silence (not
        counted in the watermark meanwhile) is then judged against the present, not against
        what the others promised (docs/architecture.md §4)."""
        n = len(hwm)
        whole = grow(self.host_whole, n, False)[:n] & active
        if not whole.any():
            return hwm
        tick = self.config.tick
        step = grow(self.host_min_step, n, np.nan)[:n]
        end = (np.floor(hwm / tick) + 1) * tick
        with np.errstate(invalid="ignore"):
            upto = np.floor((hwm + step - self._jitter_margin(step, n)) / tick) * tick
            whole &= upto >= end
        ahead = np.maximum(end, np.minimum(upto, math.floor(newest / tick) * tick))
        return np.where(whole, ahead, hwm)

    def _jitter_margin(self, step: np.ndarray, n: int) -> np.ndarray:
        """How much sooner than its shortest step each host's next sample may come: 5 % of the
        step (or of a tick, if more) until the host has shown its jitter over
        ``JITTER_TRUSTED_AFTER`` steps, then twice the largest deviation it showed (fading), no
        less than 0.5 % and no more than 5 %. A producer stamping from a steady clock (ms of
        jitter) is trusted for a tick once its sample falls past the first 0.5 % of it, not 5 %."""
        scale = np.maximum(step, self.config.tick)
        jitter = grow(self.host_jitter, n, np.nan)[:n]
        shown = grow(self.host_jitter_n, n, 0.0)[:n] >= JITTER_TRUSTED_AFTER
        with np.errstate(invalid="ignore"):
            return np.where(shown, np.clip(2 * jitter, 0.005 * scale, 0.05 * scale), 0.05 * scale)

    # -- processing in event time ---------------------------------------------------------------

    def _release(self, wm: float, out: EngineOutput, final: bool) -> None:
        go: list[Pending] = []
        stay: list[Pending] = []
        for c in self._chunks:
            if c.tmax < wm:
                go.append(c)
            elif c.tmin >= wm:
                stay.append(c)
            else:
                before, after = c.split(wm)
                go.append(before)
                stay.append(after)
        self._chunks = stay
        if go:
            self._process_released(Pending.concat(go, self._columnizer.columns), out)
        if final:
            hwm = self.host_hwm[: self.entities.n_hosts]
            upto = float(np.nanmax(hwm)) if len(hwm) and not np.all(np.isnan(hwm)) else -math.inf
            self._ticks_until(upto, out)
            self.released = max(self.released, upto)
        else:
            self._ticks_until(wm, out)
            self.released = max(self.released, wm)

    def _release_bound(self, wm: float) -> float:
        # Whole ticks only: a tick's samples are always processed together, so windows and
        # peer comparisons never depend on where a batch happened to end.
        if math.isinf(wm):
            return wm
        # (1e-6 of a tick: a bound of n ticks computed as n * tick may fall just short of it.)
        return math.floor(wm / self.config.tick + 1e-6) * self.config.tick

    @property
    def host_local(self) -> bool:
        """Whether every stage judges a GPU by its own host's rows alone (``Stage.host_local``):
        then a host's rows of a tick need not wait for the other hosts' (``_release_hosts``)."""
        return all(getattr(s, "host_local", False) for s in self.stages)

    def _release_hosts(self, complete: np.ndarray, out: EngineOutput) -> None:
        """With ``release_hosts``: run the rows of the tick after ``released`` of each host
        complete for it, before the other hosts have sent that tick.

        A tick goes once every host the watermark waits for has sent it; with hosts sampling
        at their own phases of the second that is up to a second after a host's message came.
        When every stage is host-local, a GPU's conditions read only its own host's rows and
        the state they left, so a host's rows of that tick give the same conditions and alerts
        run on their own as with the others': they go as soon as the host is complete for the
        tick (``complete``, per host, as the watermark has it), and what the host sends of
        that tick afterwards is ``late``, as it would be once the tick went. The tick's
        boundary (absence) and the ticks after it still wait for ``released``. The same alerts
        come out, only sooner and grouped by when each host's rows went: the service's host
        stage does this, replay does not, so that a replay's output, alert order included,
        depends on event time alone (docs/architecture.md §4, release).
        """
        tick, end = self.config.tick, self.next_tick
        # The next tick's rows only, once the ticks before it have run (the grid's next point
        # is where ``released`` ends); its boundary and everything after wait for the watermark.
        if math.isnan(end) or not math.isfinite(self.released) or abs(end - tick - self.released) > 1e-6 * tick:
            return
        n = len(complete)
        ready = (complete >= end) & (self.host_done[:n] < end)
        if not ready.any():
            return
        go: list[Pending] = []
        for i, c in enumerate(self._chunks):
            if not len(c.ts) or c.tmin >= end:
                continue
            sel = ready[c.host] & (c.ts < end)
            if sel.any():
                go.append(c.take_rows(sel))
                self._chunks[i] = c.take_rows(~sel, nccl=True)
        self.host_done[:n][ready] = end
        if go:
            self.stats["early_releases"] += 1
            self._process_released(Pending.concat(go, self._columnizer.columns), out)

    def _process_released(self, go: Pending, out: EngineOutput) -> None:
        """Released rows (arrival order), sorted into event time and run tick by tick."""
        self.stats["records.nccl"] += len(go.nccl_ts)
        if go.nccl is not None and len(go.nccl):
            # The models' NCCL detectors score each record with the tick it belongs to (see _rows).
            for stage in self.stages:
                if stage.reads_nccl:
                    stage.released(go.nccl)
        n = len(go.ts)
        if not n:
            return
        self.stats["records.dcgm"] += n
        if in_time_order(go.ts, go.gpu):
            # Already in (time, GPU) order, as a tick arrives from a fleet that samples in step:
            # the rows as they are, without a sort and a copy of every column.
            frame = DcgmFrame(go.ts, go.gpu, go.host, go.values)
        else:
            order = np.lexsort((go.gpu, go.ts))
            frame = DcgmFrame(go.ts[order], go.gpu[order], go.host[order], go.values[order])
        if math.isnan(self.next_tick):
            self.next_tick = (math.floor(frame.ts[0] / self.config.tick) + 1) * self.config.tick
        # Rows before each tick, then the tick itself: absence is judged on a fixed grid, so the
        # outcome does not depend on how the stream was cut into batches.
        start = 0
        while start < n:
            cut = int(np.searchsorted(frame.ts, self.next_tick, side="left"))
            if cut > start:
                self._rows(frame.take(slice(start, cut)), out, self.next_tick - self.config.tick)
                start = cut
            if start < n:
                # Ticks up to the next row's time all see the state the rows before left.
                self._skip_ahead(float(frame.ts[start]))
                if self.next_tick <= frame.ts[start]:
                    self._tick(self.next_tick, out)
                    after = self.next_tick + self.config.tick
                    if not after > self.next_tick:
                        # Float spacing above a tick (as in _ticks_until): the rest share this tick.
                        self._rows(frame.take(slice(start, n)), out, self.next_tick)
                        break
                    self.next_tick = after

    def _nccl_frame(self, nrecs: list[NcclRecord], hosts: np.ndarray) -> NcclFrame:
        names = list(map(_HOST, nrecs))
        idx = list(map(_GPU, nrecs))
        if None not in idx:
            gpus = self.entities.gpu_ids(names, idx)
        else:
            gpus = np.fromiter(
                (-1 if g is None else self.entities.gpu(h, g) for h, g in zip(names, idx)), np.int32, len(nrecs)
            )
        return nccl_frame(nrecs, hosts, gpus)

    def _ticks_until(self, upto: float, out: EngineOutput) -> None:
        while not math.isnan(self.next_tick) and self.next_tick <= upto:
            self._skip_ahead(upto)
            if self.next_tick <= upto:
                self._tick(self.next_tick, out)
                after = self.next_tick + self.config.tick
                if not after > self.next_tick:
                    # Float spacing above a tick (event time ~1e16 s and beyond at a 1 s tick): no
                    # later tick exists, and stepping would stand still for ever.
                    break
                self.next_tick = after

    def _skip_ahead(self, limit: float) -> None:
        """Jump the tick grid over the ticks up to ``limit`` at which nothing can be due.

        Called where no row falls between ``next_tick`` and ``limit``, so those ticks all see the
        same state; only the tick checks (absence) and their lifecycles act at a tick without
        rows. Over a run of ticks where no check's condition can flip (``changes``) and no
        lifecycle deadline falls (``for:``, ``keep_firing_for:``; ``Lifecycle.next_change``),
        walking every tick is the same as one step at the last of them, and when no condition
        holds and no alert is active, the same as none. So a fleet sampled every 30 s costs a
        tick check per sample, not 30, and a two-day pause a handful of ticks, with the alerts
        of the walk (tested against it, docs/architecture.md §4).
        """
        tick, a = self.config.tick, self.next_tick
        if math.isinf(limit) or math.isnan(a):
            return
        last = math.floor(limit / tick) * tick
        if not last > a:  # the densely sampled case: at most this tick before the next row
            return
        st, ent, cfg = self.state, self.entities, self.config
        st.ensure(ent.n_gpus, ent.n_hosts)
        idle = True
        for check in self.tick_checks:
            changes = getattr(check, "changes", None)
            if changes is not None:
                x = changes(st, ent, cfg)
                with np.errstate(invalid="ignore"):
                    x = x[x >= a - 2 * tick]  # those further back have flipped already
            elif a <= self._settled_after() + 2 * tick:
                return  # a check that cannot say when it changes: walked until all is settled
            else:
                x = np.empty(0)
            lc = self.lifecycles[check.meta.name]
            cond = check.evaluate_tick(a, st, ent, cfg)
            cond = cond if cond.dtype == bool else cond.astype(bool)
            due = lc.next_change(cond)
            if len(x):
                due = min(due, float(x.min()))
            # A whole tick of margin on either side of a deadline: the tick where it falls is
            # walked whatever the rounding of ``t - last_ts > after``.
            if due <= last + tick:
                if due < a:
                    return
                last = math.floor(due / tick) * tick - tick
                if last < a:
                    return
            idle = idle and lc.idle and not cond.any()
        if idle:
            self.next_tick = last + tick  # every one of these ticks would do nothing
        elif last > a:
            self.next_tick = last  # one step, at the last of them, does what all would

    def _settled_after(self) -> float:
        """When every absence deadline after the newest sample has passed and every lifecycle
        on it has settled: the bound for a tick check that cannot say when it changes."""
        cfg = self.config
        last = (
            float(np.nanmax(self.state.last_ts))
            if len(self.state.last_ts) and not np.isnan(self.state.last_ts).all()
            else -math.inf
        )
        hold = max((c.meta.for_s + c.meta.keep_firing_for_s for c in self.tick_checks), default=0.0)
        step = np.concatenate([self.host_step, self.state.host_step])  # released steps come from arrived ones
        step = step[~np.isnan(step)]
        slow = 2.5 * float(step.max()) if len(step) else 0.0  # checks.absent_after
        return last + max(cfg.gpu_absent_after, cfg.host_silent_after, slow) + hold + 2 * cfg.tick

    def _rows(self, frame: DcgmFrame, out: EngineOutput, ts0: float) -> None:
        gpu = frame.gpu
        chunk = frame if (gpu[1:] >= gpu[:-1]).all() else frame.take(np.argsort(gpu, kind="stable"))
        self._note_returns(chunk)
        # After _note_returns, which judges a return by the step before it; before advance moves
        # host_last_ts. Taken here, on release and in event time, not on arrival: whether a host
        # back from a silence still counted as silent at a tick must not depend on whether its
        # next sample had arrived yet (tests/unit/engine/test_engine_properties.py).
        latest_steps(self.state.host_step, frame.ts, frame.host, self.state.host_last_ts, self.config.max_lag)
        view = advance(self.state, chunk, self.entities, ts0, self._columnizer.column_array)
        outputs: dict[str, Any] = {}  # what each stage publishes for the later ones
        conds: list[tuple[StageCheck, np.ndarray]] = []
        for stage in self.stages:
            conds += stage.run(view, self.entities, outputs)
        transitions: list[tuple[StageCheck, Transition]] = []
        lifecycles = self.lifecycles
        for check, cond in conds:
            cond = cond == 1 if cond.dtype != bool else cond
            if check.meta.level == GPU:
                ts, ent, rows = chunk.ts, chunk.gpu, None
                n_ent = self.entities.n_gpus
            else:
                n_ent = self.entities.n_hosts
                if lifecycles[check.meta.name].quiet(cond, n_ent):
                    continue  # no host to step: spares _per_host's grouping (~60 us a check)
                # Host level: true for the host when true on any of its GPUs in this tick.
                ts, ent, cond, rows = _per_host(chunk, cond)
            for t in lifecycles[check.meta.name].step(ts, ent, cond, n_ent):
                if rows is not None:
                    t = Transition(t.state, t.entity, t.ts, t.started_at, int(rows[t.row]))
                transitions.append((check, t))
        transitions.sort(key=lambda ct: (ct[1].ts, ct[0].meta.name, ct[1].entity))
        for check, t in transitions:
            ev = check.evidence(view, t.row)
            out.alerts.append(self._alert(check, t, ev))
        for stage in self.stages:
            stage.finish()

    def _note_returns(self, chunk: DcgmFrame) -> None:
        """Hosts reporting after more than ``gpu_absent_after`` of silence (scaled with a slow
        host's sampling step, as the absence checks do), or for the first time."""
        st = self.state
        st.ensure(self.entities.n_gpus, self.entities.n_hosts)
        last = st.host_last_ts[chunk.host]
        after = absent_after(self.config.gpu_absent_after, st, self.entities.n_hosts)[chunk.host]
        with np.errstate(invalid="ignore"):
            back = ~(chunk.ts - last <= after)
        if back.any():
            np.fmax.at(st.host_back, chunk.host[back], chunk.ts[back])

    def _tick(self, t: float, out: EngineOutput) -> None:
        self.state.ensure(self.entities.n_gpus, self.entities.n_hosts)
        for check in self.tick_checks:
            cond = check.evaluate_tick(t, self.state, self.entities, self.config)
            n = len(cond)
            ent = np.arange(n, dtype=np.int32)
            for tr in self.lifecycles[check.meta.name].step(np.full(n, t), ent, cond, n):
                if check.meta.level == GPU:
                    last = self.state.last_ts[tr.entity]
                else:
                    last = self.state.host_last_ts[tr.entity]
                out.alerts.append(self._alert(check, tr, {"last_seen": None if last != last else float(last)}))

    def _alert(self, check: StageCheck | TickCheck, t: Transition, evidence: dict[str, Any]) -> AlertEvent:
        meta = check.meta
        if meta.level == GPU:
            host, gpu = self.entities.gpus[t.entity]
            key = f"{host}/{gpu}"
        elif meta.level == HOST:
            host, gpu = self.entities.hosts[t.entity], None
            key = host
        else:  # pragma: no cover - levels are validated when checks are built
            raise ValueError(meta.level)
        self.stats[f"alerts.{t.state}.{meta.fault}"] += 1
        aid = alert_id(meta.name, key, t.started_at)
        if t.state == "firing":
            summary = self._summaries[aid] = check.summary(host, gpu, evidence)
        else:
            # A resolved event says what the alert was about, not the (healthy) values that ended it.
            summary = self._summaries.pop(aid, "") or check.summary(host, gpu, evidence)
        # The job (pod, namespace) from the telemetry; the rule's own labels win a clash.
        jl = self.entities.job_labels(t.entity) if meta.level == GPU else self.entities.host_job_labels(t.entity)
        job = jl.pop("job", None)
        return AlertEvent(
            id=aid,
            state=t.state,
            fault=meta.fault,
            severity=meta.severity,
            rule=meta.name,
            host=host,
            gpu=gpu,
            job=job,
            ts=t.ts,
            started_at=t.started_at,
            summary=summary,
            evidence=evidence,
            labels={**jl, **meta.labels},
        )

    # -- state ---------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """All engine state as bytes: msgpack of numbers, strings and numeric arrays (the stages'
        too: rule windows, docs/models.md#model-state), so restoring one never runs anything. A
        forged one could still feed the engine wrong history: the service signs its checkpoints
        (service/state.py). Layout: ``pipeline/engine/snapshot.py``."""
        return write_snapshot(self)

    def restore(self, blob: bytes) -> None:
        """Continue exactly where ``snapshot`` left off (same checks must be configured)."""
        read_snapshot(self, blob)

    @property
    def pending(self) -> int:
        return sum(len(c) for c in self._chunks)


STEP_RECOVERY = 1.01  # how fast a host's shortest step is forgotten, per step (Engine.host_min_step)
# Steps after which a shortest step has grown past any cap (1.01^7000 > 1e30): the exponent is
# capped there, so the powers stay finite however long a host's run in one batch.
_FORGOTTEN = 7000


def latest_steps(
    step: np.ndarray,
    ts: np.ndarray,
    hosts: np.ndarray,
    before: np.ndarray,
    cap: float,
    shortest: np.ndarray | None = None,
) -> None:
    """Each host's latest step forward in event time, record to record in its own order, into
    ``step`` (per host, in place); ``before``: each host's time before these records. Steps
    longer than ``cap`` count as ``cap``. ``shortest``: each host's shortest step, kept as a
    running minimum that grows by ``STEP_RECOVERY`` a step (see ``Engine.host_min_step``)."""
    if not len(ts):
        return
    h, gap = _host_gaps(ts, hosts, before)
    with np.errstate(invalid="ignore"):
        fwd = np.flatnonzero(gap > 0)
    if not len(fwd):
        return
    hf, g = h[fwd], np.minimum(gap[fwd], cap)
    starts, ends, count, after = _runs(hf)
    hs = hf[ends]
    step[hs] = g[ends]
    if shortest is not None:
        # m_k = min(g_k, m_(k-1) * r) over a host's steps of the batch, in closed form: the
        # minimum over its steps j of g_j * r^(steps after j), and of the old m * r^(its steps).
        grown = g * STEP_RECOVERY ** np.minimum(after, _FORGOTTEN)
        shortest[hs] = np.fmin(
            shortest[hs] * STEP_RECOVERY ** np.minimum(count, _FORGOTTEN), np.minimum.reduceat(grown, starts)
        )


def _host_gaps(ts: np.ndarray, hosts: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Records grouped by host (stable: each host's in its own order): their hosts, and each
    one's step from the record before it of its host (``before``: each host's time before
    these records; NaN where unknown, negative where a record went back in time)."""
    o = np.argsort(hosts, kind="stable")
    h, t = hosts[o], ts[o]
    prev = np.empty_like(t)
    prev[1:] = t[:-1]
    first = np.ones(len(h), bool)
    first[1:] = h[1:] != h[:-1]
    prev[first] = before[h[first]]
    return h, t - prev


def _runs(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For ids grouped into runs (``_host_gaps``): each run's first and last index, its length,
    and per element how many elements of its run come after it."""
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    ends = np.r_[starts[1:], len(h)] - 1
    count = ends - starts + 1
    return starts, ends, count, np.repeat(ends, count) - np.arange(len(h))


JITTER_FADE = 0.99  # how fast a host's largest deviation is forgotten, per step (Engine.host_jitter)
JITTER_TRUSTED_AFTER = 10  # steps measured before a host's own jitter replaces the 5 % margin
_JITTER_MAX_MULTIPLE = 3  # a longer step (a gap, a restart) says nothing of the sampler's jitter


def step_jitter(
    jitter: np.ndarray, count: np.ndarray, ts: np.ndarray, hosts: np.ndarray, before: np.ndarray, ref: np.ndarray
) -> None:
    """Each host's jitter into ``jitter`` and ``count`` (per host, in place): how far each of its
    steps forward in these records, in its own order, lies from the nearest whole multiple (one
    to three) of ``ref``, its shortest step before them (a missed sample is two steps, not
    jitter); a running maximum faded by ``JITTER_FADE`` a step. ``before``: each host's time
    before these records. Hosts without a shortest step yet are not measured."""
    if not len(ts):
        return
    h, gap = _host_gaps(ts, hosts, before)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = ref[h]
        k = np.rint(gap / m)
        use = np.flatnonzero((gap > 0) & (m > 0) & (k <= _JITTER_MAX_MULTIPLE))
    if not len(use):
        return
    hu, dev = h[use], np.abs(gap[use] - np.maximum(k[use], 1) * m[use])
    starts, ends, steps, after = _runs(hu)
    faded = dev * JITTER_FADE ** np.minimum(after, _FORGOTTEN)
    hs = hu[ends]
    jitter[hs] = np.fmax(jitter[hs] * JITTER_FADE ** np.minimum(steps, _FORGOTTEN), np.maximum.reduceat(faded, starts))
    count[hs] += steps


class _Numbered(Sequence[str]):
    """``batch#0``, ``batch#1``, ...: the origins of records handed over without any, spelled
    only when a dead letter reads one."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [f"{self.name}#{j}" for j in range(*i.indices(self.n))]
        return f"{self.name}#{i}"


def _per_host(chunk: DcgmFrame, cond: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Collapse per-GPU rows to one row per host: (ts, host id, any(cond), representative row)."""
    hosts, inv = np.unique(chunk.host, return_inverse=True)
    ts = np.full(len(hosts), -np.inf)
    np.maximum.at(ts, inv, chunk.ts)
    anyc = np.zeros(len(hosts), dtype=bool)
    np.logical_or.at(anyc, inv, cond)
    # Evidence from the first GPU where it holds, else the host's first row.
    rows = np.full(len(hosts), -1)
    idx = np.arange(len(chunk))
    pick = np.where(cond, idx, len(chunk) + idx)
    best = np.full(len(hosts), np.iinfo(np.int64).max)
    np.minimum.at(best, inv, pick)
    rows = np.where(best >= len(chunk), best - len(chunk), best)
    return ts, hosts.astype(np.int32), anyc, rows
