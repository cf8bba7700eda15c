"""The engine: a plain object fed batches of telemetry records in event time.

``Engine.process(records)`` returns the alert state changes and dead letters that batch caused.
The Kafka service, file replay, rule tests, the demo and the benchmarks all drive this same
object; they differ only in where records come from and where the output goes.

Records are screened on arrival (``screen.py``), turned into columns (``ingest.py``) and
buffered until the watermark passes them (``pending.py``; the watermark comes from each host's
clock, ``hostclock.py``, docs/architecture.md §4), then processed in event-time order, tick by
tick, skipping ticks with nothing due (``ticks.py``); a tick's rows go through the stages
(``stage.py``: the models, the built-in row checks, the rules, any of one's own) and their
conditions through each check's lifecycle into alerts (``alerts.py``). The snapshot's layout is
in ``snapshot.py``.
"""

from __future__ import annotations

import logging
import math
import operator
from collections import Counter
from typing import Any, Mapping, Sequence, cast

import numpy as np

from pipeline import rows
from pipeline.rows import Combined, DcgmColumns, take
from pipeline.deadletters import ENTITY_LIMIT, INTERNAL, Origins, take_origins
from pipeline.engine.arrays import from_dict, to_dict
from pipeline.engine.alerts import alert_event, stepped
from pipeline.engine.checks import GPU, RowCheck, TickCheck, absent_after, builtin_checks
from pipeline.engine.config import EngineConfig
from pipeline.engine.early import EarlyRows
from pipeline.engine.entities import Entities
from pipeline.engine.frame import Columnizer, DcgmFrame
from pipeline.engine.hostclock import HostClock, latest_steps
from pipeline.engine.ingest import Ingest
from pipeline.engine.lifecycle import Lifecycle, Transition
from pipeline.engine.output import EngineOutput, Numbered
from pipeline.engine import registry
from pipeline.engine.pending import Pending, in_time_order
from pipeline.engine.screen import (
    AHEAD,
    REASONS,
    in_row_order,
    refused,
    screen_done,
    screen_fleet,
    screen_late,
    stream_order,
)
from pipeline.engine.snapshot import decode_records, read_snapshot, write_snapshot
from pipeline.engine.stage import CheckStage, Deferring, Holding, NcclReader, NicReader, Stage, StageCheck
from pipeline.engine.state import GpuState, View, advance
from pipeline.engine.ticks import skip_ahead
from pipeline.engine.wrongresults import WrongResults
from pipeline.schema import AlertEvent, DeadLetter, TelemetryRecord

log = logging.getLogger("gpuwarden.engine")

__all__ = ["MOVED", "Engine", "EngineOutput"]

