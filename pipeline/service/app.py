"""``gpuwarden serve``: the long-running consumer-group service around the engine.

Per assigned telemetry partition there is one engine (a partition holds whole hosts: messages
are keyed by host). The commit protocol (docs/operations.md, How it keeps its promises):

1. poll a batch and run each partition's share through its engine;
2. send the alerts and dead letters and wait until the broker acknowledged every one;
3. on the partition's cadence (``service.checkpoint_interval_s`` or ``checkpoint_records``) and
   always on revoke, idle flush and shutdown: checkpoint its engine, with the offset of the next
   message, to the state store, and wait for the acknowledgement;
4. only then commit that partition's offset: a committed offset always has a checkpoint.

A crash replays what each partition received after its last checkpoint: on assignment its
engine is restored from the checkpoint and the consumer seeks to the checkpoint's offset.
Alerts sent again carry the same deterministic ids, so consumers deduplicate by id.

The consumer, producer and state store come in by injection (``Service(cfg, consumer=...,
producer=..., state=...)``): Kafka in production (``Service.kafka``), the in-memory bus in the
unit tests of this protocol (tests/unit/service/).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.bus.base import Message, Producer, Topics
from pipeline.bus.group import GroupConsumer, KafkaGroupConsumer
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from pipeline.bus.retry import Backoff, is_retriable, retry
from pipeline.bus.sinks import BusOutput, OutputSink
from pipeline.decode import Decoder
from pipeline.detection import build_detector
from pipeline.engine import EngineOutput
from pipeline.errors import BusError, DeliveryError, StateError
from pipeline.rules import load_rules
from pipeline.rules.reload import fingerprint
from pipeline.runner import Pipeline
from pipeline.service.config import Config
from pipeline.service.fleet import DROPPED, FORCED, FleetTask, Outbox, Send
from pipeline.httpendpoint import HttpEndpoint
from pipeline.service.metrics import Metrics
from pipeline.service.state import Checkpoint, KafkaStateStore, StateStore, derived_key, state_key
from pipeline.topology import Topology

log = logging.getLogger("gpuwarden.service")
STATE_MAX_BYTES = 64 * 1024 * 1024  # the state topic's max.message.bytes (pipeline.bus.kafka.ensure_topics)
POLL_TIMEOUT_S = 0.5
# A quiet poll's wait when stages share the loop: a stage blocked in its poll cannot see the other
# stage's input, which waits for it; at 0.25 s each this was the 2,048-GPU latency's p99 (0.56-0.67
# s against 0.17-0.26 s at 0.05, docs/performance.md). 20 empty polls a second cost next to nothing.
SHARED_POLL_TIMEOUT_S = 0.05
STAGES = ("host", "fleet")  # docs/operations.md, "Topology"


@dataclass
class PartitionState:
    partition: int
    pipe: Any  # Pipeline (host stage) or FleetTask (fleet stage)
    next_offset: int | None = None  # of the next message to process
    saved_offset: int | None = None  # next_offset of the last checkpoint written
    dirty: bool = False  # engine state changed since the last checkpoint
    since_saved: int = 0  # records processed since the last checkpoint
    # Service clock of the last checkpoint; -inf: none yet since the assignment, so the first
    # batch is checkpointed at once. That puts this owner's epoch on the state topic early (a
    # previous owner's late checkpoint cannot win, pipeline/service/state.py) and bounds what a
    # crash soon after a (re)start replays, when restarts come in a row.
    last_saved: float = -math.inf
    last_input: float = 0.0


class Service:
    """One ``serve`` replica: a group member, its engines, its outputs and its checkpoints."""

    def __init__(
        self,
        cfg: Config,
        *,
        consumer: GroupConsumer | None = None,
        producer: Producer | None = None,
        state: StateStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
        stage: str = "host",
        upstream: int | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """Without ``consumer``, ``producer`` and ``state``: all three on the Kafka of ``cfg.kafka``.

        ``stage``: ``host`` consumes the telemetry topic (rules, absence; with models it forwards
        to the fleet topic), ``fleet`` the fleet topic (the models). ``upstream``: the telemetry
        topic's partition count (each fleet partition waits for the marks of that many)."""
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r}: one of {', '.join(STAGES)}")
        self.stage = stage
        self._what = "partition" if stage == "host" else "fleet partition"  # in its log lines
        rules_checked: int | None = None
        if consumer is None and producer is None and state is None:
            consumer, producer, state, rules_checked = kafka_parts(cfg, stage)
        if consumer is None or producer is None or state is None:
            raise TypeError("Service: give consumer, producer and state together, or none of them")
        self.cfg = cfg
        self.topics = Topics(cfg.kafka.prefix)
        count = getattr(producer, "partition_count", lambda topic: None)
        # As the cluster has them (the topic may predate this config): how many telemetry
        # partitions mark the fleet stage, which refuses a mark naming another count or partition.
        self.upstream = upstream or count(self.topics.telemetry) or cfg.kafka.partitions
        self.rule_paths = [str(Path(p)) for p in cfg.service.rules]
        self.clock = clock
        self.backoff = backoff or Backoff()
        self._n_rules = _check_rules_load(self.rule_paths) if rules_checked is None else rules_checked
        self._rules_fp = fingerprint(self.rule_paths)
        self.consumer, self.producer, self.state = consumer, producer, state
        # The fleet topic's messages are signed under a key of their own, derived from the state
        # key (None with --insecure-state: unsigned, still validated; pipeline/service/fleet.py).
        self.fleet_key = derived_key(getattr(state, "mac_key", None), "fleet")
        # Alerts and dead letters leave through the injected producer; the sink's flush is step 2
        # of the commit protocol (it returns only once every send was acknowledged).
        self.output: OutputSink = BusOutput(producer, self.topics)
        self.parts: dict[int, PartitionState] = {}
        self.metrics = metrics or Metrics()
        phase = self.metrics.loop_seconds.labels
        self._phase_poll, self._phase_process, self._phase_deliver = phase("poll"), phase("process"), phase("deliver")
        self._phase_checkpoint, self._phase_commit = phase("checkpoint"), phase("commit")
        self.state.on_reject = lambda reason: self.metrics.state_skipped.labels(reason).inc()
        self._stop = False
        self.poll_timeout = POLL_TIMEOUT_S
        self.got_input = False  # the last poll returned messages
        self.max_poll = max_poll(cfg, stage)
        self._reload_requested = False
        now = clock()
        self._grid0 = now
        self._last_poll = now
        self._idle_asked = -math.inf  # when _flush_idle last asked the broker for end offsets
        self._last_reload_check = now
        self._last_lag = 0.0
        self.http: HttpEndpoint | None = None
        self.batches = 0
        self.totals: Counter[str] = Counter()
        self.consumer.subscribe(self._assigned, self._revoked, self._lost)

    @classmethod
    def kafka(cls, cfg: Config) -> "Service":
        """The service on the Kafka cluster of ``cfg.kafka`` (what ``gpuwarden serve`` runs)."""
        return cls(cfg)

    # -- set-up --------------------------------------------------------------------------------

    def _new_engine(self, partition: int) -> Any:
        """The host stage's engine of a partition (with models: a ``Topology`` whose fleet side
        is an ``Outbox`` to the fleet topic), or the fleet stage's task."""
        engine, diags = build_detector(self.rule_paths, self.cfg.service.models, self.cfg.engine_config())
        if engine is None:  # checked at start-up; a file broken since then keeps the old set elsewhere
            raise StateError("; ".join(str(d) for d in diags if d.is_error))
        if self.stage == "fleet":
            if not isinstance(engine, Topology):
                raise StateError("the fleet stage runs the models, and none are configured (service.models)")
            return FleetTask(
                engine.make_fleet_engine,
                self.upstream,
                max_buffer=self.cfg.service.fleet_max_buffer,
                topic=self.topics.fleet,
                group=self.cfg.kafka.group,
                key=self.fleet_key,
            )
        if isinstance(engine, Topology):
            make = engine.make_fleet_engine
            outbox = Outbox(
                partition, self.upstream, self.topics.fleet, make, group=self.cfg.kafka.group, key=self.fleet_key
            )
            engine = Topology(engine.host, make, fleet=outbox)
        # A host's rows of a tick go once the host is complete for it, not once every host of the
        # partition is: the same alerts, up to a second sooner (docs/architecture.md §4, release).
        (engine.host if isinstance(engine, Topology) else engine).release_hosts = True
        return engine

    def _task(self, partition: int) -> Any:
        eng = self._new_engine(partition)
        return eng if isinstance(eng, FleetTask) else Pipeline(eng, _decoder())

    @property
    def forwards(self) -> bool:
        """Whether this host stage sends to the fleet topic (models are configured)."""
        return self.stage == "host" and models_on(self.cfg)

    # -- group membership (called inside consumer.poll / close, see pipeline/bus/group.py) ------

    def _assigned(self, partitions: list[int]) -> None:
        try:
            saved = self.state.load(partitions)
        except (StateError, BusError) as e:
            log.error("state: cannot read checkpoints (%s); starting those partitions fresh", e)
            saved = {}
            self.state.unread(partitions)
        except Exception as e:  # noqa: BLE001 - the client's own errors (kafka-python) mean the same
            log.error("state: cannot read checkpoints (%s: %s); starting those partitions fresh", type(e).__name__, e)
            saved = {}
            self.state.unread(partitions)
        now = self.clock()
        for p in partitions:
            # No wall clock: one engine sees one partition, whose messages arrive in the order they
            # were produced, so pure event time applies -- the same alerts as a file replay.
            ps = PartitionState(p, self._task(p), last_input=now)
            cp = saved.get(p)
            if cp is not None:
                try:
                    ps.pipe.engine.restore(cp.engine)
                    ps.next_offset = ps.saved_offset = cp.next_offset
                    self.consumer.seek(p, cp.next_offset)
                    log.info(
                        self._what + " %d: state restored, resuming at offset %d",
                        p,
                        cp.next_offset,
                        extra={"partition": p, "offset": cp.next_offset},
                    )
                except StateError as e:
                    log.error(
                        self._what + " %d: checkpoint unusable (%s); starting fresh from the committed offset",
                        p,
                        e,
                        extra={"partition": p},
                    )
                    ps = PartitionState(p, self._task(p), last_input=now)
            else:
                log.info(
                    self._what + " %d: no checkpoint, starting from the committed offset", p, extra={"partition": p}
                )
            self.parts[p] = ps
        if self.stage == "host":
            self.metrics.partitions.set(len(self.parts))

    def _revoked(self, partitions: list[int]) -> None:
        # The group hands these partitions on only after this returns (pipeline/bus/group.py), so
        # the checkpoint written here is the one the next owner restores. No offset commit: a
        # blocking consumer call cannot run inside the rebalance, and the checkpoint carries the
        # position, which the next owner seeks to.
        mine = [self.parts[p] for p in partitions if p in self.parts]
        self._checkpoint([ps for ps in mine if ps.dirty], "revoke", commit=False)
        self._drop(partitions, "revoked")

    def _lost(self, partitions: list[int]) -> None:
        # Evicted from the group: another member may already own them and have restored the last
        # checkpoint, so this replica's newer state is discarded, not written over its work.
        self._drop(partitions, "lost")

    def _drop(self, partitions: list[int], how: str) -> None:
        for p in partitions:
            self.parts.pop(p, None)
        log.info(self._what + "s %s: %s", how, partitions, extra={"partitions": partitions})
        if self.stage == "host":
            self.metrics.partitions.set(len(self.parts))

    # -- the loop ------------------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def request_reload(self, *_: Any) -> None:
        self._reload_requested = True

    def health(self) -> tuple[bool, dict]:
        age = self.clock() - self._last_poll
        return age < 30.0, {"last_poll_s": round(age, 2), "partitions": sorted(self.parts), "batches": self.batches}

    def run(self, *others: "Service") -> int:
        """The replica's loop: this stage and ``others`` (the fleet stage beside the host stage,
        as ``serve`` runs them by default), one turn of each in turn, one HTTP endpoint."""
        services = [self, *others]

        def stop(*_: Any) -> None:
            for s in services:
                s.request_stop()

        def reload(*_: Any) -> None:
            for s in services:
                s.request_reload()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)
        quiet_wait = POLL_TIMEOUT_S if len(services) == 1 else SHARED_POLL_TIMEOUT_S
        self.metrics.rules.set(self._n_rules)
        self.http = HttpEndpoint(self.cfg.http.host, self.cfg.http.port, self.metrics.registry, self.health).start()
        log.info(
            "serving: %s -> %s, %s; http on %s:%d; stages %s",
            self.topics.telemetry,
            self.topics.alerts,
            self.topics.dlq,
            self.cfg.http.host,
            self.http.port,
            "+".join(s.stage for s in services),
            extra={"http_port": self.http.port, "stages": [s.stage for s in services]},
        )
        try:
            failures = [0] * len(services)
            busy = False
            while not self._stop:
                # Several stages in one loop: none may sit in an empty poll while another has
                # input. While any stage got messages in the last round, every poll only takes
                # what is already fetched (a fleet poll waiting its timeout out each turn cost a
                # backlog ~2/3 of its time: docs/performance.md); once all are quiet, each waits
                # SHARED_POLL_TIMEOUT_S.
                for s in services:
                    s.poll_timeout = 0.0 if busy else quiet_wait
                busy = False
                for i, s in enumerate(services):
                    failures[i] = s.step(failures[i])
                    busy = busy or s.got_input
            for s in services:  # the host stage first: its last marks reach the fleet stage's topic
                s.shutdown()
        except BaseException:
            # Not a checkpoint of state in an unknown condition: leave, and let the next owner
            # replay from the last good checkpoint.
            for s in services:
                s._close()
            raise
        finally:
            if self.http:
                self.http.stop()
        return 0

    def step(self, failures: int = 0) -> int:
        """One turn of the loop: poll, process, deliver, and whatever is due. Returns the number
        of polls in a row that failed (0 after one that worked), for the back-off."""
        t = time.perf_counter()
        self.got_input = False
        try:
            batch = self.consumer.poll(self.poll_timeout, self.max_poll)
        except BusError as e:
            # Whatever the broker says (restarting, leader moving, group coordinator gone), the
            # same poll is tried again, ever more slowly: the service rides out an outage.
            log.warning("poll failed (%s); retrying", e)
            self.backoff.wait(failures)
            return failures + 1
        self._last_poll = self.clock()
        self._phase_poll.inc(time.perf_counter() - t)
        self.got_input = bool(batch)
        if batch:
            self._process(batch)
        self._flush_idle()
        self._checkpoint_due()
        self._maybe_reload()
        self._update_lag()
        return 0

    def _process(self, batch: dict[int, list[Message]]) -> None:
        t0 = time.perf_counter()
        outputs: list[EngineOutput] = []
        sends: list[Send] = []
        n = n_records = 0
        now = self.clock()
        for p, msgs in batch.items():
            ps = self.parts.get(p)
            if ps is None:  # pragma: no cover - a group consumer only returns assigned partitions
                continue
            before = ps.pipe.totals.records
            outputs.append(ps.pipe.handle_guarded(msgs))
            sends += _outbox(ps)
            done = ps.pipe.totals.records - before
            n += len(msgs)
            n_records += done
            ps.next_offset = msgs[-1].offset + 1
            ps.since_saved += done
            ps.dirty = True
            ps.last_input = now
        t1 = time.perf_counter()
        self._phase_process.inc(t1 - t0)
        self._deliver(outputs, sends)
        self.batches += 1
        dt = time.perf_counter() - t0
        if self.stage == "fleet":
            for ps in self.parts.values():
                self.metrics.fleet_records.inc(ps.pipe.take("released"))
                self.metrics.fleet_forced.inc(ps.pipe.take(FORCED))
                for why in DROPPED:
                    self.metrics.fleet_dropped.labels(why).inc(ps.pipe.take(why))
        if self.stage == "host":  # telemetry records; the fleet stage's are the same ones again
            self.metrics.batch_seconds.observe(dt)
            self.metrics.records.inc(n_records)
            self.metrics.records_per_s.set(n_records / dt if dt > 0 else 0)
        self.totals["messages"] += n

    def _deliver(self, outputs: list[EngineOutput], sends: list[Send] | None = None) -> None:
        """Send every alert and dead letter of the batch, and what the host stage forwards to the
        fleet stage; return only once all were acknowledged."""
        if not sends and not any(out.alerts or out.dead for out in outputs):
            return
        t0 = time.perf_counter()

        def send_and_flush() -> None:
            # Sent again whole on a retry: the fleet stage drops records it has (pipeline/topology.py)
            # and a mark says the same the second time.
            for topic, key, value, partition in sends or ():
                self.producer.send(topic, value, key, partition)
            for out in outputs:
                self.output.alerts(out.alerts)
                self.output.dead(out.dead)
            self.output.flush()

        def again(attempt: int, e: BaseException) -> None:
            self.metrics.delivery_retries.inc()
            log.warning("delivery failed (attempt %d, %s); re-sending the batch's output", attempt, e)

        try:
            retry(send_and_flush, self.backoff, retriable=_retriable_delivery, on_retry=again)
        except DeliveryError as e:
            # Sending it again cannot help (e.g. over the broker's size limit): say so loudly,
            # with everything that was in the batch, and move on rather than stall forever.
            self.metrics.delivery_retries.inc()
            log.error("delivery refused by the broker (%s); the batch's alerts follow in this log", e)
        self._phase_deliver.inc(time.perf_counter() - t0)
        for out in outputs:
            for a in out.alerts:
                self.metrics.alerts.labels(a.family, a.state).inc()
                log.info(
                    "alert %s %s %s %s/%s: %s",
                    a.state,
                    a.fault,
                    a.id,
                    a.host,
                    a.gpu,
                    a.summary,
                    extra={"alert_id": a.id, "fault": a.fault, "state": a.state, "host": a.host, "gpu": a.gpu},
                )
            for d in out.dead:
                self.metrics.dead.labels(d.reason).inc()
                log.warning(
                    "dead letter %s at %s: %s",
                    d.reason,
                    d.origin,
                    d.detail,
                    extra={"reason": d.reason, "origin": d.origin, "dlq_action": d.action},
                )

    def _checkpoint_due(self) -> None:
        now = self.clock()
        svc = self.cfg.service
        why: dict[int, str] = {}
        for ps in self.parts.values():
            if not ps.dirty:
                continue
            if ps.last_saved == -math.inf:
                why[ps.partition] = "first"
            elif ps.since_saved >= svc.checkpoint_records:
                why[ps.partition] = "records"
            elif now - ps.last_saved >= svc.checkpoint_interval_s:
                why[ps.partition] = "interval"
        # One round for every partition due: one wait for the broker and one offset commit.
        self._checkpoint([self.parts[p] for p in why], why)

    def _on_grid(self, t: float) -> float:
        """``t`` rounded down to the checkpoint grid (multiples of the interval since start-up):
        partitions saved in different turns of the loop fall due in the same one later."""
        step = self.cfg.service.checkpoint_interval_s
        return t - (t - self._grid0) % step

    def _checkpoint(self, parts: list[PartitionState], why: str | dict[int, str], commit: bool = True) -> bool:
        """Write the checkpoints of ``parts``, wait for the broker, then commit their offsets.

        ``why``: the reason, or each partition's (the metric's label). False (and nothing
        committed) when the broker refused them: each partition's previous checkpoint stays
        valid (it carries its own offset), so a restart replays more, losing nothing, and it is
        tried again on the cadence."""
        offsets = {
            ps.partition: ps.pipe.checkpoint_offset(ps.next_offset) for ps in parts if ps.next_offset is not None
        }
        parts = [ps for ps in parts if ps.partition in offsets]
        if not parts:
            return True
        saved: list[tuple[PartitionState, int]] = []
        t0 = time.perf_counter()

        def save_and_flush() -> None:
            saved.clear()
            for ps in parts:
                t = time.perf_counter()
                self.state.save(Checkpoint(ps.partition, offsets[ps.partition], ps.pipe.engine.snapshot()))
                self.metrics.checkpoint_seconds.observe(time.perf_counter() - t)
                saved.append((ps, offsets[ps.partition]))
            self.state.flush()

        def again(attempt: int, e: BaseException) -> None:
            log.warning("checkpoint failed (attempt %d, %s); retrying", attempt, e)

        try:
            retry(save_and_flush, self.backoff, retriable=_retriable_delivery, on_retry=again)
        except DeliveryError as e:
            self.metrics.checkpoint_failures.inc()
            log.error("checkpoint refused by the broker (%s); keeping the previous one", e)
            now = self._on_grid(self.clock())
            for ps in parts:  # tried again on the cadence, not on every turn of the loop
                ps.last_saved, ps.since_saved = now, 0
            return False
        self._phase_checkpoint.inc(time.perf_counter() - t0)
        now = self._on_grid(self.clock())
        for ps, offset in saved:
            ps.saved_offset, ps.dirty, ps.since_saved, ps.last_saved = offset, False, 0, now
        reasons = {ps.partition: why if isinstance(why, str) else why[ps.partition] for ps, _ in saved}
        for reason in reasons.values():
            self.metrics.checkpoints.labels(reason).inc()
        label = "+".join(sorted(set(reasons.values())))
        log.debug(
            "checkpointed partitions %s (%s)",
            sorted(reasons),
            label,
            extra={"partitions": sorted(reasons), "why": label},
        )
        if commit:
            self._commit({ps.partition: offset for ps, offset in saved})
        return True

    def _commit(self, offsets: dict[int, int]) -> None:
        t0 = time.perf_counter()
        try:
            self.consumer.commit(offsets)
            self._phase_commit.inc(time.perf_counter() - t0)
        except BusError as e:
            # Not fatal: the checkpoint already holds the position; the next commit catches up.
            self.metrics.commit_failures.inc()
            log.warning("offset commit failed (%s); the checkpoint holds the position", e)

    def _flush_idle(self) -> None:
        now = self.clock()
        # A host-stage task forwarding to the fleet stage also says, once idle, that it holds
        # nothing back (a final mark), even with nothing buffered: a telemetry partition no host
        # writes to must not hold the fleet stage for ever.
        idle = [
            ps
            for ps in self.parts.values()
            if (ps.pipe.engine.pending or _holds_fleet(ps)) and now - ps.last_input > self.cfg.service.flush_idle_s
        ]
        if not idle:
            return
        # Idle means nothing left to read, not nothing read lately: a loop slowed by a backlog
        # (or by the fleet stage beside it) must not flush a partition whose records are waiting,
        # which would make them late. Asking is a round trip to the broker, so at most once a
        # second (a loop turn each time cost a backlog's last seconds ~0.1 s a turn).
        if now - self._idle_asked < min(1.0, self.cfg.service.flush_idle_s):
            return
        self._idle_asked = now
        try:
            end = self.consumer.end_offsets([ps.partition for ps in idle])
        except BusError:
            return
        idle = [ps for ps in idle if end.get(ps.partition, 0) <= (ps.next_offset or 0)]
        if not idle:
            return
        outputs = [ps.pipe.flush() for ps in idle]
        sends = [s for ps in idle for s in _outbox(ps)]
        for ps in idle:
            ps.dirty = True
        self._deliver(outputs, sends)
        self._checkpoint(idle, "idle")

    def _maybe_reload(self) -> None:
        now = self.clock()
        if not self._reload_requested and now - self._last_reload_check < self.cfg.service.reload_check_s:
            return
        self._last_reload_check = now
        fp = fingerprint(self.rule_paths)
        if not self._reload_requested and fp == self._rules_fp:
            return
        self._reload_requested = False
        self._rules_fp = fp
        if self.stage == "fleet":
            return  # the fleet stage runs the models only; a models.yaml change needs a restart
        tick = self.cfg.engine_config().tick
        # As pipeline/rules/reload.py: nothing a rule file holds may stop the service; a failure
        # of any kind is a refused reload and every engine keeps the rules it had.
        try:
            ruleset, diags = load_rules(self.rule_paths, tick=tick)
            for d in diags:
                (log.error if d.is_error else log.warning)("rules: %s", d)
            if ruleset is not None:
                models = {m for ps in self.parts.values() if ps.pipe.engine.models for m in ps.pipe.engine.models.names}
                fresh = {p: load_rules(self.rule_paths, tick=tick, models=models or None)[0] for p in self.parts}
                if any(r is None for r in fresh.values()):
                    ruleset = None
                else:
                    for p, ps in self.parts.items():
                        ps.pipe.engine.set_rules(fresh[p])
        except Exception:  # noqa: BLE001 - load_rules refuses bad input itself; this is the backstop
            log.exception("rules: reload failed")
            ruleset = None
        if ruleset is None:
            self.metrics.reload_failures.inc()
            log.error("rules: reload refused; still running the previous rules")
            return
        self._n_rules = len(ruleset)
        self.metrics.rules.set(len(ruleset))
        log.warning("rules: reloaded %d rule(s)", len(ruleset))

    def _update_lag(self) -> None:
        now = self.clock()
        if now - self._last_lag < 5.0 or not self.parts:
            return
        self._last_lag = now
        try:
            end = self.consumer.end_offsets(list(self.parts))
        except BusError:
            return
        for p, e in end.items():
            ps = self.parts.get(p)
            if ps is not None and ps.next_offset is not None:
                self.metrics.lag.labels(str(p) if self.stage == "host" else f"fleet/{p}").set(
                    max(0, e - ps.next_offset)
                )

    def shutdown(self) -> None:
        """Checkpoint and commit every partition with new input, then leave the group."""
        self._checkpoint([ps for ps in self.parts.values() if ps.dirty], "shutdown")
        log.info(
            "stopping: leaving the group",
            extra={"batches": self.batches, "messages": self.totals["messages"], "stage": self.stage},
        )
        self._close()

    def _close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.output.close()


