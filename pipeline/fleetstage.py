"""The fleet stage: detection across hosts, fed what the host stage released (docs/architecture.md §8).

The fleet stage runs the online models (cohort detectors, NCCL communicators spanning hosts,
fleet-wide causes, the deciders' quantiles), the hang detector and the incidents over what every
host-stage task accepted. Its answer must not depend on how the host stage was partitioned, so
it is built on two rules:

- **Its watermark comes from upstream.** Every host-stage task reports how far it has released
  (``mark``: every record it will ever forward older than that has been forwarded; ``final``
  after an idle flush, when it holds nothing back). The fleet stage releases a second only once
  every upstream task has passed it; after a lull (every task final at once) it waits for
  those that were forwarding to resume, whichever resumes first (``FleetStage.resuming``).
- **Its input order is canonical.** Released records are sorted by (ts, host, kind, GPU, link,
  communicator, rank) before its engine sees them, so GPU ids, tick rows and every model's
  learning order are the same whichever task forwarded what first. A record forwarded twice
  (an upstream task replaying after a crash) is dropped.

Dead letters come from the fleet stage only for what it alone can cause: a host past its
engine's ``max_hosts``, rows a model raised on (the host stage screened every other value).
``pipeline.topology.Topology`` runs it in one process behind a host stage; the service runs it
per fleet-topic partition (``pipeline.service.fleet``); ``pipeline.shardstage`` splits its
models by key.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

import msgspec
import numpy as np

from pipeline import rows
from pipeline.canonical import SortColumns, canonical_order
from pipeline.deadletters import ENTITY_LIMIT, INTERNAL
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import StateError
from pipeline.hang import HangDetector
from pipeline.rows import Combined, DcgmColumns
from pipeline.schema import DeadLetter, NcclRecord, ProgressRecord, TelemetryRecord, dcgm_record_type

log = logging.getLogger("gpuwarden.topology")
FLEET_KEY = "fleet"  # the fleet stage's one key: every model compares over the whole fleet
STATE_VERSION = 1
# Dead letters only a fleet stage's engine writes (``FleetStage._collect``).
_FLEET_OWN = frozenset({ENTITY_LIMIT, INTERNAL})
# After a lull, how long (event time) the fleet stage waits for a task that forwarded records
# before it: many times the sampling step (at most 30 s), and the skew between telemetry
# partitions while the host stage catches up on the backlog of an outage of minutes.
RESUME_WAIT_S = 600.0


class FleetStage:
    """The cross-host stage of one partition of the fleet topic (or of everything, in process).

    ``feed`` takes forwarded records, ``mark`` an upstream task's progress, ``advance`` releases
    what every upstream task has passed, through one engine per key.
    """

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        upstream: int = 1,
        max_buffer: int = 2_000_000,
        hang: HangDetector | None = None,
        resume_wait: float = RESUME_WAIT_S,
    ) -> None:
        """``max_buffer``: the most records held for an upstream task that does not mark (down,
        or cut off): past it, the stage follows the most advanced task instead, and what the
        others send later for seconds already released is dropped (``stats["forced"]``).
        ``hang``: the hung-collective detector, fed the progress records released (pipeline/hang.py).
        ``resume_wait``: after a lull, how far (event time) the stage waits for a task that
        forwarded records before it to resume (``resuming``)."""
        self.make_engine = make_engine
        self.hang = hang
        self.n_upstream = upstream
        self.max_buffer = max_buffer
        self.resume_wait = resume_wait
        self.engines: dict[str, Engine] = {}
        self.marks: dict[int, float] = {}
        self.final: set[int] = set()
        # A lull is every upstream task final at once (the whole input paused): the stage then
        # releases everything it holds. The tasks that forwarded records shortly before it may
        # send more, of any event time past their marks, whichever resumes first: each is waited
        # for at its mark, not passed as an idle task is, until it marks past it (or another
        # runs ``resume_wait`` seconds past the lull). Each task's mark at the lull, and the lull.
        self.resuming: dict[int, float] = {}
        self.lull = -math.inf
        # The newest event time each upstream task has forwarded (fed with ``upstream``): how far
        # its marks may go (pipeline/service/fleet.py, FleetTask.lead).
        self.forwarded: dict[int, float] = {}
        # How far each host's rows went early upstream (its task's ``Engine.hosts_ahead``, sent
        # with its marks): the hosts whose rows of the next tick may run before the whole tick.
        self.hosts_ahead: dict[str, float] = {}
        self.released = -math.inf  # every record older than this went to an engine
        # The watermark of the last ``advance`` (inf once every upstream task was final): how far
        # what runs after the stage may release (the incident stage's AlertFeed).
        self.last_watermark = -math.inf
        # Fed records waiting for the watermark, one chunk per feed: a release takes whole chunks
        # it has passed and splits only those it cuts, so its cost does not grow with what
        # stays buffered (as the engine's pending rows, pipeline/engine/pending.py).
        self._chunks: list[_Chunk] = []
        self._went: list[_Chunk] = []  # the chunks an advance releases, for its dead letters' origins
        self._n_buf = 0
        self._newest = -math.inf  # the newest record released (taken) so far
        # Where the input stands (the next offset of the fleet topic partition, set by its
        # reader), and up to where a restored stage's input is a replay of what it saw before.
        self.position: int | None = None
        self.replay_until = -1
        self.stats: dict[str, int] = {
            "fed": 0, "duplicate": 0, "late": 0, "replayed": 0, "forced": 0, "released": 0, "dead_again": 0,
            "unresumed": 0, "early": 0,
        }  # fmt: skip

    def engine(self, key: str = FLEET_KEY) -> Engine:
        eng = self.engines.get(key)
        if eng is None:
            eng = self.engines[key] = self.make_engine()
        return eng

    # -- input -------------------------------------------------------------------------------

    def feed(
        self,
        records: Iterable[TelemetryRecord],
        keys: Sequence[str] | None = None,
        at: int | None = None,
        upstream: int | None = None,
        ts: np.ndarray | None = None,
        cols: SortColumns | None = None,
        origin: str | None = None,
        pos: np.ndarray | None = None,
    ) -> None:
        """Forwarded records (any order), each with its key (default: the one fleet key);
        ``at``: the position in the input they came from (an offset), for ``snapshot(replayable=True)``;
        ``upstream``: the task that forwarded them (``forwarded``); ``ts`` and ``cols``: their
        event times and sort columns, when the caller has them already; ``origin``: the message
        they came in, ``pos`` each one's place in it (default: in order), which a record the
        stage's engines refuse is dead-lettered with (``<origin>#<pos>``).

        A record sent again after its second was released (an upstream replay: a task never
        forwards what it released before) is dropped here, as ``late``; one sent again while
        still buffered is dropped at its release, as ``duplicate`` (``_take``). Records a
        restored stage reads again from before its snapshot's position were either released
        before (dropped, as ``replayed``) or buffered then (fed again).
        """
        recs = records if isinstance(records, (list, DcgmColumns, Combined)) else list(records)
        if not len(recs):
            return
        c = _Chunk(recs, None if keys is None else list(keys), ts, cols)
        c.src = upstream
        if origin is not None:
            c.origin, c.pos = origin, np.arange(len(recs)) if pos is None else pos
        if upstream is not None:
            self.forwarded[upstream] = max(self.forwarded.get(upstream, -math.inf), c.tmax)
        late = c.ts < self.released
        if c.keys is None:
            late |= self._went_early(c)
        if late.any():
            self.stats["replayed" if at is not None and at < self.replay_until else "late"] += int(late.sum())
            if late.all():
                return
            c = c.take(~late)
        c.at = at
        self._chunks.append(c)
        self._n_buf += len(c.records)
        self.stats["fed"] += len(c.records)

    def mark(
        self,
        upstream: int,
        upto: float,
        final: bool = False,
        n_upstream: int | None = None,
        *,
        hosts: Mapping[str, float] | None = None,
    ) -> None:
        """Upstream task ``upstream`` has forwarded every record older than ``upto``; ``final``:
        it holds nothing back (flushed while idle) until it next marks without it. ``hosts``:
        its hosts whose rows it ran ahead of ``upto`` on their own, and how far (each has
        forwarded every DCGM sample older than that)."""
        if hosts:
            ahead = self.hosts_ahead
            for h, t in hosts.items():
                if t > ahead.get(h, -math.inf):
                    ahead[h] = t
        if n_upstream is not None:
            self.n_upstream = max(self.n_upstream, n_upstream)
        self.marks[upstream] = max(self.marks.get(upstream, -math.inf), upto)
        if final:
            self.final.add(upstream)
        else:
            self.final.discard(upstream)
        at = self.resuming.get(upstream)
        if at is not None and (not final or self.marks[upstream] > at):
            del self.resuming[upstream]  # it resumed: an active (or idle) task again
        if self.resuming and self.marks[upstream] > self.lull + self.resume_wait:
            # Those not back by now may never be (their hosts gone): pass them as idle tasks.
            self.stats["unresumed"] += len(self.resuming)
            self.resuming.clear()

    def idle(self) -> bool:
        """Every upstream task final and none awaited (``resuming``): a lull, or the end of the
        stream. Its ``advance`` releases everything, so a reader advances where it comes in the
        input (``FleetTask``), not where the input's batch happens to end."""
        return len(self.marks) >= self.n_upstream and self.final.issuperset(self.marks) and not self.resuming

    def watermark(self) -> float:
        """How far every upstream task has come (-inf until each has said so): an idle task
        (final) holds nothing back, unless it is one the stage waits for after a lull."""
        wm = -math.inf
        if len(self.marks) >= self.n_upstream:
            wm = min(math.inf if p in self.final and p not in self.resuming else m for p, m in self.marks.items())
        if self._n_buf > self.max_buffer:
            ahead = max((m for p, m in self.marks.items() if p not in self.final), default=math.inf)
            if ahead > wm:
                self.stats["forced"] += 1
                wm = ahead
        return wm

    # -- release -----------------------------------------------------------------------------

    def advance(self) -> EngineOutput:
        """Release what every upstream task has passed; all of it when all are final."""
        try:
            return self._advance()
        finally:
            self._went = []  # the release's dead letters have their origins by now

    def _advance(self) -> EngineOutput:
        wm = self.last_watermark = self.watermark()
        out = EngineOutput()
        if wm == -math.inf:
            return out
        if wm == math.inf:
            self._release(self._take(math.inf), out)
            self._flush_engines(out)
            if self.hang is not None:
                out.alerts.extend(self.hang.advance(math.inf))
            self.released = max([self.released, *(eng.released for eng in self.engines.values())])
            self._all_fed()
            self._lulled()
            return out
        if wm > self.released:
            self._release(self._take(wm), out)
            self._advance_engines(wm, out)
            if self.hang is not None:
                # Every record before wm went to the detector: what settled by then fires.
                out.alerts.extend(self.hang.advance(wm))
            self.released = wm
        self._release_early(out)
        return out

    def _release_early(self, out: EngineOutput) -> None:
        """The DCGM rows of the tick after the engine's ``released`` of every host complete for
        it, before the tick is: a host its task ran ahead (``hosts_ahead``), or any host of a
        task that has marked past the tick. With host-local stages (``Engine.host_local``: the
        DCGM models; the NCCL ones judge these rows once the tick is whole) they score and
        alert alike run before the other hosts' rows or with them (``Engine.release_early``);
        the tick's boundary and the rest wait for the marks. With hosts at their own phases of
        the second, a host's alert through the models then waits for its own sample, not for
        the latest host's (up to a second)."""
        if self.hosts_ahead:
            # Only a host ahead of what the marks released can go early: the rest are forgotten.
            self.hosts_ahead = {h: t for h, t in self.hosts_ahead.items() if t > self.released}
        eng = self._rows_engine()
        if eng is None or not math.isfinite(eng.released) or not eng.host_local:
            return
        tick = eng.config.tick
        end = eng.released + tick
        if abs(eng.next_tick - end) > 1e-6 * tick or not self._may_run(end):
            return
        past = {p for p, m in self.marks.items() if m >= end}
        ahead = {h for h, t in self.hosts_ahead.items() if t >= end}
        if not past and not ahead:
            return
        go: list[_Chunk] = []
        stay: list[_Chunk] = []
        for c in self._chunks:
            if c.tmin >= end or c.keys is not None:
                stay.append(c)
                continue
            cols = c.sort_columns()
            if c.src in past:
                ready = np.ones(len(cols.hosts), bool)
            else:
                ready = np.fromiter(map(ahead.__contains__, cols.hosts), bool, len(cols.hosts))
            sel = (c.ts < end) & (cols.kind == 0) & ready[cols.host] if len(cols.hosts) else None
            if sel is None or not sel.any():
                stay.append(c)
                continue
            go.append(c.take(sel))
            if not sel.all():
                stay.append(c.take(~sel))
        if not go:
            return
        batch = self._take_chunks(go, stay)
        if not batch:
            return
        recs = batch[FLEET_KEY]
        hosts = dict.fromkeys(rows.hosts(recs), end)
        self.stats["early"] += len(recs)
        self._release(batch, out)
        self._collect(lambda: eng.release_early(hosts), out)

    def _rows_engine(self) -> Engine | None:
        """The engine that runs the DCGM rows (None: not made yet)."""
        return self.engines.get(FLEET_KEY)

    def _may_run(self, end: float) -> bool:
        """Whether the engine may run rows of the tick before ``end`` now, what the marks aside."""
        return True

    def _went_early(self, c: "_Chunk") -> np.ndarray:
        """Which of a fed chunk's records are DCGM samples of a tick whose rows of their host
        already ran early (``_release_early``): sent again (an upstream replay), dropped as late."""
        eng = self._rows_engine()
        no = np.zeros(len(c.ts), bool)
        if eng is None or not len(c.ts) or c.tmin >= eng.next_tick:
            return no
        done = eng.host_done[: eng.entities.n_hosts]
        if not (done > eng.released).any():
            return no
        cols = c.sort_columns()
        ids = eng.entities.host_id
        bound = np.array([done[ids[h]] if h in ids else -math.inf for h in cols.hosts], np.float64)
        return (cols.kind == 0) & (c.ts < bound[cols.host]) if len(cols.hosts) else no

    def _all_fed(self) -> None:
        """Everything fed went to the engines: a record sent again later (an upstream replay) is
        late even within the last second, which an engine's released (a tick's start) does not
        cover; it would reach the models twice."""
        if self._newest > -math.inf:
            self.released = max(self.released, math.nextafter(self._newest, math.inf))

    def _lulled(self) -> None:
        """Every upstream task was final and everything went to the engines: wait for those that
        forwarded records within ``resume_wait`` seconds of the newest before the lull, each at
        its mark (``resuming``; none at the end of the stream, where every mark is inf)."""
        newest = max(self.forwarded.values(), default=-math.inf)
        self.lull = max([self.released, newest, *(m for m in self.marks.values() if math.isfinite(m))])
        self.resuming = {
            p: m
            for p, m in self.marks.items()
            if math.isfinite(m) and p in self.forwarded and self.forwarded[p] >= newest - self.resume_wait
        }

    def flush(self) -> EngineOutput:
        """End of stream: every upstream task is done."""
        self.resuming.clear()  # none is coming back
        for p in range(self.n_upstream):
            self.mark(p, math.inf, final=True)
        for p in list(self.marks):
            self.final.add(p)
        return self.advance()

    def _take(self, wm: float) -> dict[str, Sequence[TelemetryRecord]]:
        """The buffered records older than ``wm``, by key, each key's in canonical order and
        without records forwarded twice; columns stay columns (``pipeline.rows``)."""
        go: list[_Chunk] = []
        stay: list[_Chunk] = []
        for c in self._chunks:
            if c.tmax < wm:
                go.append(c)
            elif c.tmin >= wm:
                stay.append(c)
            else:
                before = c.ts < wm
                go.append(c.take(before))
                stay.append(c.take(~before))
        return self._take_chunks(go, stay)

    def _take_chunks(self, go: list["_Chunk"], stay: list["_Chunk"]) -> dict[str, Sequence[TelemetryRecord]]:
        """The records of ``go``, by key, each key's in canonical order and without records
        forwarded twice; ``stay`` stays buffered."""
        recs, where = rows.concat([c.records for c in go])
        self._went = go
        if not len(recs):
            self._chunks = stay
            return {}
        # None while every record has the one fleet key (the service's case).
        keys = None if all(c.keys is None for c in go) else [k for c in go for k in c.key_list()]
        tsa = np.concatenate([c.ts for c in go])
        cols = SortColumns.concat([c.sort_columns() for c in go])
        if where is not None:  # the joined columns' rows are in another order than the chunks'
            tsa, cols = tsa[where], cols.take(where)
            keys = None if keys is None else [keys[i] for i in where.tolist()]
        order, dup = canonical_order(recs, tsa, cols)
        # Only now: should the sort raise, nothing has left the buffer.
        self._chunks = stay
        self._n_buf -= len(recs)
        self._newest = max(self._newest, float(tsa.max()))
        if dup:
            self.stats["duplicate"] += dup
        if keys is None:
            return {FLEET_KEY: rows.take(recs, np.array(order, np.int64))}
        by_key: dict[str, list[int]] = {}
        for i in order:
            by_key.setdefault(keys[i], []).append(i)
        return {k: rows.take(recs, np.array(ix, np.int64)) for k, ix in sorted(by_key.items())}

    def _release(self, batches: dict[str, Sequence[TelemetryRecord]], out: EngineOutput) -> None:
        for key, recs in batches.items():
            self.stats["released"] += len(recs)
            self._collect(lambda: self.engine(key).process(recs), out)
            if self.hang is not None:
                hang = self.hang
                self._collect(lambda: EngineOutput(alerts=hang.observe(rows.split(recs)[1])), out)

    def _advance_engines(self, wm: float, out: EngineOutput) -> None:
        """Every engine to ``wm`` (what the marks allow)."""
        for eng in self.engines.values():
            self._collect(lambda: eng.advance_to(wm), out)

    def _flush_engines(self, out: EngineOutput) -> None:
        """Every engine to its end: every upstream task is final."""
        for eng in self.engines.values():
            self._collect(eng.flush, out)

    def _collect(self, run: Callable[[], EngineOutput], out: EngineOutput) -> None:
        """What ``run`` (an engine's or the hang detector's call) gives, into ``out``. Should it
        raise where no guard of the engine's is (a model's ingest, NCCL, advance or finish
        hook: ``Engine._rows`` guards a tick's rows), what it held is not evaluated, the error is
        logged with one ``internal`` dead letter, and the stage goes on: its records have left
        the buffer and none is fed twice, and a service that stopped here would meet the same
        error at every restart."""
        try:
            got = run()
        except Exception as e:  # noqa: BLE001 - a model's bug costs what this call held
            log.exception("the fleet stage's models raised; what the call held is not evaluated")
            detail = f"the fleet stage's models raised; what this call held is not evaluated: {type(e).__name__}: {e}"
            out.dead.append(DeadLetter(reason=INTERNAL, detail=detail[:300], origin=f"fleet stage@{self.released}"))
            return
        out.alerts.extend(got.alerts)
        # What only this engine can cause goes out: a host past its max_hosts (it keeps every
        # host of its fleet, a host-stage engine one partition's) and rows a model failed on.
        # Anything else the host stage wrote for these records already: counted, not repeated.
        placed: dict[tuple[str | None, float | None], Iterator[str | None]] = {}
        for d in got.dead:
            if d.reason == ENTITY_LIMIT:
                key = (d.host, d.ts)
                if key not in placed:
                    placed[key] = self._origins_of(d.host, d.ts)
                d = msgspec.structs.replace(d, origin=next(placed[key], None) or d.origin)
            if d.reason in _FLEET_OWN:
                out.dead.append(d)
            else:
                self.stats["dead_again"] += 1

    def _origins_of(self, host: str | None, ts: float | None) -> Iterator[str | None]:
        """Where the records of ``host`` at ``ts`` the engines were just given came from, in the
        canonical order they were handed in (kind, GPU, link; None: fed without an origin): an
        engine names a record by its place in what it was handed, which only this stage can
        trace to a message (a host refused only here: past ``max_hosts``, rare)."""
        found: list[tuple[int, int, int, str | None]] = []
        for c in self._went:
            cols = c.sort_columns()
            if host not in cols.hosts:
                continue
            for i in np.flatnonzero((cols.host == cols.hosts.index(host)) & (c.ts == ts)).tolist():
                where = None if c.origin is None or c.pos is None else f"{c.origin}#{int(c.pos[i])}"
                found.append((int(cols.kind[i]), int(cols.gpu[i]), int(cols.link[i]), where))
        found.sort(key=lambda f: f[:3])
        return iter([f[3] for f in found])

    @property
    def pending(self) -> int:
        return self._n_buf + sum(e.pending for e in self.engines.values())

    # -- state -------------------------------------------------------------------------------

    def resume_at(self) -> int | None:
        """The earliest input position whose records are still (partly) buffered: where a
        ``replayable`` snapshot's reader must resume (None: nothing is buffered)."""
        return min((c.at for c in self._chunks if c.at is not None), default=None)

    def snapshot(self, replayable: bool = False) -> bytes:
        """The stage's state. ``replayable``: without the buffered records, which the reader of
        the snapshot reads again from the input, from ``resume_at()`` on (those fed with their
        ``at``; any others are kept in it): the snapshot's cost is then the engines' state, not
        a multiple of what a slow upstream task holds back (docs/operations.md, "How it keeps
        its promises"; docs/architecture.md §8).

        The marks are kept as they are: the stage has released up to them (``advance`` follows
        every input), every buffered record is at or past that, and the marks read again are
        older, so the replay releases nothing before the records it re-reads are back."""
        d: dict[str, Any] = {
            "version": STATE_VERSION,
            "n_upstream": self.n_upstream,
            "released": self.released,
            "marks": {str(k): v for k, v in self.marks.items()},
            "final": sorted(self.final),
            "forwarded": {str(k): v for k, v in self.forwarded.items()},
            "resuming": {str(k): v for k, v in self.resuming.items()},
            "lull": self.lull,
        }
        # Records fed without a position (in process, or restored from a snapshot that carried
        # them) cannot be read again: those ride in the snapshot either way.
        kept = [c for c in self._chunks if not replayable or c.at is None]
        d["buffer"] = msgspec.json.encode([r for c in kept for r in c.records])
        d["keys"] = [k for c in kept for k in c.key_list()]
        if replayable:
            d["newest"] = self._newest
            d["replay_until"] = max(self.replay_until, -1 if self.position is None else self.position)
        d["engines"] = {k: e.snapshot() for k, e in self.engines.items()}
        if self.hang is not None:
            d["hang"] = self.hang.to_state()
        return msgspec.msgpack.encode(d)

    def restore(self, blob: bytes, decode_records: Callable[[bytes], list[TelemetryRecord]]) -> None:
        try:
            d = msgspec.msgpack.decode(blob)
            if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
                raise StateError(f"fleet stage state version {d.get('version') if isinstance(d, dict) else None}")
            self.n_upstream = int(d["n_upstream"])
            self.released = float(d["released"])
            self.marks = {int(k): float(v) for k, v in d["marks"].items()}
            self.final = {int(p) for p in d["final"]}
            # (A snapshot from before ``forwarded`` was kept: each mark was as far as it went.)
            forwarded = d["forwarded"] if "forwarded" in d else d["marks"]
            self.forwarded = {int(k): float(v) for k, v in forwarded.items()}
            self.resuming = {int(k): float(v) for k, v in d.get("resuming", {}).items()}
            self.lull = float(d.get("lull", -math.inf))
            # A replayable snapshot's reader reads the records fed with a position again.
            buf = decode_records(d["buffer"])
            keys = [str(k) for k in d["keys"]]
            self._newest = float(d.get("newest", -math.inf))
            self.replay_until = int(d.get("replay_until", -1))
            if len(buf) != len(keys):
                raise StateError("fleet stage state: buffered records and keys differ in length")
            self._chunks = [_Chunk(buf, None if all(k == FLEET_KEY for k in keys) else keys)] if buf else []
            self._n_buf = len(buf)
            self.engines = {}
            for k, blob_k in d["engines"].items():
                self.engine(str(k)).restore(blob_k)
            if self.hang is not None and d.get("hang") is not None:
                self.hang.load_state(d["hang"])
        except (msgspec.DecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise StateError(f"cannot restore the fleet stage: {e}") from e


class _Chunk:
    """One feed's records, their keys (None: all the one fleet key), event times and sort columns
    (None: read off the records when they are released)."""

    __slots__ = ("records", "keys", "ts", "tmin", "tmax", "at", "cols", "src", "origin", "pos")

    def __init__(
        self,
        records: Sequence[TelemetryRecord],
        keys: list[str] | None,
        ts: np.ndarray | None = None,
        cols: SortColumns | None = None,
    ) -> None:
        self.records, self.keys, self.cols = records, keys, cols
        self.at: int | None = None  # the input position it came from (FleetStage.feed)
        self.src: int | None = None  # the upstream task that forwarded it (FleetStage.feed)
        self.origin: str | None = None  # the message it came in, and each record's place there
        self.pos: np.ndarray | None = None
        self.ts = rows.times(records) if ts is None else ts
        self.tmin, self.tmax = (float(self.ts.min()), float(self.ts.max())) if len(records) else (math.inf, -math.inf)

    def key_list(self) -> list[str]:
        return self.keys if self.keys is not None else [FLEET_KEY] * len(self.records)

    def sort_columns(self) -> SortColumns:
        return self.cols if self.cols is not None else SortColumns.of(self.records)

    def take(self, sel: np.ndarray) -> "_Chunk":
        idx = np.flatnonzero(sel).tolist()
        keys = None if self.keys is None else [self.keys[i] for i in idx]
        c = _Chunk(rows.take(self.records, sel), keys, self.ts[sel], None if self.cols is None else self.cols.take(sel))
        c.at, c.src, c.origin = self.at, self.src, self.origin
        c.pos = None if self.pos is None else self.pos[sel]
        return c


def records_decoder(fields: tuple[str, ...]) -> Callable[[bytes], list[TelemetryRecord]]:
    """Decode a JSON array of records as the fleet stage's engine reads them (its fields, the
    job labels), for its buffered records in a snapshot."""
    dec = msgspec.json.Decoder(list[Union[dcgm_record_type(fields), NcclRecord, ProgressRecord]])  # type: ignore[misc]
    return lambda blob: list(dec.decode(blob))
