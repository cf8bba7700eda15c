"""The service's two stages on Kafka (docs/operations.md, "Topology"): what the host stage sends
to ``<prefix>.fleet`` and what a fleet-stage partition makes of it.

The messages, their envelope and signature: ``pipeline.service.fleetwire``; the host stage's
side, which queues and sends them: ``pipeline.service.outbox``.

A fleet-stage partition releases a second once every telemetry partition's task has marked past
it (``pipeline.fleetstage.FleetStage``), so its alerts do not depend on how many replicas run
either stage or on how the partitions are spread among them. With incidents on, the alerts of
both stages before that second then go to its incident stage through an ``AlertFeed``, in the
canonical order the replay feeds it (``pipeline.replay.incident_watermark``).
"""

from __future__ import annotations

import hmac
import logging
import math
import operator
from typing import Any, Callable, Sequence

import msgspec
import numpy as np

from pipeline.bus.base import Message
from pipeline.deadletters import (
    BAD_ALERT,
    BAD_ENVELOPE,
    BAD_MARK,
    BAD_SIGNATURE,
    EARLY_MARK,
    INTERNAL,
    MALFORMED_JSON,
    TOO_LARGE,
    TS_OUT_OF_RANGE,
    UNKNOWN_PARTITION,
    UNSIGNED,
    WRONG_TYPE,
)
from pipeline.decode import RAW_KEEP, TS_MAX, TS_MIN
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import StateError
from pipeline.hang import HangDetector
from pipeline.incidents import AlertFeed, IncidentEvent, IncidentStage
from pipeline.runner import Totals
from pipeline.schema import AlertEvent, DeadLetter, NcclRecord, ProgressRecord, TelemetryRecord, encode
from pipeline.service import peers
from pipeline.service.peers import PEER_ENVELOPE
from pipeline.shardstage import ShardStage
from pipeline.service.routing import SenderLog
from pipeline.service.fleetwire import (
    ALERTS_PREFIX,
    COLUMNS_MAP,
    ENVELOPE_VERSION,
    MAX_FORWARD_ALERTS,
    AlertBatch,
    Envelope,
    Mark,
    Send,
    mac,
    wrap,
)
from pipeline.service.forwarded import Builder, Columns, Decoded, Malformed, check_other
from pipeline.canonical import SortColumns
from pipeline.fleetstage import FLEET_KEY, FleetStage, records_decoder

log = logging.getLogger("gpuwarden.service")
_TS = operator.attrgetter("ts")
# The fleet stage's counters of records its models did not get (FleetStage.stats), and of its
# forced releases (events, not records).
DROPPED = ("duplicate", "late")
# What the alert feed before the incident stage drops, and the prefix of the incident stage's
# own drops (FleetTask.take_incident_drops).
FEED_DROPPED = ("late", "duplicate", "bad_ts")
_STAGE_DROPPED = "incidents.dropped."
FORCED = "forced"
_KEY = FLEET_KEY.encode()
# What one forwarded alert may hold (and, in fleetwire, how many a message): an alert over it is
# refused (``bad_alert``), so a forged one costs bounded work.
MAX_ALERT_TEXT = 256  # characters of an alert's id, rule, fault, severity, host or job
MAX_ALERT_SUMMARY = 4096
MAX_ALERT_ITEMS = 64  # evidence and label entries
ALERT_STATES = ("firing", "resolved")
# The fleet task's checkpoint with incidents on: the stage's snapshot beside the incident stage's
# and its feed's state. Without incidents the checkpoint is the stage's snapshot alone, as before.
TASK_STATE_VERSION = 1


