"""One shard of the fleet stage's models, as one fleet partition of the service runs it
(docs/operations.md, "Model shards"; the in-process reference is ``pipeline.shards.ShardedFleet``).

Shard ``i`` of ``n`` gets the DCGM records of the hosts ``shard_of(host, n) == i`` and runs
their models; it also scores the NCCL records of its lanes (``scorer_of``: a communicator size's
lane modulo ``n``; shard 0 also takes the progress records) in its scorer engine, and hands
each shard the findings of its GPUs. The shards meet only through what they send each other,
which the service carries over the fleet topic (``pipeline.service.fleet``):

- their cohort parts (``PeerExchange``): every shard applies epoch ``k`` of every shard's parts
  at the start of epoch ``k + LAG_EPOCHS``, so a shard evaluates no further than every shard's
  parts allow (``bound``), as in one process;
- each scorer's findings for a shard's GPUs, with how far they are complete (``scored_by``): a
  shard evaluates a tick once the findings of it are in from every scorer that the marks say
  was sent NCCL records (``nccl_sent``; a scorer without any says nothing and is not waited
  for), and merges a GPU's findings from several lanes (``findings.merge``) as one process does;
- how far each shard's alerts are complete (``done``), for the incident stage on shard 0.

What crosses is taken from ``outgoing()`` and fed in with ``accept_parts`` and
``accept_findings`` (the findings with their scorer's progress); each stays correct when a
message is read twice (a sender restarted from its checkpoint sends again what it sent after
it): parts go by epoch, findings by model, lane and tick. Without NCCL models a shard waits for
no findings.

>>> st = ShardStage(lambda: None, shard=1, shards=4)
>>> st.key, st.exchange.shards[:2], st.scored
('shard-1', ['shard-0', 'shard-1'], -inf)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import msgspec

from pipeline import rows
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import StateError
from pipeline.models.cohorts import EPOCH_S, OPEN_ENDED, SharedExchange, epoch_of
from pipeline.models.findings import Findings, FindingsError, from_wire, to_wire
from pipeline.models.modelset import ModelSet
from pipeline.models.statecodec import decode_state, encode_state
from pipeline.schema import TelemetryRecord
from pipeline.shards import SCORER, by_scorer, split_findings
from pipeline.fleetstage import FLEET_KEY, FleetStage

# 2: a scorer on every shard (``scored_by``); a version 1 state (shard 0 scored) is read.
SHARD_STATE_VERSION = 2
READS_SHARD_STATES = (1, 2)


class PeerExchange(SharedExchange):
    """The cohort exchange as one shard of a service holds it: its own parts (``publish``, by
    its model set) and the other shards' (``accept``, from the fleet topic). Its own new parts
    wait in ``outgoing`` to be sent to the others."""

    def __init__(self, shards: Sequence[str], own: str) -> None:
        super().__init__(shards)
        self.own = own
        self.outgoing: list[dict[str, Any]] = []

    def publish(self, shard: str, part: dict[str, Any]) -> None:
        if self.accept(shard, part):
            self.outgoing.append(part)

    def accept(self, shard: str, part: dict[str, Any]) -> bool:
        """Add ``shard``'s ``part`` unless it has it (a part read again); False then. Parts of a
        shard follow each other (each starts where the last ended), but after an open-ended one
        (the shard flushed): a part at or after that one's epoch reopens the shard there."""
        mine = self.published[shard]
        if mine:
            last = mine[-1]
            if part["epoch"] < last["until"]:
                if last["until"] != OPEN_ENDED or part["epoch"] <= last["epoch"] or part["until"] == OPEN_ENDED:
                    return False
                mine[-1] = {**last, "until": part["epoch"]}
        mine.append(part)
        self.opened[shard] = int(part["until"])
        return True

    def forget(self, shard: str, before: int) -> None:
        """Only this shard applies parts here: what ends before ``before`` goes (each shard's
        latest part stays: it may cover later epochs)."""
        if shard != self.own:
            return
        for s, mine in self.published.items():
            if len(mine) > 1:
                self.published[s] = [p for p in mine[:-1] if p["until"] > before] + mine[-1:]

    def to_state(self) -> dict[str, Any]:
        return {"published": self.published, "opened": self.opened}

    def load_state(self, st: Any, check: Callable[[Any], None]) -> None:
        """Take back ``to_state``, every part checked again (``check``: ``ModelSet.check_part``)."""
        published, opened = st["published"], st["opened"]
        if not isinstance(published, dict) or set(published) != set(self.shards) or not isinstance(opened, dict):
            raise StateError("shard state: the exchange's shards differ from this service's")
        for parts in published.values():
            if not isinstance(parts, list):
                raise StateError("shard state: malformed cohort parts")
            for p in parts:
                check(p)
        if not set(opened) <= set(self.shards) or not all(type(v) is int for v in opened.values()):
            raise StateError("shard state: malformed exchange bounds")
        self.published, self.opened = published, opened