_TS, _HOST = operator.attrgetter("ts"), operator.attrgetter("host")
# The stats key of the DCGM samples moved to the next tick (HostClock.one_per_tick).
MOVED = "records.moved"


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
        forwards: bool = False,
        screened: bool = False,
    ) -> None:
        """Built-in checks run unless ``row_checks``/``tick_checks`` are given; with ``rules``,
        the YAML rules replace the built-in row checks (the absence checks stay). ``models``:
        online anomaly models (``pipeline.models``), evaluated each tick before the rules, which
        read their scores. ``stages``: more stages (``pipeline.engine.stage``), run after those
        in this order, each seeing what the earlier ones published.

        ``forwards``: every batch's accepted records (after screening: what this engine will
        process) are also in its output's ``forwarded``, for a later stage of the topology
        (``pipeline/topology.py``).
        ``screened``: the records come from such a stage, already screened, ordered and released
        by its watermark (``advance_to``): only lateness is checked, never the fleet's clock."""
        self.config = config or EngineConfig()
        self.forwards = forwards
        self.screened = screened
        default_rows, default_ticks = builtin_checks()
        if row_checks is None and tick_checks is None:
            row_checks, tick_checks = ([] if rules is not None else default_rows), default_ticks
            # The built-in check on NCCL records (wrong results) runs with the absence checks:
            # where records arrive by host, never in a later stage fed what this one forwards.
            stages = [*stages, WrongResults()]
        self.tick_checks = list(tick_checks or [])
        self.stages = registry.arrange(models, CheckStage(row_checks or []), rules, stages)
        names = registry.check_names(self.stages, self.tick_checks)
        self.entities = Entities()
        self.state = GpuState()
        self.clock = HostClock(self.config)  # each host's marks, steps and jitter: the watermark
        # Whether a host's rows of the tick after ``released`` run as soon as that host is
        # complete for it (_release_hosts): the service's host stage turns it on; replay leaves
        # it off, so that a replay's alerts come out in an order set by event time alone.
        self.release_hosts = False
        self.released = -math.inf  # every record with ts < released has been processed
        self.next_tick = math.nan
        self.lifecycles = {n: self._new_lifecycle(n) for n in names}
        self._columnizer = Columnizer(registry.columns(self.stages))
        # The columns a later stage reads that this engine's stages do not (``screen_for``), and
        # their screen.
        self._screen_cols: tuple[int, ...] = ()
        self._screen: Columnizer | None = None
        # Records waiting for the watermark: one chunk per batch, in arrival order. A release
        # takes whole chunks the watermark has passed and splits at most the chunks it cuts, so
        # its cost does not grow with what stays pending (the start-up hold can be 30 s of data).
        self._chunks: list[Pending] = []
        # Rows of the tick before ``next_tick`` that ran early (_release_hosts), while a stage's
        # ``deferred`` checks have yet to judge them (_close_early).
        self._early = EarlyRows()
        self.stats: Counter[str] = Counter()
        self._summaries: dict[str, str] = {}  # alert id -> summary, while firing

    # -- stages ------------------------------------------------------------------------------

    def stage(self, kind: str) -> Any:
        """The stage of ``kind`` ("checks", "models", "rules", ...), or None. Typed ``Any``: the
        engine knows stages by their protocol only, the caller that built it knows its class."""
        return registry.find(self.stages, kind)

    @property
    def rules(self) -> Any:
        """The rule set (``pipeline.rules.RuleSet``) this engine runs, or None."""
        return self.stage("rules")

    @property
    def models(self) -> Any:
        """The model set (``pipeline.models.ModelSet``) this engine runs, or None."""
        return self.stage("models")

    @property
    def decode_fields(self) -> tuple[str, ...]:
        """The DCGM field names (both spellings) this engine reads: what a decoder must keep."""
        return self._columnizer.names

    @property
    def columns(self) -> tuple[int, ...]:
        """The catalog columns this engine's stages read."""
        return self._columnizer.columns

    def screen_for(self, columns: tuple[int, ...]) -> None:
        """Also screen the values of ``columns`` on arrival: a later stage reads them (the fleet
        stage's models, fed what this engine forwards), and a bad value there is dead-lettered
        here, once and with its record's origin, where that stage would drop it unsaid.

        >>> from pipeline.catalog import FIELDS
        >>> from pipeline.schema import dcgm
        >>> eng = Engine(row_checks=[], tick_checks=[], forwards=True)
        >>> eng.screen_for((FIELDS.resolve("ecc_sbe_volatile").column,))
        >>> [d.origin for d in eng.process([dcgm(10.0, "n1", 0, {"ecc_sbe_volatile": -1})], ["m@0"]).dead]
        ['m@0']
        """
        self._screen_cols = tuple(columns)
        self._rescreen()

    def _rescreen(self) -> None:
        extra = set(self._screen_cols) - set(self._columnizer.columns)
        self._screen = Columnizer(sorted(extra)) if extra else None

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
        old = registry.find(self.stages, stage.kind)
        stages = registry.place(self.stages, stage)
        registry.check_names(stages, self.tick_checks)
        kept = stage.adopt(old) if old is not None else set()
        self.stages = stages
        for c in stage.checks:
            if c.meta.name not in kept:
                self.lifecycles[c.meta.name] = self._new_lifecycle(c.meta.name)
        self._columnizer = Columnizer(registry.columns(self.stages))
        self._rescreen()
        live = {c.meta.name for c in self._all_checks()}
        for name in list(self.lifecycles):
            if name not in live:
                del self.lifecycles[name]

    @property
    def host_hwm(self) -> np.ndarray:
        """Each host's newest event time accepted (``HostClock.hwm``; room past ``n_hosts``)."""
        return self.clock.hwm

    @property
    def host_min_step(self) -> np.ndarray:
        """Each host's shortest sampling step, slowly forgotten (``HostClock.min_step``)."""
        return self.clock.min_step

    @property
    def host_jitter(self) -> np.ndarray:
        """Each host's largest step deviation, fading (``HostClock.jitter``)."""
        return self.clock.jitter

    @property
    def host_done(self) -> np.ndarray:
        """How far each host's rows went early, ahead of ``released`` (``HostClock.done``)."""
        return self.clock.done

    # -- feeding ---------------------------------------------------------------------------

    def process(
        self, records: Sequence[TelemetryRecord], origins: Sequence[str] | None = None, now: float | None = None
    ) -> EngineOutput:
        """Take a batch (any order within the allowed lateness); return what it made happen.

        ``now``: the wall clock (monotonic seconds) of a live consumer; see ``idle_timeout``.
        Replay passes none, so its results depend on event time alone.

        ``records`` may be a ``colwire.DcgmColumns`` (the decoder's columnar messages): its
        arrays are read as they are, and a row is a record only where one is asked for.
        """
        out = EngineOutput()
        n = len(records)
        clock = self.clock
        if n:
            if origins is None:
                # Each record its own message: a caller that hands the engine records has said
                # nothing about per-host messages, so no host counts as whole (HostClock.note_whole).
                origins = Origins(Numbered("batch", n), np.arange(n), np.full(n, -1))
            # map() over C-level attribute getters: this runs once per record on the hot path.
            if isinstance(records, (DcgmColumns, Combined)):
                ts, names = records.ts, records.hosts
            else:
                ts, names = np.fromiter(map(_TS, records), np.float64, n), list(map(_HOST, records))
            # New hosts, screening and the host marks take the records in stream order, which a
            # batch of both encodings keeps only in its origins (the decoder puts its columns first).
            seq = stream_order(records, origins)
            hosts = self.entities.host_ids(names, limit=self.config.max_hosts, order=seq)
            if (hosts < 0).any():
                records, origins, ts, hosts = self._refuse_new_hosts(records, origins, ts, hosts, out)
                seq = stream_order(records, origins)
            nh = self.entities.n_hosts
            clock.grow(nh)
            # The host marks take the times as sent: its sampler's steps, which the release's
            # promise is about (HostClock.whole_bound); the rest the times as moved.
            raw, dcgm = ts, rows.dcgm_rows(records)
            if not self.screened:  # (a screened engine's records were moved by its first stage)
                ts, records = self._one_per_tick(records, ts, hosts, seq, dcgm)
            s_ts, s_hosts = (ts, hosts) if seq is None else (ts[seq], hosts[seq])
            s_raw = s_ts if raw is ts else raw if seq is None else raw[seq]
            # Live, a consumer may drain a backlog partition by partition, hours apart in event
            # time: there the decoder bounds time against the wall clock and aliveness is by
            # arrival, so one host ahead cannot carry the watermark; only replay screens here.
            if now is None and not self.screened:
                verdict = in_row_order(screen_fleet(clock, nh, s_ts, s_hosts, self.released), seq)
            else:
                verdict = screen_late(ts, self.released)
            if self.release_hosts:
                verdict = screen_done(clock, ts, hosts, records, verdict, self.released)
            heard_ts, heard_hosts = s_raw, s_hosts
            if verdict is not None:
                why, ref = verdict
                bad = why != 0
                for i in np.flatnonzero(bad).tolist():
                    out.dead.append(self._refused(int(why[i]), records[i], origins[i], float(ref[i])))
                for code, reason in REASONS.items():
                    if c := int((why == code).sum()):
                        self.stats["dead." + reason] += c
                keep = np.flatnonzero(~bad)
                records = take(records, keep)
                origins = take_origins(origins, keep)
                # A late record still says its host is there: a host first seen late (it joined
                # behind the others) holds the watermark from now on instead of losing every
                # record to lateness. Records refused as ahead say nothing of the kind.
                heard = why != AHEAD if seq is None else why[seq] != AHEAD
                heard_ts, heard_hosts = s_raw[heard], s_hosts[heard]
                ts, hosts, raw, dcgm = ts[keep], hosts[keep], raw[keep], dcgm[keep]
            if len(heard_ts):
                clock.hear(heard_ts, heard_hosts, nh)
            if now is not None:
                clock.arrived(now, hosts)
            clock.note_whole(origins, hosts, raw, dcgm)
            clock.accepted(ts)
            if len(ts):
                records = self._ingest(out).batch(records, origins, ts, hosts, self._chunks)
                if self.forwards:
                    out.forwarded.add(records)
        if not self.screened:
            wm, complete = self._watermark(now)
            self._release(self._release_bound(wm), out, final=False)
            if self.release_hosts and complete is not None and self.host_local:
                self._release_hosts(complete, out)
        return out

    def _one_per_tick(
        self,
        records: Sequence[TelemetryRecord],
        ts: np.ndarray,
        hosts: np.ndarray,
        seq: np.ndarray | None,
        dcgm: np.ndarray,
    ) -> tuple[np.ndarray, Sequence[TelemetryRecord]]:
        """The batch with each host's DCGM samples one to a tick (``HostClock.one_per_tick``,
        judged in stream order): its times and records, the moved ones at their new times.
        ``dcgm``: which rows are DCGM samples."""
        if seq is None:
            new, moved = self.clock.one_per_tick(ts, hosts, dcgm)
        else:
            s_new, s_moved = self.clock.one_per_tick(ts[seq], hosts[seq], dcgm[seq])
            new, moved = np.empty_like(ts), np.empty_like(s_moved)
            new[seq], moved[seq] = s_new, s_moved
        if not moved.any():
            return ts, records
        idx = np.flatnonzero(moved)
        self.stats[MOVED] += len(idx)
        return new, rows.with_times(records, idx, new[idx])

    def advance_to(self, upto: float) -> EngineOutput:
        """Process everything before ``upto`` (whole ticks): the watermark of an engine fed by an
        earlier stage, which alone knows when every record of a second has come."""
        out = EngineOutput()
        if upto > self.released:
            self._release(self._release_bound(upto), out, final=False)
        return out

    def _ingest(self, out: EngineOutput) -> Ingest:
        """The ingest of a batch (``ingest.py``), with the parts as they are now and ``out``
        for its dead letters."""
        return Ingest(self.entities, self.stages, self._columnizer, self.stats, out, self._screen)

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
        return take(records, keep), take_origins(origins, keep), ts[keep], hosts[keep]

    def _refused(self, code: int, r: TelemetryRecord, origin: str, judged: float) -> DeadLetter:
        return refused(code, r, origin, judged, self.clock, self.entities.host_id.get(r.host), self.released)

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
        """The watermark, and how far each host is complete (``HostClock.watermark``)."""
        # ``pending`` only bears on the live start-up hold: not summed for replay.
        pending = self.pending if now is not None else 0
        return self.clock.watermark(self.entities.n_hosts, self.released, now, pending)

    # -- processing in event time ---------------------------------------------------------------

    def _release(self, wm: float, out: EngineOutput, final: bool) -> None:
        first = len(out.alerts)
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
            upto = self.clock.newest(self.entities.n_hosts)
            self._ticks_until(upto, out)
            self._close_early(out)  # the last tick's rows have all run: it is whole
            self.released = max(self.released, upto)
        else:
            self._ticks_until(wm, out)
            self.released = max(self.released, wm)
        for stage in self.stages:
            try:
                stage.advanced(self.released, self.entities)
            except Exception as e:  # noqa: BLE001 - as in _rows: the ticks ran, their alerts stand
                out.dead.append(self._raised_after(stage.kind, e))
        self._release_held(math.inf if final else wm, out)
        # The held records' alerts among the ticks', in event time (a stable sort: each part is
        # already in order): otherwise a release that spans an hour puts a NIC port's or a
        # burn-in's alert after every tick's, and the order, which the incident stage reads,
        # would depend on how the stream was cut into batches.
        if len(out.alerts) > first + 1:
            out.alerts[first:] = sorted(out.alerts[first:], key=_TS)

    def _release_held(self, upto: float, out: EngineOutput) -> None:
        """The alerts of the records stages hold until the watermark, older than ``upto``: NIC
        port records (``NicReader.nic_release``) and NCCL records (``NcclReader.nccl_release``)."""
        for stage in self.stages:
            alerts: list[Any] = []
            if getattr(stage, "reads_nic", False):
                alerts += cast(NicReader, stage).nic_release(upto)
            if getattr(stage, "reads_nccl_records", False):
                alerts += cast(NcclReader, stage).nccl_release(upto)
            for a in alerts:
                self.stats[f"alerts.{a.state}.{a.fault}"] += 1
                out.alerts.append(a)

    def _release_bound(self, wm: float) -> float:
        # Whole ticks only: a tick's samples are always processed together, so windows and
        # peer comparisons never depend on where a batch happened to end.
        if math.isinf(wm):
            return wm
        # (1e-6 of a tick: a bound of n ticks computed as n * tick may fall just short of it.)
        return math.floor(wm / self.config.tick + 1e-6) * self.config.tick

    @property
    def host_local(self) -> bool:
        """Whether every stage judges a GPU by its own host's rows alone (``Stage.host_local``),
        but for ``deferred`` checks, judged once the tick is whole, whose scores no stage reads:
        then a host's rows of a tick need not wait for the other hosts' (``_release_hosts``)."""
        stages = self.stages
        if not all(getattr(s, "host_local", False) for s in stages):
            return False
        late = frozenset().union(*(getattr(s, "deferred", ()) for s in stages))
        return not late or not any(late & getattr(s, "reads_scores", frozenset()) for s in stages)

    def hosts_ahead(self) -> dict[str, float]:
        """Each host whose rows went early (``release_hosts``), with how far: what a later stage
        fed by this one may run of that host before the whole tick (``release_early``).

        >>> Engine().hosts_ahead()
        {}
        """
        done = self.clock.done[: self.entities.n_hosts]
        ahead = np.flatnonzero(done > self.released)
        return {self.entities.hosts[i]: float(done[i]) for i in ahead.tolist()}

    def release_early(self, hosts: Mapping[str, float]) -> EngineOutput:
        """For an engine fed by an earlier stage (``screened``): run the rows of the tick after
        ``released`` of each host that stage released so far on its own (``hosts``: name → how
        far, its ``hosts_ahead``), as ``_release_hosts`` does with the hosts complete by this
        engine's own clock. Nothing when a stage is not host-local, or for a host not seen.

        >>> Engine(screened=True).release_early({"node-1": 10.0}).alerts
        []
        """
        out = EngineOutput()
        if not hosts or not self.host_local:
            return out
        n = self.entities.n_hosts
        complete = np.full(n, -math.inf)
        for name, upto in hosts.items():
            hid = self.entities.host_id.get(name)
            if hid is not None and hid < n:
                complete[hid] = upto
        self._release_hosts(complete, out)
        return out

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
        ready = (complete >= end) & (self.clock.done[:n] < end)
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
        self.clock.done[:n][ready] = end
        if go:
            self.stats["early_releases"] += 1
            self._process_released(Pending.concat(go, self._columnizer.columns), out, early=True)

    def _close_early(self, out: EngineOutput) -> None:
        """The tick of the rows that ran early is whole (every host's rows of it have run, or
        the engine is past it): the stages' ``deferred`` checks judge those rows now, after the
        rest of the tick's rows and before its boundary, as they would have with them."""
        # Their tick is the one before ``next_tick``: the grid moves only after this.
        view = self._early.take(self.entities, self.next_tick - self.config.tick)
        if view is None:
            return
        late = [cast(Deferring, s) for s in self.stages if getattr(s, "deferred", None)]
        conds: list[tuple[StageCheck, np.ndarray]] = []
        try:
            for judge in late:
                conds += judge.run_deferred(view, self.entities)
        except Exception as e:  # noqa: BLE001 - as in _rows: a stage's bug costs these rows only
            self._failed_rows(view.frame, e, out)
            return
        self.stats["rows.deferred"] += len(view.frame)
        self._step(conds, view.frame, view, out)
        for stage in self.stages:
            stage.finish()

    def _process_released(self, go: Pending, out: EngineOutput, early: bool = False) -> None:
        """Released rows (arrival order), sorted into event time and run tick by tick; ``early``:
        some hosts' rows of the next tick, before the others' (``_release_hosts``)."""
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
                self._rows(frame.take(slice(start, cut)), out, self.next_tick - self.config.tick, early)
                start = cut
            if start < n:
                self._close_early(out)  # rows past the tick: it is whole
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

    def _ticks_until(self, upto: float, out: EngineOutput) -> None:
        while not math.isnan(self.next_tick) and self.next_tick <= upto:
            self._close_early(out)  # before the grid moves past the tick of rows that ran early
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
        """Jump the tick grid over the ticks up to ``limit`` at which nothing can be due
        (``ticks.skip_ahead``)."""
        self.next_tick = skip_ahead(
            self.next_tick,
            limit,
            self.config,
            self.tick_checks,
            self.lifecycles,
            self.state,
            self.entities,
            self.clock.step,
        )

    def _rows(self, frame: DcgmFrame, out: EngineOutput, ts0: float, early: bool = False) -> None:
        gpu = frame.gpu
        chunk = frame if (gpu[1:] >= gpu[:-1]).all() else frame.take(np.argsort(gpu, kind="stable"))
        self._note_returns(chunk)
        # After _note_returns, which judges a return by the step before it; before advance moves
        # host_last_ts. Taken here, on release and in event time, not on arrival: whether a host
        # back from a silence still counted as silent at a tick must not depend on whether its
        # next sample had arrived yet (tests/unit/engine/test_engine_properties.py).
        latest_steps(self.state.host_step, frame.ts, frame.host, self.state.host_last_ts, self.config.max_lag)
        view = advance(self.state, chunk, self.entities, ts0, self._columnizer.column_array)
        view.early = early
        outputs: dict[str, Any] = {}  # what each stage publishes for the later ones
        conds: list[tuple[StageCheck, np.ndarray]] = []
        try:
            for stage in self.stages:
                conds += stage.run(view, self.entities, outputs)
        except Exception as e:  # noqa: BLE001 - a stage's bug costs this tick's rows, not the stream
            self._failed_rows(chunk, e, out)
            return
        if early and any(getattr(s, "deferred", None) for s in self.stages):
            self._early.add(chunk)
        self._step(conds, chunk, view, out)
        for stage in self.stages:
            stage.finish()

    def _step(
        self, conds: list[tuple[StageCheck, np.ndarray]], chunk: DcgmFrame, view: View, out: EngineOutput
    ) -> None:
        """The checks' conditions on ``chunk``'s rows through their alert lifecycles, and the
        alerts of what changed, in (time, check, entity) order."""
        for check, t in stepped(conds, chunk, self.lifecycles, self.entities):
            ev = check.evidence(view, t.row)
            out.alerts.append(self._alert(check, t, ev))

    def _failed_rows(self, chunk: DcgmFrame, e: Exception, out: EngineOutput) -> None:
        """A stage raised on ``chunk``: its rows are not evaluated, one ``internal`` dead letter per
        host says so, and the engine goes on with the next rows. Left in place, the rows would
        raise again at every later call, and a driver that fed the batch again to isolate the
        record would feed every other record twice (``Pipeline.handle_guarded``)."""
        log.exception("a stage raised on %d rows at %.3f; they are dead-lettered as internal", len(chunk), chunk.ts[0])
        self.stats["dead." + INTERNAL] += len(chunk)
        hosts, first, counts = np.unique(chunk.host, return_index=True, return_counts=True)
        detail = f"{type(e).__name__}: {e}"[:240]
        for h, i, n in zip(hosts.tolist(), first.tolist(), counts.tolist()):
            name = self.entities.hosts[h]
            out.dead.append(
                DeadLetter(
                    reason=INTERNAL,
                    detail=f"{n} sample(s) not evaluated, a stage raised: {detail}",
                    origin=f"{name}@{float(chunk.ts[i]):.3f}",
                )
            )
        for stage in self.stages:
            stage.finish()

    def _raised_after(self, kind: str, e: Exception) -> DeadLetter:
        """Stage ``kind`` raised after a release (``Stage.advanced``): logged, and one ``internal``
        dead letter; the ticks before it ran and their alerts stand."""
        log.exception("stage %s raised after the release to %.3f", kind, self.released)
        self.stats["dead." + INTERNAL] += 1
        detail = f"stage {kind} raised after the release: {type(e).__name__}: {e}"[:300]
        return DeadLetter(reason=INTERNAL, detail=detail, origin=f"{kind}@{self.released}")

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
        self.stats[f"alerts.{t.state}.{check.meta.fault}"] += 1
        return alert_event(check, t, evidence, self.entities, self._summaries)

    # -- state ---------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """All engine state as bytes: msgpack of numbers, strings and numeric arrays (the stages'
        too: rule windows, docs/models.md#model-state), so restoring one never runs anything. A
        forged one could still feed the engine wrong history: the service signs its checkpoints
        (service/state.py). Layout: ``pipeline/engine/snapshot.py``."""
        return write_snapshot([self._own_state(), self.state.to_state(), self.clock.to_state()], self.stages)

    def restore(self, blob: bytes) -> None:
        """Continue exactly where ``snapshot`` left off (same checks must be configured)."""
        loads = [self._load_own, self.clock.load_state, lambda d: self.state.load_state(d, self.clock.step)]
        read_snapshot(blob, loads, self.stages)

    def _own_state(self) -> dict[str, Any]:
        """The engine's own part of a snapshot: entities, where processing is, the lifecycles,
        the buffered rows, the counters and the firing alerts' summaries; while rows that ran
        early wait for their ``deferred`` checks, those rows (``early``: a key only then, so a
        replay's snapshots keep their bytes)."""
        own = {
            "config": self.config.to_dict(),
            "entities": self.entities.to_state(),
            "released": self.released,
            "next_tick": self.next_tick,
            "lifecycles": {n: {k: to_dict(v) for k, v in lc.to_state().items()} for n, lc in self.lifecycles.items()},
            "pending_columns": [c.to_state() for c in self._chunks],
            "stats": dict(self.stats),
            "summaries": self._summaries,
        }
        if self._early:
            own["early"] = self._early.to_state()
        return own

    def _load_own(self, data: dict[str, Any]) -> None:
        self.entities = Entities.from_state(data["entities"])
        self.released, self.next_tick = data["released"], data["next_tick"]
        for name, lc in data["lifecycles"].items():
            if name in self.lifecycles:
                self.lifecycles[name].load_state({k: from_dict(v) for k, v in lc.items()})
        if "pending_columns" in data:
            self._chunks = [Pending.from_state(c) for c in data["pending_columns"]]
        else:  # a version-1 snapshot: buffered records as JSON; ingest them as on arrival
            # Their dropped-field dead letters were not written yet (they are counted in stats).
            records = decode_records(data["pending"])
            self._chunks = self._ingest(EngineOutput()).buffered(records, list(data["pending_origin"]))
        self._early = EarlyRows.from_state(data.get("early", []), self.entities)
        self.stats = Counter(data["stats"])
        self._summaries = dict(data["summaries"])

    @property
    def pending(self) -> int:
        return sum(len(c) for c in self._chunks)

    @property
    def awaiting_deferred(self) -> int:
        """How many rows that ran early wait for the stages' ``deferred`` checks (their tick is
        not whole yet).

        >>> Engine().awaiting_deferred
        0
        """
        return len(self._early)

    @property
    def held_dropped(self) -> dict[str, int]:
        """How many records each stage that holds them until the watermark (``Holding``) let go
        past its bound, by the stage's kind: counts since the stage was built or restored, which
        a driver reads once a batch (the service's ``gpuwarden_held_dropped_records``).

        >>> Engine().held_dropped
        {'nccl_results': 0}
        """
        return {
            s.kind: cast(Holding, s).dropped
            for s in self.stages
            if (getattr(s, "reads_nic", False) or getattr(s, "reads_nccl_records", False)) and hasattr(s, "dropped")
        }
