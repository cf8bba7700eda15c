"""``gpuwarden serve``: one stage of the long-running consumer-group service.

Per assigned partition there is one task (a telemetry partition holds whole hosts: messages
are keyed by host), built and restored in ``partitions.py``; each turn of the loop polls, runs
each partition's share through its task and follows the commit protocol (``commit.py``:
deliver, checkpoint, then commit), then does what is due (``upkeep.py``: idle flush, rule
reload, lag). A crash replays what each partition received after its last checkpoint; alerts
sent again carry the same deterministic ids, so consumers deduplicate by id.

The consumer, producer and state store come in by injection (``Service(cfg, consumer=...,
producer=..., state=...)``): without them, Kafka (``wiring.py``), the in-memory bus in the unit
tests of the protocol (tests/unit/service/).
"""

from __future__ import annotations

import errno
import logging
import math
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from pipeline.bus.base import Message, Producer, Topics
from pipeline.bus.group import GroupConsumer
from pipeline.bus.retry import Backoff
from pipeline.bus.sinks import BusOutput, OutputSink
from pipeline.engine import EngineOutput
from pipeline.errors import BusError, ConfigError
from pipeline.httpendpoint import HttpEndpoint
from pipeline.incidents import IncidentEvent, IncidentStage
from pipeline.incidents.live import live_pages
from pipeline.protocols import IncidentSource
from pipeline.rules.reload import RuleReloader
from pipeline.runner import Pipeline
from pipeline.service import wiring
from pipeline.service.commit import CommitProtocol
from pipeline.service.config import Config
from pipeline.service.fleet import DROPPED, FORCED, FleetTask, incident_sends
from pipeline.service.fleetwire import Send
from pipeline.service.liveview import LoopQuery
from pipeline.service.metrics import Metrics
from pipeline.service.partitions import Membership, PartitionState
from pipeline.service.state import StateStore, derived_key
from pipeline.service.upkeep import Upkeep
from pipeline.service.wiring import fleet_on, kafka_parts, max_poll, models_on, setup_logging

log = logging.getLogger("gpuwarden.service")
POLL_TIMEOUT_S = 0.5
# A quiet poll's wait when stages share the loop: a stage blocked in its poll cannot see the other
# stage's input, which waits for it; at 0.25 s each this was the 2,048-GPU latency's p99 (0.56-0.67
# s against 0.17-0.26 s at 0.05, docs/performance.md). 20 empty polls a second cost next to nothing.
SHARED_POLL_TIMEOUT_S = 0.05
STAGES = ("host", "fleet")  # docs/operations.md, "Topology"
# How long an /incidents request waits for the loop to answer it between turns (a turn is a poll
# of at most POLL_TIMEOUT_S and its batch); past it the page answers 503, busy.
LIVE_WAIT_S = 2.0