class FleetTask:
    """One partition of ``<prefix>.fleet``: a ``PartitionTask`` (pipeline/protocols.py) the
    service's commit protocol drives, as it does the host stage's ``Pipeline``.

    Every message is checked before the stage sees it (``check``): its envelope, its MAC (with a
    key), its sender (a telemetry partition, ``0 <= sender < n_upstream``), and for a mark that
    it is its sender's, agrees on ``n``, and runs at most ``lead`` seconds ahead of the newest
    record its sender forwarded (without records, rules only: within the decoder's time range);
    for alerts that each is a well-formed, bounded alert event. What fails is a dead letter with
    its reason and origin.

    With ``incidents``, the alerts of both stages go through ``feed`` to that ``IncidentStage``
    (public: the service serves its open incidents) up to the second the stage released; its
    events wait in ``take_incidents`` for the service to send with the batch."""

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        n_upstream: int,
        max_buffer: int = 2_000_000,
        *,
        topic: str = "",
        group: str = "",
        key: bytes | None = None,
        hang: HangDetector | None = None,
        incidents: IncidentStage | None = None,
        records: bool = True,
        shard: tuple[int, int] | None = None,
        forward_alerts: bool = False,
    ) -> None:
        """``n_upstream``: the telemetry topic's partition count, as the service knows it;
        ``topic``, ``group``, ``key``: what the host stage's ``Outbox`` signs with; ``hang``: the
        hung-collective detector (pipeline/hang.py); ``incidents``: the incident stage to feed
        (None: incidents off); ``records``: whether the host stage forwards every record it
        accepts (models on), which bounds its marks (rules only, with or without the progress
        records, the decoder's time range does). ``shard``: (this fleet partition, their count)
        when the models run in shards by host (``service.shard_models``, pipeline/shardstage.py):
        this task runs that shard and exchanges its parts, findings and progress with the
        others over the fleet topic (``take_sends``); ``forward_alerts``: it sends its models'
        alerts to partition 0's incident stage (incidents on, partition > 0)."""
        self.shard = shard
        self.forward_alerts = forward_alerts
        if shard is None:
            self.stage = FleetStage(make_engine, upstream=n_upstream, max_buffer=max_buffer, hang=hang)
        else:
            self.stage = ShardStage(
                make_engine, shard[0], shard[1], upstream=n_upstream, max_buffer=max_buffer, hang=hang
            )
        # With shards: how far each other shard's alerts are complete (partition 0, incidents
        # on), what waits to be sent to the other fleet partitions, and the progress last sent.
        self.peer_done: dict[int, float] = {}
        self._sends: list[Send] = []
        self._sent: dict[tuple[int, str], float | None] = {}
        self.incidents = incidents
        self.feed = incidents.feed() if incidents is not None else AlertFeed()
        self.records = records
        self._events: list[IncidentEvent] = []
        self.n_upstream = n_upstream
        self.topic, self.group, self.key = topic, group, key
        self.totals = Totals()
        fields = self.stage.engine().decode_fields
        self._decode = records_decoder(fields)
        self._columns = msgspec.msgpack.Decoder(Columns)
        self._build = Builder(fields)
        self._mark = msgspec.json.Decoder(Mark)
        self._alert_batch = msgspec.json.Decoder(AlertBatch)
        self._envelope = msgspec.msgpack.Decoder(Envelope)
        self._taken: dict[str, int] = {}  # each stat as last taken
        self._lulls = EngineOutput()  # what the stage released at lulls within the batch
        cfg = self.stage.engine().config
        # How far a mark may run ahead of the newest record its sender forwarded. A host-stage
        # engine forwards every record it accepts as it arrives, and its watermark stays within a
        # tick of the newest of them (pipeline/engine/engine.py, _whole_bound); the allowed
        # lateness on top is margin, never needed by a mark the host stage wrote.
        self.lead = cfg.allowed_lateness + cfg.tick
        self.max_hosts = cfg.max_hosts
        # The partitions each host's records came from: a host split between them (a producer
        # that does not key by host) shows here across replicas (service/upkeep.py).
        self.senders = SenderLog()

    def handle_guarded(self, messages: Sequence[Message]) -> EngineOutput:
        """Check and apply each message (a bad one is a dead letter), then release what the
        marks allow."""
        dead: list[DeadLetter] = []
        out = self._lulls = EngineOutput()
        for m in messages:
            try:
                dead.extend(self.check(m))
            except Exception as e:  # noqa: BLE001 - a message that breaks the checks costs only itself
                log.exception("fleet: message at %s could not be handled", m.origin)
                dead.append(_dead(INTERNAL, f"{type(e).__name__}: {e}", m, m.value))
            self.stage.position = m.offset + 1
            self.totals.messages += 1
        last = self.stage.advance()
        self._to_incidents(last)
        out.extend(last)
        self._to_peers(out)
        out.dead.extend(dead)
        self.totals.add(out)
        return out

    def _to_incidents(self, out: EngineOutput, lull: bool = False) -> None:
        """The models' alerts into the feed, then what the feed releases into the incident stage:
        every alert before the second this stage released (all at a lull, ``lull``, or once
        every upstream is final); with shards, and before the second every shard's alerts are
        complete."""
        if self.incidents is None:
            return
        self.feed.add(out.alerts)
        upto = math.inf if lull else max(self.stage.released, self.stage.last_watermark)
        if isinstance(self.stage, ShardStage):
            upto = min(upto, self.stage.done, *(self.peer_done.get(q, -math.inf) for q in range(1, self.stage.shards)))
        self._events += self.incidents.process(self.feed.release(upto))

    def _to_peers(self, out: EngineOutput) -> None:
        """What this shard has for the other fleet partitions, queued for ``take_sends``: its
        new cohort parts to each; its scorer's findings for each and how far they are complete;
        to partition 0 (``forward_alerts``) the models' alerts and how far they are."""
        st = self.stage
        if not isinstance(st, ShardStage):
            return
        got = st.outgoing()
        me = st.shard
        for q in range(st.shards):
            if q == me:
                continue
            found = got["findings"].get(q, [])
            scored = self._changed(q, "scored", got["scored"]) if st.reads_findings() else None
            alerts: list[AlertEvent] = out.alerts if self.forward_alerts and q == 0 else []
            done = self._changed(q, "done", st.done) if self.forward_alerts and q == 0 else None
            if not (got["parts"] or found or alerts) and scored is None and done is None:
                continue
            for body in peers.chunks(got["parts"], found, alerts, scored, done):
                self._sends.append(
                    (self.topic, _KEY, wrap(self.key, self.topic, self.group, me, body, PEER_ENVELOPE, to=q), q)
                )

    def _changed(self, q: int, what: str, t: float | None) -> float | None:
        """``t`` when it is news for partition ``q`` (None: nothing to say)."""
        if t is None or t == -math.inf or self._sent.get((q, what)) == t:
            return None
        self._sent[(q, what)] = t
        return t

    def take_sends(self) -> list[Send]:
        """The messages for the other fleet partitions since the last call (the service sends
        them with the batch, before its offsets are committed)."""
        out, self._sends = self._sends, []
        return out

    def take_incidents(self) -> list[IncidentEvent]:
        """The incident events made since the last call (the service sends them with the batch)."""
        out, self._events = self._events, []
        return out

    def check(self, m: Message) -> list[DeadLetter]:
        """Apply message ``m`` to the stage if it is one the host stage wrote; otherwise (or for
        the records in it that are not) the dead letters saying why."""
        try:
            env = self._envelope.decode(m.value)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return [_dead(BAD_ENVELOPE, f"not a fleet-topic envelope: {e}", m, m.value)]
        if env.v not in (ENVELOPE_VERSION, PEER_ENVELOPE):
            return [
                _dead(
                    BAD_ENVELOPE,
                    f"envelope version {env.v} (this build reads {ENVELOPE_VERSION} and {PEER_ENVELOPE})",
                    m,
                    env.body,
                )
            ]
        if self.key is not None:
            if not env.mac:
                return [_dead(UNSIGNED, "unsigned; this service requires signed fleet messages", m, env.body)]
            # A shard's message names the partition it is for: a copy on another does not verify
            # (one shard's findings for lane L would otherwise shadow the receiver's own).
            to = (
                (self.stage.shard if isinstance(self.stage, ShardStage) else m.partition)
                if env.v == PEER_ENVELOPE
                else None
            )
            want = mac(self.key, self.topic, self.group, env.sender, env.body, env.v, to)
            if not hmac.compare_digest(env.mac, want):
                return [
                    _dead(
                        BAD_SIGNATURE,
                        f"MAC does not verify for partition {env.sender} of {self.group}/{self.topic} "
                        "under this service's key",
                        m,
                        env.body,
                    )
                ]
        sender = env.sender
        if env.v == PEER_ENVELOPE:
            return self._apply_peer(env.body, sender, m)
        if not 0 <= sender < self.n_upstream:
            return [
                _dead(
                    UNKNOWN_PARTITION,
                    f"sender {sender} is not a telemetry partition (0..{self.n_upstream - 1})",
                    m,
                    env.body,
                )
            ]
        body = env.body
        try:
            if body.startswith(ALERTS_PREFIX):
                return self._apply_alerts(self._alert_batch.decode(body), m, body)
            if body[:1] == b"{":
                return self._apply_mark(self._mark.decode(body), sender, m, body)
            if not COLUMNS_MAP(body[:1]):
                # JSON: a records array (the encoding of earlier builds), or not a body at all.
                recs = self._decode(body)
                check_other(recs)
                return self._apply_records(recs, sender, m)
            cols = Decoded(self._columns.decode(body))
        except Malformed as e:
            reason = {"version": BAD_ENVELOPE, "size": TOO_LARGE}.get(e.kind, WRONG_TYPE)
            return [_dead(reason, str(e), m, body)]
        except msgspec.ValidationError as e:
            return [_dead(WRONG_TYPE, str(e), m, body)]
        except msgspec.DecodeError as e:
            return [_dead(MALFORMED_JSON, str(e), m, body)]
        return self._apply_columns(cols, sender, m)

    def _apply_peer(self, body: bytes, sender: int, m: Message) -> list[DeadLetter]:
        """A message from the shard of fleet partition ``sender``: its cohort parts, findings
        and alerts, each checked before anything is applied (``peers.decode``)."""
        st = self.stage
        if not isinstance(st, ShardStage):
            return [_dead(BAD_ENVELOPE, "a message between model shards; this service runs none", m, body)]
        if not 0 <= sender < st.shards or sender == st.shard:
            why = f"sender {sender} is not another fleet partition (0..{st.shards - 1}, not {st.shard})"
            return [_dead(UNKNOWN_PARTITION, why, m, body)]
        try:
            msg = peers.decode(body, st.models, sender, st.shard, st.shards)
        except peers.PeerError as e:
            return [_dead(TOO_LARGE if e.kind == "size" else WRONG_TYPE, str(e), m, body)]
        dead: list[DeadLetter] = []
        if msg.alerts:
            dead += self._apply_alerts(AlertBatch(msg.alerts), m, body)
        st.accept_parts(sender, msg.parts)
        st.accept_findings(sender, msg.findings, msg.scored)
        if msg.done is not None:
            self.peer_done[sender] = msg.done
        return dead

    def _apply_mark(self, mk: Mark, sender: int, m: Message, body: bytes) -> list[DeadLetter]:
        why = self._refuse_mark(mk, sender)
        if why is not None:
            return [_dead(why[0], why[1], m, body)]
        st = self.stage
        if m.offset < st.replay_until and (mk.upto is None or mk.upto <= st.marks.get(mk.mark, -math.inf)):
            # Read again after a restore: the snapshot holds its effect, and its final flag
            # (which a mark read again would turn back) as it was then. (One past the snapshot's
            # mark is new, on a fleet topic made again since: it counts.)
            return []
        passed = st.stats["unresumed"]
        if isinstance(st, ShardStage):
            st.nccl_sent(mk.nccl)
        st.mark(mk.mark, -math.inf if mk.upto is None else mk.upto, mk.final, mk.n, hosts=mk.hosts)
        if st.stats["unresumed"] > passed:
            log.warning(
                "fleet: %d telemetry partition(s) not back %.0fs (event time) past the lull are passed "
                "as idle; what they send for released seconds is late to the models",
                st.stats["unresumed"] - passed,
                st.resume_wait,
            )
        if st.idle():
            # A lull (every telemetry partition idle): what the stage holds goes now, before any
            # record a task sends on resuming, wherever the batch of messages ends, and every
            # alert so far to the incident stage.
            got = st.advance()
            self._to_incidents(got, lull=True)
            self._lulls.extend(got)
            if st.resuming:
                log.info(
                    "fleet: every telemetry partition idle; released everything, waiting for partitions %s to resume",
                    sorted(st.resuming),
                    extra={"partitions": sorted(st.resuming)},
                )
        return []

    def _refuse_mark(self, mk: Mark, sender: int) -> tuple[str, str] | None:
        """Why a mark is refused (reason, detail), or None."""
        if mk.mark != sender:
            return BAD_MARK, f"mark for partition {_num(mk.mark)} sent by partition {sender}"
        if mk.n != self.n_upstream:
            return BAD_MARK, f"mark says {_num(mk.n)} telemetry partitions; this service has {self.n_upstream}"
        if mk.nccl is not None:
            shards = self.shard[1] if self.shard is not None else 0
            if len(mk.nccl) > shards or not all(type(q) is int and 0 <= q < shards for q in mk.nccl):
                return BAD_MARK, f"mark names NCCL partitions {mk.nccl[:8]} outside this service's {shards} shards"
        if mk.hosts is not None:
            why = self._refuse_hosts(mk.hosts, sender)
            if why is not None:
                return why
        return None if mk.upto is None else self._refuse_time(mk.upto, sender, "mark upto")

    def _refuse_hosts(self, hosts: dict[str, float], sender: int) -> tuple[str, str] | None:
        """Why a mark's hosts released ahead (``Mark.hosts``) are refused, or None: at most a
        partition's hosts (``engine.max_hosts``), names as long as an alert's, times as a mark's."""
        if len(hosts) > self.max_hosts:
            return BAD_MARK, f"mark names {len(hosts)} hosts ahead; at most {self.max_hosts} (engine.max_hosts)"
        for h, t in hosts.items():
            if not 0 < len(h) <= MAX_ALERT_TEXT:
                return BAD_MARK, f"mark names a host ahead of {len(h)} characters; 1..{MAX_ALERT_TEXT}"
            if not math.isfinite(t):
                return BAD_MARK, f"mark says host {h[:64]!r} is ahead to {t}, not finite"
        return self._refuse_time(max(hosts.values()), sender, "mark's host ahead to") if hosts else None

    def _refuse_time(self, t: float, sender: int, what: str) -> tuple[str, str] | None:
        """Why a time a mark says its sender released to is refused, or None."""
        if not math.isfinite(t):
            return BAD_MARK, f"{what} {t} is not finite"
        if not self.records or self.shard is not None or self.key is not None:
            # Rules only: no records to bound a mark by; the decoder's range bounds every time a
            # host-stage engine releases to. With model shards, a fleet partition gets only its
            # hosts' records, and none for long spells when they hash elsewhere or fall silent,
            # so those cannot bound a telemetry partition's progress either: the MAC does. And
            # signed, a mark is the host stage's own: a partition whose records stopped while
            # others went on (its NIC port records, which are not forwarded) releases truly
            # past its newest forwarded record, and refused, its marks held the whole fleet.
            if not TS_MIN <= t <= TS_MAX:
                return EARLY_MARK, f"{what} {t} outside {TS_MIN:.0f}..{TS_MAX:.0f}"
            return None
        newest = self.stage.forwarded.get(sender, -math.inf)
        if newest == -math.inf:
            return EARLY_MARK, f"{what} {t} from partition {sender}, which has forwarded no record"
        if t > newest + self.lead:
            return (
                EARLY_MARK,
                f"{what} {t} runs {t - newest:.3f}s past the newest record partition {sender} "
                f"forwarded; at most {self.lead}s (engine.allowed_lateness + engine.tick)",
            )
        return None

    def _apply_alerts(self, batch: AlertBatch, m: Message, body: bytes) -> list[DeadLetter]:
        if len(batch.alerts) > MAX_FORWARD_ALERTS:
            return [_dead(TOO_LARGE, f"{len(batch.alerts)} alerts; at most {MAX_FORWARD_ALERTS} a message", m, body)]
        dead: list[DeadLetter] = []
        good: list[AlertEvent] = []
        for i, a in enumerate(batch.alerts):
            why = _refuse_alert(a)
            if why is None:
                good.append(a)
                continue
            ts = a.ts if math.isfinite(a.ts) else None
            host = a.host[:MAX_ALERT_TEXT] if a.host is not None else None
            dead.append(_dead(why[0], why[1], m, encode(a), origin=f"{m.origin}#{i}", ts=ts, host=host))
        if self.incidents is not None:
            self.feed.add(good)
        return dead

    def _apply_columns(self, d: Decoded, sender: int, m: Message) -> list[DeadLetter]:
        """A columns body's records to the stage, but those outside the decoder's time range
        (``_apply_records``), which are dead letters."""
        dead: list[DeadLetter] = []
        n = d.n
        good = (d.ts >= TS_MIN) & (d.ts <= TS_MAX)
        for i in np.flatnonzero(~good).tolist():
            t = float(d.ts[i])
            dead.append(self._out_of_range(m, i, t, d.hosts[int(d.host[i])]))
        ots = np.fromiter(map(_TS, d.other), np.float64, len(d.other))
        ogood = (ots >= TS_MIN) & (ots <= TS_MAX)
        for j in np.flatnonzero(~ogood).tolist():
            dead.append(self._out_of_range(m, n + j, d.other[j].ts, d.other[j].host))
        if good.any():
            used = np.unique(d.host[good])
            self.senders.note([d.hosts[i] for i in used.tolist()], sender, float(d.ts[good].max()))
        recs, cols = self._build.build(d, good, ogood)
        if len(recs):
            pos = np.concatenate([np.flatnonzero(good), n + np.flatnonzero(ogood)])
            self._feed(recs, sender, m, np.concatenate([d.ts[good], ots[ogood]]), cols, pos)
        return dead

    @staticmethod
    def _out_of_range(m: Message, i: int, ts: float, host: str) -> DeadLetter:
        return _dead(
            TS_OUT_OF_RANGE,
            f"ts {ts} outside {TS_MIN:.0f}..{TS_MAX:.0f}",
            m,
            None,
            origin=f"{m.origin}#{i}",
            ts=ts,
            host=host,
        )

    def _feed(
        self,
        recs: Sequence[TelemetryRecord],
        sender: int,
        m: Message,
        ts: np.ndarray,
        cols: SortColumns | None = None,
        pos: np.ndarray | None = None,
    ) -> None:
        self.stage.feed(recs, at=m.offset, upstream=sender, ts=ts, cols=cols, origin=m.origin, pos=pos)
        self.totals.records += len(recs)

    def _apply_records(self, recs: list[TelemetryRecord], sender: int, m: Message) -> list[DeadLetter]:
        dead: list[DeadLetter] = []
        ts = np.fromiter(map(_TS, recs), np.float64, len(recs))
        pos = None
        if len(ts):
            # The host stage's decoder keeps event time in these bounds (pipeline/decode.py): a
            # record outside them was not forwarded by it, and would carry the marks' bound (and
            # the engine's clock) anywhere.
            bad = ~((ts >= TS_MIN) & (ts <= TS_MAX))
            if bad.any():
                for i in np.flatnonzero(bad).tolist():
                    dead.append(self._out_of_range(m, i, recs[i].ts, recs[i].host))
                recs = [r for r, b in zip(recs, bad.tolist()) if not b]
                ts, pos = ts[~bad], np.flatnonzero(~bad)
            # DCGM records of the engine's own type (records_decoder): all but NCCL and progress.
            dcgm_hosts = {r.host for r in recs if not isinstance(r, (NcclRecord, ProgressRecord))}
            if dcgm_hosts:
                self.senders.note(dcgm_hosts, sender, float(ts.max()))
        self._feed(recs, sender, m, ts, pos=pos)
        return dead

    def take(self, stat: str) -> int:
        """How much the fleet stage's counter ``stat`` (``FleetStage.stats``) grew since the last
        call: the service's metrics are counters fed these increments."""
        return self._since(stat, self.stage.stats[stat])

    def _since(self, key: str, now: int) -> int:
        """How much the counter ``key``, now ``now``, grew since it was last taken."""
        n = now - self._taken.get(key, 0)
        self._taken[key] = now
        return n

    def take_incident_drops(self) -> dict[str, int]:
        """How many alerts the incident side dropped since the last call, by why: before the
        incident stage (``AlertFeed``: late, for a second it released; duplicate; bad_ts) and in
        it (``IncidentStage``: too_many_open, too_many_firing, bad_alert, bad_state). Empty
        with incidents off.

        >>> from pipeline.engine import Engine
        >>> FleetTask(lambda: Engine(screened=True), 1).take_incident_drops()  # incidents off
        {}
        """
        if self.incidents is None:
            return {}
        now = {why: self.feed.stats[why] for why in FEED_DROPPED}
        for key, n in self.incidents.stats.items():
            if key.startswith(_STAGE_DROPPED):
                now[key.removeprefix(_STAGE_DROPPED)] = n
        out = {why: self._since("incidents." + why, n) for why, n in now.items()}
        return {why: n for why, n in out.items() if n}

    def flush(self) -> EngineOutput:
        # Idle is no reason to release here: only the marks say when every host has been heard.
        return self.stage.advance()

    @property
    def pending(self) -> int:
        """Nothing an idle flush could release: only the marks say when every host was heard."""
        return 0

    def checkpoint_offset(self, next_offset: int) -> int:
        """Where a checkpoint taken now resumes: at the oldest message whose records the stage
        still holds back, which its snapshot leaves out (``FleetStage.snapshot``)."""
        at = self.stage.resume_at()
        return next_offset if at is None else min(at, next_offset)

    def snapshot(self) -> bytes:
        """The stage's state without the records it holds back (``checkpoint_offset``); with
        incidents, beside the incident stage's and its feed's (the alerts it buffers: few, so
        they ride in the checkpoint rather than being read again)."""
        stage = self.stage.snapshot(replayable=True)
        if self.incidents is None and self.shard is None:
            return stage
        d: dict[str, Any] = {"fleet_task": TASK_STATE_VERSION, "stage": stage}
        if self.incidents is not None:
            d.update(incidents=self.incidents.to_state(), feed=self.feed.to_state())
        if self.shard is not None:
            d["peer_done"] = {str(q): t for q, t in self.peer_done.items()}
        return msgspec.msgpack.encode(d)

    def restore(self, blob: bytes) -> None:
        """Continue where ``snapshot`` left off; ``StateError`` when the blob is not one. A
        stage's snapshot alone (written with incidents off) restores with no open incidents."""
        try:
            d = msgspec.msgpack.decode(blob)
            if isinstance(d, dict) and "fleet_task" in d:
                if d["fleet_task"] != TASK_STATE_VERSION:
                    raise StateError(f"fleet task state version {d['fleet_task']!r} (this build reads 1)")
                if self.incidents is not None and "incidents" in d:
                    self.incidents.load_state(d["incidents"])
                    self.feed.load_state(d["feed"])
                self.peer_done = {int(q): float(t) for q, t in d.get("peer_done", {}).items()}
                blob = d["stage"]
            self.stage.restore(blob, self._decode)
        except StateError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged checkpoint costs its partition, as the host stage's
            raise StateError(f"cannot restore the fleet stage: {e}") from e