def _outbox(ps: PartitionState) -> list[Send]:
    fleet = getattr(ps.pipe.engine, "fleet", None)
    return fleet.take() if isinstance(fleet, Outbox) else []


def _holds_fleet(ps: PartitionState) -> bool:
    fleet = getattr(ps.pipe.engine, "fleet", None)
    return isinstance(fleet, Outbox) and not fleet.final_sent()


def max_poll(cfg: Config, stage: str) -> int:
    """Messages a poll may return: a fleet-topic message holds up to MAX_FORWARD records, so that
    stage takes fewer of them per turn (the turn of the host stage beside it waits for it)."""
    n = cfg.kafka.max_poll_records
    return n if stage == "host" else max(4, n // 20)


def models_on(cfg: Config) -> bool:
    """Whether the service's rules run with models (then a fleet stage runs them)."""
    from pipeline.detection import models_path

    return models_path([str(Path(p)) for p in cfg.service.rules], cfg.service.models) is not None


def kafka_parts(cfg: Config, stage: str = "host") -> tuple[GroupConsumer, Producer, StateStore, int]:
    """Consumer, producer and state store on the Kafka cluster of ``cfg.kafka`` for ``stage``,
    and the rule count. The fleet stage is its own consumer group (``<group>.fleet``) on the
    fleet topic, with its own checkpoints in the state topic."""
    k = cfg.kafka
    topics = Topics(k.prefix)
    source = topics.telemetry if stage == "host" else topics.fleet
    group = k.group if stage == "host" else f"{k.group}.fleet"
    security = k.security.options()
    # Before anything else: no key (and no --insecure-state) is a refusal to start, not a
    # service that trusts whatever the state topic holds (docs/operations.md, Security).
    mac_key = state_key(os.environ, cfg.service.insecure_state)
    if mac_key is None:
        log.warning(
            "INSECURE STATE: GPUWARDEN_STATE_KEY is not set and --insecure-state is on; checkpoints are "
            "unsigned and anyone who can write %s can feed the engines a forged history",
            topics.state,
            extra={"insecure_state": True},
        )
    n_rules = _check_rules_load([str(Path(p)) for p in cfg.service.rules])
    ensure_topics(k.bootstrap, topics, partitions=k.partitions, security=security)
    producer = KafkaBusProducer(
        k.bootstrap, security=security, client_id="gpuwarden-service", max_request_size=STATE_MAX_BYTES
    )
    state = KafkaStateStore(
        k.bootstrap,
        topics.state,
        group,
        source,
        producer,
        security,
        key=mac_key,
        max_bytes=cfg.service.state_max_mib << 20,
    )
    consumer = KafkaGroupConsumer(
        k.bootstrap,
        source,
        group,
        security=security,
        client_id=f"gpuwarden-service-{stage}",
        auto_offset_reset="earliest",
        max_poll_records=max_poll(cfg, stage),
        max_poll_interval_ms=k.max_poll_interval_ms,
        session_timeout_ms=k.session_timeout_ms,
        fetch_max_bytes=k.fetch_max_bytes,
        max_partition_fetch_bytes=k.max_partition_fetch_bytes,
    )
    return consumer, producer, state, n_rules


def _retriable_delivery(e: BaseException) -> bool:
    return isinstance(e, DeliveryError) and is_retriable(e)


def _check_rules_load(paths: list[str]) -> int:
    """The number of rules; ``SystemExit`` naming the files when they do not load."""
    ruleset, diags = load_rules(paths)
    for d in diags:
        (log.error if d.is_error else log.warning)("rules: %s", d)
    if ruleset is None:
        raise SystemExit(f"gpuwarden serve: rules in {', '.join(paths)} do not load")
    return len(ruleset)


# Event time further ahead of the service's wall clock than this is ts_out_of_range (a producer
# whose clock is wrong). No bound on age: a recording replayed into the topic is old by nature.
MAX_FUTURE_S = 300.0


def _decoder() -> Decoder:
    return Decoder(wall_clock=time.time, max_future_s=MAX_FUTURE_S, max_age_s=math.inf)


def setup_logging(level: str = "INFO") -> None:
    """JSON lines on stderr: every problem record names its topic[partition]@offset."""
    from pythonjsonlogger.json import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level", "asctime": "time"}
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kafka").setLevel(logging.ERROR)