class ShardStage(FleetStage):
    """The fleet stage of one fleet partition when the models are split by host (``shard`` of
    ``shards``): one shard engine, and the scorer of its NCCL lanes."""

    def __init__(self, make_engine: Callable[[], Engine], shard: int, shards: int, **kw: Any) -> None:
        super().__init__(make_engine, **kw)
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} of {shards}")
        self.shard, self.shards = shard, shards
        self.key = f"shard-{shard}"
        self.exchange = PeerExchange([f"shard-{i}" for i in range(shards)], self.key)
        # How far each shard's scorer's findings for this shard are complete (its own included).
        self.scored_by = [-math.inf] * shards
        # The scorers any telemetry partition has sent NCCL records to, as their marks say (it
        # only grows); None: a mark did not say, so every scorer is waited for.
        self.waits_on: set[int] | None = set()
        # How far this shard's alerts are complete: every tick before it was evaluated.
        self.done = -math.inf
        # A flush begun at a lull (``advance``) that waits for the others' parts.
        self.flushing = False
        self._first_ts = math.inf  # the oldest DCGM record this shard took: where it opens
        # Per NCCL model and lane, the tick of its latest findings taken.
        self._last_tick: dict[tuple[str, int], float] = {}
        self._nccl: bool | None = None  # whether the models include NCCL ones (``reads_findings``)
        self._findings_out: dict[int, list[Findings]] = {}
        self.stats.update({"misrouted": 0, "findings_again": 0, "parts_again": 0})

    def engine(self, key: str = FLEET_KEY) -> Engine:
        """An engine by key, wired as a shard or the scorer when made; the fleet key names
        this shard's (what drivers read of the stage's engine: its fields and models)."""
        key = self.key if key == FLEET_KEY else key
        eng = self.engines.get(key)
        if eng is None:
            eng = self.engines[key] = self.make_engine()
            ms = _models(eng)
            if key == SCORER:
                ms.as_scorer()
            else:
                ms.as_shard(self.exchange, key)
        return eng

    @property
    def models(self) -> ModelSet:
        return _models(self.engine())

    @property
    def scored(self) -> float:
        """How far the findings for this shard are complete: every scorer's that has NCCL
        records to score (``waits_on``), and its own."""
        if self.waits_on is None:
            return min(self.scored_by)
        return min([self.own_scored, *(self.scored_by[q] for q in self.waits_on)])

    def nccl_sent(self, partitions: Sequence[int] | None) -> None:
        """A mark's word on which fleet partitions its task has sent NCCL records to (None: it
        did not say). A mark covers the records before it, so a scorer is waited for from the
        first tick it can have findings of."""
        if partitions is None:
            self.waits_on = None
        elif self.waits_on is not None:
            self.waits_on.update(partitions)

    def tells_progress(self) -> bool:
        """Whether this shard's scorer is one the others wait for (it was sent NCCL records)."""
        return self.waits_on is None or self.shard in self.waits_on

    @property
    def own_scored(self) -> float:
        """How far this shard's scorer has scored (what it tells the others)."""
        return self.scored_by[self.shard]

    @own_scored.setter
    def own_scored(self, t: float) -> None:
        self.scored_by[self.shard] = t

    # -- what crosses between shards ---------------------------------------------------------

    def accept_parts(self, sender: int, parts: Sequence[dict[str, Any]]) -> None:
        """Cohort parts of shard ``sender`` (each checked by the caller: ``ModelSet.check_part``)."""
        for p in parts:
            if not self.exchange.accept(f"shard-{sender}", p):
                self.stats["parts_again"] += 1

    def accept_findings(self, sender: int, found: Sequence[Findings], scored: float | None) -> None:
        """Shard ``sender``'s scorer's findings for this shard's GPUs, complete before ``scored``
        (that scorer's latest word: it falls again when the scorer goes on after a flush; None:
        no word in this message, the findings run on in the next); a model's findings of a lane
        and tick it had already (a message read again) are dropped."""
        inbox = self.models.nccl.inbox
        for f in found:
            key = (f.model, f.lane)
            if f.tick <= self._last_tick.get(key, -math.inf):
                self.stats["findings_again"] += 1
            else:
                inbox.append(f)
                self._last_tick[key] = f.tick
        if scored is not None:
            self.scored_by[sender] = scored

    def outgoing(self) -> dict[str, Any]:
        """What this shard has for the others since the last call: its new cohort parts (for
        every shard), its scorer's findings for each shard (``findings``: by shard) and how far
        they are complete (``scored``)."""
        parts, self.exchange.outgoing = self.exchange.outgoing, []
        found, self._findings_out = self._findings_out, {}
        return {"parts": parts, "findings": found, "scored": self.own_scored if self.tells_progress() else None}

    # -- release -----------------------------------------------------------------------------

    def _advance(self) -> EngineOutput:
        """Release what the marks allow to the engines, and step them as far as the other
        shards' parts and the scorer's findings allow (which messages since may have moved).
        Every upstream task final (a lull, or the end): everything goes, and the shard flushes
        as soon as the others' parts allow; nothing more is released until it has."""
        out = EngineOutput()
        flushed = False
        while True:
            wm = self.last_watermark = self.watermark()
            if self.flushing:
                self._flush_engines(out)
                if self.done < math.inf:
                    return out  # the others' parts, or the scorer's findings, are not in yet
                self.flushing = False
                self._all_fed()  # as one stage's flush
            elif wm == math.inf and (not flushed or self._n_buf):
                # Every task final (again, should records have come while a flush waited).
                flushed = True
                self._begin_flush(out)
            else:
                break
        if wm == math.inf:
            return out
        if wm > self.released and wm > -math.inf:
            self._release(self._take(wm), out)
            if self.hang is not None:
                out.alerts.extend(self.hang.advance(wm))
        if wm > -math.inf:
            self._advance_engines(wm, out)
            self.released = max(self.released, wm)
            self._release_early(out)
        return out

    def _rows_engine(self) -> Engine | None:
        return self.engines.get(self.key)

    def _may_run(self, end: float) -> bool:
        """A host's rows of a tick run early once every shard's parts of the epochs it applies
        are in. The NCCL models' findings of the tick need not be: they judge those rows when
        the tick is whole (``ModelSet.run_deferred``), which waits for the findings."""
        bound = self.exchange.bound()
        return bound is not None and bound * EPOCH_S >= end and self.done < math.inf

    def _begin_flush(self, out: EngineOutput) -> None:
        """Everything buffered to the engines, and a flush to follow (``flushing``): records
        taken since the last one make it run again (its scorer and shard were done)."""
        taken = self._take(math.inf)
        if self.key in taken:
            self.done = min(self.done, self.engine().released)
        if SCORER in taken:
            self.own_scored = min(self.own_scored, self.engine(SCORER).released)
        self._release(taken, out)
        if self.hang is not None:
            out.alerts.extend(self.hang.advance(math.inf))
        self._all_fed()  # as one stage's lull: a record sent again meanwhile is late
        self._lulled()
        self.flushing = True

    def _take(self, wm: float) -> dict[str, Sequence[TelemetryRecord]]:
        """The released records, DCGM to this shard's engine, NCCL of its lanes and (shard 0)
        progress to its scorer (others were misrouted, and are counted and dropped)."""
        dcgm: list[Sequence[TelemetryRecord]] = []
        other: list[TelemetryRecord] = []
        for recs in super()._take(wm).values():
            d, o = rows.split(recs)
            dcgm.append(d)
            other += o
        out: dict[str, Sequence[TelemetryRecord]] = {}
        mine = rows.concat(dcgm)[0]  # one key's rows: already in canonical order
        if len(mine):
            out[self.key] = mine
            if self.models.epochs.open is None:
                self._first_ts = min(self._first_ts, float(rows.times(mine).min()))
        if other:
            mine_too = by_scorer(other, self.shards).get(self.shard, [])
            self.stats["misrouted"] += len(other) - len(mine_too)
            if mine_too:
                out[SCORER] = mine_too
        return out

    def _advance_engines(self, wm: float, out: EngineOutput) -> None:
        if self.done == math.inf and wm <= self.lull:
            # Flushed at a lull, the marks not past it (the tasks not back yet): nothing to step
            # to. The scorer has done everything up to the lull: said lower, the other shards'
            # flushes would wait for it; said inf, they would run past its findings once the
            # tasks are back.
            if self.own_scored == math.inf:
                self.own_scored = self.lull + self.engine().config.tick
            return
        if SCORER in self.engines:  # made when its first NCCL records come: none, nothing to score
            self._collect(lambda: self.engines[SCORER].advance_to(wm), out)
            self._hand_over()
        self.own_scored = wm
        self._step_shard(wm, out)

    def _step_shard(self, wm: float, out: EngineOutput) -> bool:
        """This shard's engine towards ``wm``, each step only as far as every shard's parts and
        the scorer's findings allow; whether they allowed all the way."""
        eng = self.engine()
        if self.models.epochs.open is None:
            # Opens where its first record is, or at the marks: any later record is past them.
            self.models.epochs.advance(epoch_of(min(wm, self._first_ts)))
        upto = -math.inf
        while True:
            bound = self.exchange.bound()
            if bound is None:
                break
            upto = min(wm, self.scored if self.reads_findings() else math.inf, bound * EPOCH_S)
            before = eng.released
            if upto <= before:
                break
            self._collect(lambda: eng.advance_to(upto), out)
            if eng.released <= before:
                break  # not a whole tick further
        self.done = eng.released
        return upto >= wm

    def reads_findings(self) -> bool:
        """Whether this shard's ticks wait for the scorers' findings: only with NCCL models (a
        shard of DCGM models alone would wait a hop a tick for nothing)."""
        if self._nccl is None:
            self._nccl = bool(self.models.nccl_levels())
        return self._nccl

    def _flush_engines(self, out: EngineOutput) -> None:
        """Every upstream task is final: the scorer flushes; this shard evaluates what it holds
        (as far as the others allow), then publishes an open-ended part and flushes."""
        if self.own_scored < math.inf:
            if SCORER in self.engines:
                self._collect(self.engines[SCORER].flush, out)
                self._hand_over()
            self.own_scored = math.inf
        if self.done == math.inf:
            return
        eng = self.engine()
        newest = eng.clock.newest(eng.entities.n_hosts)
        if math.isfinite(newest):
            if not self._step_shard(newest + eng.config.tick, out):
                return  # the others' parts, or the scorers' findings, are not in yet
        self._collect(eng.flush, out)
        first = self.exchange.first()
        self.models.epochs.close(first if first is not None else OPEN_ENDED - 1)
        self.done = math.inf

    def _hand_over(self) -> None:
        """This shard's scorer's findings: this shard's rows to its own inbox, each other shard's
        to send (every shard takes every tick's findings, rows or none: the model's warmth comes
        with them)."""
        scorer = _models(self.engine(SCORER))
        found = scorer.nccl.out or []
        if not found:
            return
        for i, mine in enumerate(split_findings(found, scorer.nccl_levels(), self.shards)):
            if i == self.shard:
                self.models.nccl.inbox.extend(mine)
            else:
                self._findings_out.setdefault(i, []).extend(mine)
        found.clear()

    # -- state -------------------------------------------------------------------------------

    def snapshot(self, replayable: bool = False) -> bytes:
        """The fleet stage's snapshot, with the exchange's parts, the findings not yet applied
        and how far the scorer and this shard have come (a checkpoint is taken after a batch's
        messages went out, so nothing waits in ``outgoing``)."""
        return encode_state(
            {
                "shard_stage": SHARD_STATE_VERSION,
                "shard": self.shard,
                "shards": self.shards,
                "stage": super().snapshot(replayable),
                "exchange": self.exchange.to_state(),
                "inbox": [to_wire(f) for f in self.models.nccl.inbox],
                "scored_by": self.scored_by,
                "waits_on": None if self.waits_on is None else sorted(self.waits_on),
                "done": self.done,
                "flushing": self.flushing,
                "first_ts": self._first_ts,
                "last_tick": [[m, lane, t] for (m, lane), t in self._last_tick.items()],
            }
        )

    def restore(self, blob: bytes, decode_records: Callable[[bytes], list[TelemetryRecord]]) -> None:
        try:
            d = decode_state(blob)
            if not isinstance(d, dict) or d.get("shard_stage") not in READS_SHARD_STATES:
                raise StateError("not a model shard's state (a fleet stage of another topology?)")
            if d["shard"] != self.shard or d["shards"] != self.shards:
                raise StateError(f"state of shard {d['shard']} of {d['shards']}, not {self.shard} of {self.shards}")
            super().restore(d["stage"], decode_records)
            ms = self.models
            self.exchange.load_state(d["exchange"], ms.check_part)
            ms.nccl.inbox = [from_wire(f, ms.nccl_levels()) for f in d["inbox"]]
            self.done, self._first_ts = (float(d[k]) for k in ("done", "first_ts"))
            self.flushing = bool(d.get("flushing", False))
            if d["shard_stage"] == 1:
                # Shard 0 scored every lane then, its findings merged over them (lane -1).
                self.scored_by = [float(d["scored"])] + [-math.inf] * (self.shards - 1)
                self._last_tick = {(str(k), -1): float(v) for k, v in d["last_tick"].items()}
            else:
                scored_by = [float(t) for t in d["scored_by"]]
                if len(scored_by) != self.shards:
                    raise StateError(f"{len(scored_by)} scorers' progress for {self.shards} shards")
                self.scored_by = scored_by
                self._last_tick = {(str(m), int(lane)): float(t) for m, lane, t in d["last_tick"]}
            waits = d.get("waits_on")
            if waits is not None and not all(type(q) is int and 0 <= q < self.shards for q in waits):
                raise StateError("shard state: scorers waited for outside the shards")
            self.waits_on = None if waits is None else set(waits)
        except StateError:
            raise
        except (msgspec.DecodeError, KeyError, TypeError, ValueError, FindingsError) as e:
            raise StateError(f"cannot restore the model shard: {e}") from e


def _models(engine: Engine) -> ModelSet:
    ms = engine.models
    if not isinstance(ms, ModelSet):
        raise ValueError("a model shard needs the models")
    return ms