def incident_sends(topic: str, events: Sequence[IncidentEvent]) -> list[Send]:
    """Incident events as messages for ``<prefix>.incidents``, keyed by host as alerts are."""
    return [(topic, (e.host or "").encode(), encode(e), None) for e in events]


def _refuse_alert(a: AlertEvent) -> tuple[str, str] | None:
    """Why a forwarded alert is refused (reason, detail), or None: what the host stage's engine
    makes is a firing or resolved event in the decoder's time range with short names."""
    if a.state not in ALERT_STATES:
        return BAD_ALERT, f"state {a.state[:64]!r} is not firing or resolved"
    if not (math.isfinite(a.ts) and TS_MIN <= a.ts <= TS_MAX):
        return TS_OUT_OF_RANGE, f"alert ts {a.ts} outside {TS_MIN:.0f}..{TS_MAX:.0f}"
    if not math.isfinite(a.started_at):
        return BAD_ALERT, f"started_at {a.started_at} is not finite"
    if not a.id:
        return BAD_ALERT, "empty id"
    for name in ("id", "rule", "fault", "severity", "host", "job"):
        v = getattr(a, name)
        if v is not None and len(v) > MAX_ALERT_TEXT:
            return BAD_ALERT, f"{name} of {len(v)} characters; at most {MAX_ALERT_TEXT}"
    if a.gpu is not None and not 0 <= a.gpu < 4096:
        return BAD_ALERT, f"gpu {_num(a.gpu)} outside 0..4095"
    if a.link is not None and not 0 <= a.link < 1024:
        return BAD_ALERT, f"link {_num(a.link)} outside 0..1023"
    if len(a.summary) > MAX_ALERT_SUMMARY:
        return BAD_ALERT, f"summary of {len(a.summary)} characters; at most {MAX_ALERT_SUMMARY}"
    if len(a.evidence) > MAX_ALERT_ITEMS or len(a.labels) > MAX_ALERT_ITEMS:
        return BAD_ALERT, f"more than {MAX_ALERT_ITEMS} evidence or label entries"
    return None


def _num(x: int) -> str:
    """An integer from a message for a detail: a huge one by its size (its digits could be
    thousands, past what ``str`` converts)."""
    return str(x) if -(10**18) < x < 10**18 else f"<an integer of {x.bit_length()} bits>"


def _dead(
    reason: str,
    detail: str,
    m: Message,
    raw: bytes | None,
    *,
    origin: str | None = None,
    ts: float | None = None,
    host: str | None = None,
) -> DeadLetter:
    """A fleet-topic message (or one record of it) refused, with its origin and up to 2 KiB of it."""
    text = None
    if raw is not None:
        text = raw[:RAW_KEEP].decode("utf-8", "replace") + ("…" if len(raw) > RAW_KEEP else "")
    return DeadLetter(reason=reason, detail=detail[:RAW_KEEP], origin=origin or m.origin, raw=text, ts=ts, host=host)
