"""What a ``Service`` does between batches when it is due: flush a partition that went idle,
reload the rules, report the consumer lag, and say which hosts come on several partitions."""

from __future__ import annotations

import logging
from typing import Callable

from pipeline.bus.group import GroupConsumer
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import BusError
from pipeline.protocols import Detector
from pipeline.rules.reload import RuleReloader
from pipeline.service.config import Config
from pipeline.service.fleet import FleetTask
from pipeline.service.fleetwire import Send
from pipeline.service.metrics import Metrics
from pipeline.service.partitions import PartitionState
from pipeline.service.routing import split_hosts
from pipeline.topology import Topology

log = logging.getLogger("gpuwarden.service")

ROUTING_CHECK_S = 60.0  # how often (service clock) a stage looks for hosts split between partitions
# An end-offsets answer slower than this comes from a broker that was away (or overloaded).
SLOW_ANSWER_S = 1.0
# A loop turn longer than this read nothing meanwhile: as a slow answer (``_broker_was_away``).
STALLED_TURN_S = 5.0
MAX_WARNED_HOSTS = 10_000  # hosts warned of once each: bounded, a fleet of unkeyed producers is one warning


class Upkeep:
    """Idle flush, rule reload, lag and hosts split between partitions for a ``Service``'s partitions."""

    cfg: Config
    stage: str
    consumer: GroupConsumer
    metrics: Metrics
    parts: dict[int, PartitionState]
    clock: Callable[[], float]
    reloader: RuleReloader | None
    _n_rules: int
    _reload_requested: bool
    _last_reload_check: float
    _idle_asked: float
    _last_lag: float
    _broker_lost: bool
    _broker_slow: bool
    _turn_started: float
    _idle_restarted: bool
    _last_routing: float
    _warned_split: set[str]
    _deliver: Callable[[list[EngineOutput], list[Send] | None], None]
    _checkpoint: Callable[..., bool]

    def _flush_idle(self) -> None:
        now = self.clock()
        if now - self._turn_started > STALLED_TURN_S:
            self._broker_slow = True  # this turn stood still (a delivery waiting out an outage)
        # A host-stage task forwarding to the fleet stage also says, once idle, that it holds
        # nothing back (a final mark), even with nothing buffered: a telemetry partition no host
        # writes to must not hold the fleet stage for ever.
        idle = [
            ps
            for ps in self.parts.values()
            if (ps.pipe.pending or ps.holds_fleet()) and now - ps.last_input > self.cfg.service.flush_idle_s
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
            self._broker_lost = True
            return
        if self._broker_was_away(now):
            return
        idle = [ps for ps in idle if end.get(ps.partition, 0) <= (ps.next_offset or 0)]
        if not idle:
            return
        outputs = [ps.pipe.flush() for ps in idle]
        sends = [s for ps in idle if ps.outbox is not None for s in ps.outbox.take()]
        for ps in idle:
            ps.dirty = True
        self._deliver(outputs, sends)
        self._checkpoint(idle, "idle")

    def _broker_was_away(self, asked: float) -> bool:
        """After the idle check's end offsets came (asked at ``asked``): whether the broker was
        away until now, in which case every partition's idle time starts again now and nothing
        is flushed. Away: a query or a poll failed since the last check, or something was slow
        (this query or the lag's over ``SLOW_ANSWER_S``, kafka-python's wait out an outage; a
        loop turn over ``STALLED_TURN_S``, a delivery waiting for the broker). Producers deliver
        what they buffered through an outage once the broker is back, each in its own time: a
        partition flushed at the first answer would make its backlog late while another
        partition's backlog ran the fleet stage past it. Slowness not twice in a row, so a broker
        (or loop) that is always slow still lets idle partitions go.
        """
        now = self.clock()
        slow = self._broker_slow or now - asked > SLOW_ANSWER_S
        away = self._broker_lost or (slow and not self._idle_restarted)
        self._broker_lost = self._broker_slow = False
        self._idle_restarted = away
        if away and self.parts:
            log.info(
                "the broker was away (or this loop stood still): idle time of partitions %s starts again",
                sorted(self.parts),
            )
            for ps in self.parts.values():
                ps.last_input = max(ps.last_input, now)
        return away

    def _maybe_reload(self) -> None:
        """On SIGHUP, or when ``reload_check_s`` passed and a rule file changed: one reload for
        every partition's engine (``RuleReloader``). The fleet stage runs the models only; a
        models.yaml change needs a restart."""
        now = self.clock()
        if not self._reload_requested and now - self._last_reload_check < self.cfg.service.reload_check_s:
            return
        self._last_reload_check = now
        if self.reloader is None:
            self._reload_requested = False
            return
        if self._reload_requested:
            self.reloader.request()
            self._reload_requested = False
        res = self.reloader.poll()
        if res is None:
            return
        if not res.applied:
            self.metrics.reload_failures.inc()
            return
        self._n_rules = res.rules
        self.metrics.rules.set(res.rules)

    def _engines(self) -> list[Detector]:
        """The detectors a reload installs rules in: every host-stage partition's."""
        return [ps.detector for ps in self.parts.values() if ps.detector is not None]

    def _update_lag(self) -> None:
        now = self.clock()
        if now - self._last_lag < 5.0 or not self.parts:
            return
        self._last_lag = now
        unread = [p for p, ps in self.parts.items() if ps.next_offset is None]
        try:
            end = self.consumer.end_offsets(list(self.parts))
            # Nothing read yet and no checkpoint: behind by what the partition still holds (an
            # empty one, or one retention emptied, 0), so every assigned partition has its series.
            begin = self.consumer.beginning_offsets(unread) if unread else {}
        except BusError:
            self._broker_lost = True
            return
        if self.clock() - now > SLOW_ANSWER_S:
            self._broker_slow = True
        for p, e in end.items():
            ps = self.parts.get(p)
            if ps is not None:
                at = ps.next_offset if ps.next_offset is not None else begin.get(p, e)
                self.metrics.lag.labels(str(p) if self.stage == "host" else f"fleet/{p}").set(max(0, e - at))

    def _check_routing(self) -> None:
        """Every ``ROUTING_CHECK_S``: the hosts that came lately on more than one telemetry
        partition, as a gauge and, for hosts not named before, a warning. The host stage looks
        across this process's partitions' engines (``routing.split_hosts``); the fleet stage
        across the host stages that forward to its partitions (``routing.SenderLog``, models on),
        which sees a host split between replicas."""
        now = self.clock()
        if now - self._last_routing < ROUTING_CHECK_S:
            return
        self._last_routing = now
        horizon = self.cfg.engine_config().allowed_lateness
        if self.stage == "host":
            engines: dict[int, Engine] = {}
            for p, ps in self.parts.items():
                det = ps.detector.host if isinstance(ps.detector, Topology) else ps.detector
                if isinstance(det, Engine):
                    engines[p] = det
            split = split_hosts(engines, horizon)
            self.metrics.split_hosts.set(len(split))
            where = "telemetry partition"
        else:
            split = {}
            for ps in self.parts.values():
                if isinstance(ps.pipe, FleetTask):
                    for h, senders in ps.pipe.senders.split(horizon).items():
                        split[h] = sorted(set(split.get(h, [])) | set(senders))
            self.metrics.fleet_split_hosts.set(len(split))
            where = "telemetry partition (their host stages all forwarded it to the fleet stage)"
        new = [h for h in split if h not in self._warned_split]
        if not new:
            return
        if len(self._warned_split) < MAX_WARNED_HOSTS:
            self._warned_split.update(new[: MAX_WARNED_HOSTS - len(self._warned_split)])
        shown = ", ".join(f"{h[:64]!r} on {split[h]}" for h in new[:5])
        log.warning(
            "%d host(s) came on more than one %s (%s%s): their producer does not key "
            "its messages by host, so each host's state is split between engines and its alerts may be "
            "missed or doubled; key every message by its host name (docs/operations.md, Scale)",
            len(new),
            where,
            shown,
            ", ..." if len(new) > 5 else "",
            extra={"hosts": new[:100]},
        )
