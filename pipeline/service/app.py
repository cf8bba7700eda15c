"""``gpuwarden serve``: the long-running Kafka consumer-group service around the engine.

Per assigned telemetry partition there is one engine (a partition holds whole hosts: messages
are keyed by host). Per batch, in this order (the commit protocol):

1. poll a batch and run each partition's share through its engine;
2. send the alerts and dead letters and wait until the broker acknowledged every one;
3. checkpoint each affected partition's engine, with the offset of the next message, to the
   compacted ``<prefix>.state`` topic, and wait for the acknowledgement;
4. only then commit the consumer offsets (manual commits; auto-commit is off).

A crash anywhere repeats at most the batch in flight: on assignment a partition's engine is
restored from its checkpoint and the consumer seeks to the checkpoint's offset. Alerts sent
again after a crash carry the same deterministic ids, so consumers deduplicate by id.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError

from pipeline.bus.base import Message, Topics
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from pipeline.decode import Decoder
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import DeliveryError, StateError
from pipeline.rules import load_rules
from pipeline.rules.reload import RuleReloader
from pipeline.detection import build_engine
from pipeline.runner import Pipeline
from pipeline.schema import encode
from pipeline.service.config import Config
from pipeline.service.metrics import HttpEndpoint, Metrics
from pipeline.service.state import Checkpoint, KafkaStateStore, state_key

log = logging.getLogger("gpuwarden.service")
STATE_MAX_BYTES = 64 * 1024 * 1024   # the state topic's max.message.bytes (pipeline.bus.kafka.ensure_topics)


@dataclass
class PartitionState:
    partition: int
    pipe: Pipeline
    next_offset: int | None = None
    last_input: float = field(default_factory=time.monotonic)
    newest_ts: float = 0.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: "Service") -> None:
        self.service = service

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.service._revoked([tp.partition for tp in revoked])

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.service._assigned([tp.partition for tp in assigned])


class Service:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        k = cfg.kafka
        self.topics = Topics(k.prefix)
        self.security = k.security.options()
        # Before anything else: no key (and no --insecure-state) is a refusal to start, not a
        # service that trusts whatever the state topic holds (docs/operations.md, Security).
        state_mac_key = state_key(os.environ, cfg.service.insecure_state)
        if state_mac_key is None:
            log.warning("INSECURE STATE: GPUWARDEN_STATE_KEY is not set and --insecure-state is on; checkpoints are "
                        "unsigned and anyone who can write %s can feed the engines a forged history",
                        self.topics.state, extra={"insecure_state": True})
        self.rule_paths = [str(Path(p)) for p in cfg.service.rules]
        self._check_rules()
        ensure_topics(k.bootstrap, self.topics, partitions=k.partitions, security=self.security)
        self.producer = KafkaBusProducer(k.bootstrap, security=self.security, client_id="gpuwarden-service",
                                         max_request_size=STATE_MAX_BYTES)
        self.state = KafkaStateStore(k.bootstrap, self.topics.state, k.group, self.topics.telemetry, self.producer,
                                     self.security, key=state_mac_key, max_bytes=cfg.service.state_max_mib << 20)
        self.parts: dict[int, PartitionState] = {}
        self.metrics = Metrics()
        self.state.on_reject = lambda reason: self.metrics.state_skipped.labels(reason).inc()
        self.consumer = KafkaConsumer(
            bootstrap_servers=k.bootstrap, group_id=k.group, enable_auto_commit=False,
            auto_offset_reset="earliest", max_poll_records=k.max_poll_records,
            max_poll_interval_ms=k.max_poll_interval_ms, session_timeout_ms=k.session_timeout_ms,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=8 << 20, client_id="gpuwarden-service",
            **self.security)
        self.consumer.subscribe([self.topics.telemetry], listener=_Rebalance(self))
        self._stop = False
        self._reload_requested = False
        self._last_poll = time.monotonic()
        self._last_reload_check = time.monotonic()
        self._last_lag = 0.0
        self.http: HttpEndpoint | None = None
        self.batches = 0
        self.totals: Counter[str] = Counter()

    # -- set-up --------------------------------------------------------------------------------

    def _check_rules(self) -> None:
        ruleset, diags = load_rules(self.rule_paths)
        for d in diags:
            (log.error if d.is_error else log.warning)("rules: %s", d)
        if ruleset is None:
            raise SystemExit(f"gpuwarden serve: rules in {', '.join(self.rule_paths)} do not load")
        self._n_rules = len(ruleset)
        self._reloader_fp = RuleReloader(self.rule_paths, Engine()).fingerprint()

    def _new_engine(self) -> Engine:
        engine, diags = build_engine(self.rule_paths, self.cfg.service.models, self.cfg.engine_config())
        if engine is None:  # checked at start-up; a file broken since then keeps the old set elsewhere
            raise StateError("; ".join(str(d) for d in diags if d.is_error))
        return engine

    def _assigned(self, partitions: list[int]) -> None:
        try:
            saved = self.state.load(partitions)
        except (StateError, KafkaError) as e:
            log.error("state: cannot read checkpoints (%s); starting those partitions fresh", e)
            saved = {}
        for p in partitions:
            engine = self._new_engine()
            # No wall clock: one engine sees one partition, whose messages arrive in the order they
            # were produced, so pure event time applies -- the same alerts as a file replay.
            ps = PartitionState(p, Pipeline(engine, _decoder()))
            cp = saved.get(p)
            if cp is not None:
                try:
                    engine.restore(cp.engine)
                    ps.next_offset = cp.next_offset
                    self.consumer.seek(TopicPartition(self.topics.telemetry, p), cp.next_offset)
                    log.info("partition %d: state restored, resuming at offset %d", p, cp.next_offset,
                             extra={"partition": p, "offset": cp.next_offset})
                except StateError as e:
                    log.error("partition %d: checkpoint unusable (%s); starting fresh from the committed offset",
                              p, e, extra={"partition": p})
                    ps = PartitionState(p, Pipeline(self._new_engine(), _decoder()))
            else:
                log.info("partition %d: no checkpoint, starting from the committed offset", p,
                         extra={"partition": p})
            self.parts[p] = ps
        self.metrics.partitions.set(len(self.parts))

    def _revoked(self, partitions: list[int]) -> None:
        # Every batch was checkpointed before its offsets were committed, so there is nothing
        # left to save here: the new owner restores exactly this state.
        for p in partitions:
            self.parts.pop(p, None)
        log.info("partitions revoked: %s", partitions, extra={"partitions": partitions})
        self.metrics.partitions.set(len(self.parts))

    # -- the loop ------------------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def request_reload(self, *_: Any) -> None:
        self._reload_requested = True

    def health(self) -> tuple[bool, dict]:
        age = time.monotonic() - self._last_poll
        return age < 30.0, {"last_poll_s": round(age, 2), "partitions": sorted(self.parts), "batches": self.batches}

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)
        self.metrics.rules.set(self._n_rules)
        self.http = HttpEndpoint(self.cfg.http.host, self.cfg.http.port, self.metrics, self.health).start()
        log.info("serving: %s -> %s, %s; http on %s:%d", self.topics.telemetry, self.topics.alerts, self.topics.dlq,
                 self.cfg.http.host, self.http.port, extra={"http_port": self.http.port})
        try:
            while not self._stop:
                try:
                    batch = self.consumer.poll(timeout_ms=500, max_records=self.cfg.kafka.max_poll_records)
                except KafkaError as e:
                    log.warning("poll failed (%s); retrying", e)
                    time.sleep(1.0)
                    continue
                self._last_poll = time.monotonic()
                if batch:
                    self._process(batch)
                self._flush_idle()
                self._maybe_reload()
                self._update_lag()
        finally:
            self._shutdown()
        return 0

    def _process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        t0 = time.perf_counter()
        outputs: list[EngineOutput] = []
        touched: list[PartitionState] = []
        n = n_records = 0
        for tp, recs in batch.items():
            ps = self.parts.get(tp.partition)
            if ps is None:  # pragma: no cover - kafka-python only returns assigned partitions
                continue
            msgs = [Message(tp.topic, tp.partition, r.offset, r.key, r.value, r.timestamp) for r in recs]
            before = ps.pipe.totals.records
            out = ps.pipe.handle_guarded(msgs)
            n += len(msgs)
            n_records += ps.pipe.totals.records - before
            ps.next_offset = recs[-1].offset + 1
            ps.last_input = time.monotonic()
            outputs.append(out)
            touched.append(ps)
        self._deliver(outputs)
        self._checkpoint(touched)
        self._commit(touched)
        self.batches += 1
        dt = time.perf_counter() - t0
        self.metrics.batch_seconds.observe(dt)
        self.metrics.records.inc(n_records)
        self.metrics.records_per_s.set(n_records / dt if dt > 0 else 0)
        self.totals["messages"] += n

    def _deliver(self, outputs: list[EngineOutput]) -> None:
        """Send every alert and dead letter of the batch; return only once all were acknowledged."""
        attempt = 0
        while True:
            for out in outputs:
                for a in out.alerts:
                    self.producer.send(self.topics.alerts, encode(a), (a.host or "").encode())
                for d in out.dead:
                    self.producer.send(self.topics.dlq, encode(d), (d.host or "").encode())
            try:
                self.producer.flush()
                break
            except DeliveryError as e:
                attempt += 1
                self.metrics.delivery_retries.inc()
                if not e.retriable:
                    # Sending it again cannot help (e.g. over the broker's size limit): say so loudly,
                    # with everything that was in the batch, and move on rather than stall forever.
                    log.error("delivery refused by the broker (%s); the batch's alerts follow in this log", e)
                    break
                log.warning("delivery failed (attempt %d, %s); re-sending the batch's output", attempt, e)
                time.sleep(min(0.5 * 2 ** attempt, 10.0))
        for out in outputs:
            for a in out.alerts:
                self.metrics.alerts.labels(a.family, a.state).inc()
                log.info("alert %s %s %s %s/%s: %s", a.state, a.fault, a.id, a.host, a.gpu, a.summary,
                         extra={"alert_id": a.id, "fault": a.fault, "state": a.state, "host": a.host, "gpu": a.gpu})
            for d in out.dead:
                self.metrics.dead.labels(d.reason).inc()
                log.warning("dead letter %s at %s: %s", d.reason, d.origin, d.detail,
                            extra={"reason": d.reason, "origin": d.origin, "dlq_action": d.action})

    def _checkpoint(self, parts: list[PartitionState]) -> None:
        attempt = 0
        while True:
            for ps in parts:
                if ps.next_offset is not None:
                    self.state.save(Checkpoint(ps.partition, ps.next_offset, ps.pipe.engine.snapshot()))
            try:
                self.producer.flush()
                return
            except DeliveryError as e:
                attempt += 1
                if not e.retriable:
                    # The previous checkpoint stays valid (it carries its own offset): a restart
                    # replays a little more, nothing is lost.
                    log.error("checkpoint refused by the broker (%s); keeping the previous one", e)
                    return
                log.warning("checkpoint failed (attempt %d, %s); retrying", attempt, e)
                time.sleep(min(0.5 * 2 ** attempt, 10.0))

    def _commit(self, parts: list[PartitionState]) -> None:
        offsets = {TopicPartition(self.topics.telemetry, ps.partition): OffsetAndMetadata(ps.next_offset, "", -1)
                   for ps in parts if ps.next_offset is not None}
        try:
            self.consumer.commit(offsets)
        except KafkaError as e:
            # Not fatal: the checkpoint already holds the position; the next commit catches up.
            log.warning("offset commit failed (%s); the checkpoint holds the position", e)

    def _flush_idle(self) -> None:
        now = time.monotonic()
        idle = [ps for ps in self.parts.values()
                if ps.pipe.engine.pending and now - ps.last_input > self.cfg.service.flush_idle_s]
        if not idle:
            return
        outputs = [ps.pipe.flush() for ps in idle]
        self._deliver(outputs)
        self._checkpoint(idle)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if not self._reload_requested and now - self._last_reload_check < self.cfg.service.reload_check_s:
            return
        self._last_reload_check = now
        fp = RuleReloader(self.rule_paths, Engine()).fingerprint()
        if not self._reload_requested and fp == self._reloader_fp:
            return
        self._reload_requested = False
        self._reloader_fp = fp
        ruleset, diags = load_rules(self.rule_paths, tick=self.cfg.engine_config().tick)
        for d in diags:
            (log.error if d.is_error else log.warning)("rules: %s", d)
        if ruleset is None:
            self.metrics.reload_failures.inc()
            log.error("rules: reload refused; still running the previous rules")
            return
        models = {m for e in [ps.pipe.engine for ps in self.parts.values()] if e.models for m in e.models.names}
        for ps in self.parts.values():
            fresh, _ = load_rules(self.rule_paths, tick=self.cfg.engine_config().tick, models=models or None)
            ps.pipe.engine.set_rules(fresh)
        self.metrics.rules.set(len(ruleset))
        log.warning("rules: reloaded %d rule(s)", len(ruleset))

    def _update_lag(self) -> None:
        now = time.monotonic()
        if now - self._last_lag < 5.0 or not self.parts:
            return
        self._last_lag = now
        try:
            tps = [TopicPartition(self.topics.telemetry, p) for p in self.parts]
            end = self.consumer.end_offsets(tps)
            for tp in tps:
                pos = self.parts[tp.partition].next_offset
                if pos is not None:
                    self.metrics.lag.labels(str(tp.partition)).set(max(0, end[tp] - pos))
        except KafkaError:
            pass

    def _shutdown(self) -> None:
        log.info("stopping: leaving the group", extra={"batches": self.batches, "messages": self.totals["messages"]})
        try:
            self.consumer.close(autocommit=False)
        finally:
            self.producer.close()
            if self.http:
                self.http.stop()


# Event time further ahead of the service's wall clock than this is ts_out_of_range (a producer
# whose clock is wrong). No bound on age: a recording replayed into the topic is old by nature.
MAX_FUTURE_S = 300.0


def _decoder() -> Decoder:
    return Decoder(wall_clock=time.time, max_future_s=MAX_FUTURE_S, max_age_s=math.inf)


def setup_logging(level: str = "INFO") -> None:
    """JSON lines on stderr: every problem record names its topic[partition]@offset."""
    from pythonjsonlogger.json import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                       rename_fields={"levelname": "level", "asctime": "time"}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kafka").setLevel(logging.ERROR)