class Service(Membership, CommitProtocol, Upkeep):
    """One ``serve`` stage of a replica: a group member, its partitions' tasks, its outputs and
    its checkpoints."""

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

        ``stage``: ``host`` consumes the telemetry topic (rules, absence; with models, a hang
        detector or incidents it forwards to the fleet topic), ``fleet`` the fleet topic (the
        models, the hang detector, the incidents). ``upstream``: the telemetry
        topic's partition count (each fleet partition waits for the marks of that many)."""
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r}: one of {', '.join(STAGES)}")
        self.stage = stage
        self._what = "partition" if stage == "host" else "fleet partition"  # in its log lines
        rules_checked: int | None = None
        if consumer is None and producer is None and state is None:
            consumer, producer, state, rules_checked = wiring.kafka_parts(cfg, stage)
        if consumer is None or producer is None or state is None:
            raise TypeError("Service: give consumer, producer and state together, or none of them")
        self.cfg = cfg
        self.topics = Topics(cfg.kafka.prefix)
        count = getattr(producer, "partition_count", lambda topic: None)
        # As the cluster has them (the topic may predate this config): how many telemetry
        # partitions mark the fleet stage, which refuses a mark naming another count or partition.
        self.upstream = upstream or count(self.topics.telemetry) or cfg.kafka.partitions
        self.n_fleet = count(self.topics.fleet) or cfg.kafka.partitions
        self.rule_paths = [str(Path(p)) for p in cfg.service.rules]
        self.clock = clock
        self.backoff = backoff or Backoff()
        self._n_rules = wiring.check_rules_load(self.rule_paths) if rules_checked is None else rules_checked
        self.consumer, self.producer, self.state = consumer, producer, state
        # The fleet topic's messages are signed under a key of their own, derived from the state
        # key (None with --insecure-state: unsigned, still validated; pipeline/service/fleet.py).
        self.fleet_key = derived_key(getattr(state, "mac_key", None), "fleet")
        # Read once: every fleet partition's incident stage runs it (None: incidents off).
        self.incident_config = wiring.incident_config(cfg)
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
        self.max_poll = wiring.max_poll(cfg, stage)
        self._reload_requested = False
        # One reload for every partition's engine; the fleet stage runs no rules.
        self.reloader: RuleReloader | None = None
        if stage == "host":
            self.reloader = RuleReloader(self.rule_paths, self._engines, tick=cfg.engine_config().tick)
            self.reloader.rules = self._n_rules
        now = clock()
        self._grid0 = now
        self._last_poll = now
        self._idle_asked = -math.inf  # when _flush_idle last asked the broker for end offsets
        self._last_reload_check = now
        self._last_lag = 0.0
        self._broker_lost = False  # an end-offsets query or a poll failed since the last idle check
        self._broker_slow = False  # the lag query or a loop turn was slow since the last idle check
        self._turn_started = now  # service clock at the start of the loop's turn (step)
        self._idle_restarted = False  # the last idle check restarted idle time (the broker was away)
        self._last_routing = now
        self._warned_split: set[str] = set()
        self.http: HttpEndpoint | None = None
        self.batches = 0
        self.totals: Counter[str] = Counter()
        self.consumer.subscribe(self._assigned, self._revoked, self._lost)

    @property
    def forwards(self) -> bool:
        """Whether this host stage sends to the fleet topic (models, the hang detector or incidents are on)."""
        return self.stage == "host" and fleet_on(self.cfg)

    # -- the loop ------------------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def request_reload(self, *_: Any) -> None:
        self._reload_requested = True

    def incident_stages(self) -> list[IncidentStage]:
        """The incident stages of this stage's partition tasks that run one (the fleet stage's)."""
        return [
            ps.pipe.incidents
            for ps in self.parts.values()
            if isinstance(ps.pipe, IncidentSource) and ps.pipe.incidents is not None
        ]

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
        # The /incidents page is computed by this loop between turns (pipeline/service/liveview.py).
        live = LoopQuery(lambda: open_incidents(services), fresh_for=1.0)
        try:
            endpoint = HttpEndpoint(
                self.cfg.http.host,
                self.cfg.http.port,
                self.metrics.registry,
                self.health,
                pages=live_pages(lambda: live.ask(LIVE_WAIT_S)),
            )
        except OSError as e:  # another serve on the port, an address not on this machine
            for s in services:
                s._close()
            key = "http.host" if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) else "http.port"
            raise ConfigError(key, f"{self.cfg.http.host}:{self.cfg.http.port}: {e.strerror or e}") from None
        self.http = endpoint.start()
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
                live.answer()
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
        self._turn_started = self.clock()
        self.got_input = False
        try:
            batch = self.consumer.poll(self.poll_timeout, self.max_poll)
        except BusError as e:
            # Whatever the broker says (restarting, leader moving, group coordinator gone), the
            # same poll is tried again, ever more slowly: the service rides out an outage.
            log.warning("poll failed (%s); retrying", e)
            self._broker_lost = True
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
        self._check_routing()
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
            if ps.outbox is not None:
                sends += ps.outbox.take()
            if isinstance(ps.pipe, FleetTask):
                sends += ps.pipe.take_sends()
            done = ps.pipe.totals.records - before
            n += len(msgs)
            n_records += done
            ps.next_offset = msgs[-1].offset + 1
            ps.since_saved += done
            ps.dirty = True
            ps.last_input = now
        events = self._take_incidents()
        sends += incident_sends(self.topics.incidents, events)
        t1 = time.perf_counter()
        self._phase_process.inc(t1 - t0)
        self._deliver(outputs, sends)
        for e in events:
            self.metrics.incidents.labels(e.state).inc()
        self.batches += 1
        dt = time.perf_counter() - t0
        for ps in self.parts.values():
            if isinstance(ps.pipe, FleetTask):  # the fleet stage's own counters
                self.metrics.fleet_records.inc(ps.pipe.take("released"))
                self.metrics.fleet_early.inc(ps.pipe.take("early"))
                self.metrics.fleet_forced.inc(ps.pipe.take(FORCED))
                for why in DROPPED:
                    self.metrics.fleet_dropped.labels(why).inc(ps.pipe.take(why))
                for why, k in ps.pipe.take_incident_drops().items():
                    self.metrics.incident_dropped.labels(why).inc(k)
            elif isinstance(ps.pipe, Pipeline):  # the host stage's held records let go, moves
                for kind, dropped in ps.pipe.take_held_drops().items():
                    self.metrics.held_dropped.labels(kind).inc(dropped)
                self.metrics.samples_moved.inc(ps.pipe.take_moved())
        if self.stage == "host":  # telemetry records; the fleet stage's are the same ones again
            self.metrics.batch_seconds.observe(dt)
            self.metrics.records.inc(n_records)
            self.metrics.records_per_s.set(n_records / dt if dt > 0 else 0)
        self.totals["messages"] += n

    def _take_incidents(self) -> list:
        """The incident events the fleet partitions made since the last call (step 2 sends them
        with the batch's alerts, before the offsets they come from are committed)."""
        return [e for ps in self.parts.values() if isinstance(ps.pipe, FleetTask) for e in ps.pipe.take_incidents()]

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


def open_incidents(services: list[Service]) -> list[IncidentEvent] | None:
    """The open incidents of every incident stage the ``services`` hold (``IncidentStage.open_incidents``),
    or None when none holds one: the incidents are off, or no fleet partition is assigned here."""
    stages = [st for s in services for st in s.incident_stages()]
    if not stages:
        return None
    return [e for st in stages for e in st.open_incidents()]


__all__ = [
    "LIVE_WAIT_S",
    "POLL_TIMEOUT_S",
    "SHARED_POLL_TIMEOUT_S",
    "STAGES",
    "PartitionState",
    "fleet_on",
    "Service",
    "kafka_parts",
    "open_incidents",
    "max_poll",
    "models_on",
    "setup_logging",
]
