"""The service's partitions: what it holds per partition (``PartitionState``), the task it builds
for one (``Pipeline`` for the host stage, ``ForwardingPipeline`` when that forwards to the fleet
topic: models, the hang detector or incidents on, ``FleetTask`` for the fleet stage), and the group membership
callbacks that create, restore and drop them."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

from pipeline.bus.base import Message, Topics
from pipeline.bus.group import GroupConsumer
from pipeline.decode import Decoder
from pipeline.detection import Stages, build_stages
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import BusError, StateError
from pipeline.incidents import IncidentConfig, IncidentStage
from pipeline.protocols import Detector, PartitionTask
from pipeline.runner import Pipeline
from pipeline.service.config import Config
from pipeline.service.fleet import FleetTask
from pipeline.service.outbox import Outbox
from pipeline.service.metrics import Metrics
from pipeline.service.state import StateStore
from pipeline.topology import Topology

log = logging.getLogger("gpuwarden.service")


@dataclass
class PartitionState:
    partition: int
    pipe: PartitionTask
    # The host stage's detector (what a rule reload installs in; None in the fleet stage) and,
    # with models or incidents, the outbox its forwarded records, alerts and marks queue in.
    detector: Detector | None = None
    outbox: Outbox | None = None
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

    def holds_fleet(self) -> bool:
        """Whether this host-stage task has yet to tell the fleet stage it holds nothing back."""
        return self.outbox is not None and not self.outbox.final_sent()


class ForwardingPipeline(Pipeline):
    """A host-stage task that feeds the fleet stage: what each batch forwarded (records, with
    models), its alerts (for the incident stage), and then how far the detector has released,
    queue in ``outbox`` (a ``FleetSide``)."""

    def __init__(self, detector: Detector, decoder: Decoder, outbox: Outbox) -> None:
        super().__init__(detector, decoder)
        self.outbox = outbox

    def handle_guarded(self, messages: Sequence[Message]) -> EngineOutput:
        out = super().handle_guarded(messages)
        self.outbox.feed(out.forwarded)
        self.outbox.alerts(out.alerts)
        ahead = self.engine.hosts_ahead() if self.outbox.hosts_ahead else None
        self.outbox.mark(self.outbox.partition, self.engine.released, hosts=ahead)
        return out

    def flush(self) -> EngineOutput:
        """The detector's flush, and a final mark: this task holds nothing back until it next
        marks (the bound stays the last one: a flush releases to no finite time)."""
        out = super().flush()
        self.outbox.alerts(out.alerts)
        self.outbox.mark(self.outbox.partition, self.outbox.upto, final=True)
        return out


class Membership:
    """The partitions of one stage of a ``Service``: built on assignment (restored from their
    checkpoints), dropped on revoke or loss. Called inside ``consumer.poll``/``close``
    (pipeline/bus/group.py)."""

    cfg: Config
    stage: str
    topics: Topics
    upstream: int
    n_fleet: int  # the fleet topic's partitions: with model shards, one shard each
    rule_paths: list[str]
    fleet_key: bytes | None
    incident_config: IncidentConfig | None  # None: incidents off (service.incidents)
    consumer: GroupConsumer
    state: StateStore
    metrics: Metrics
    parts: dict[int, PartitionState]
    clock: Callable[[], float]
    _what: str
    _checkpoint: Callable[..., bool]  # the commit protocol's (pipeline/service/commit.py)

    # -- set-up --------------------------------------------------------------------------------

    def _stages(self) -> Stages:
        config = self.cfg.engine_config()
        if self.stage == "fleet":
            # A host stage's engine keeps one telemetry partition's hosts, up to max_hosts; the
            # fleet stage's keeps every host those engines let through, from every partition.
            config = replace(config, max_hosts=config.max_hosts * max(1, self.upstream))
        built, diags = build_stages(self.rule_paths, self.cfg.service.models, config)
        if built is None:  # checked at start-up; a file broken since then keeps the old set elsewhere
            raise StateError("; ".join(str(d) for d in diags if d.is_error))
        return built

    def _shards(self, stages: Stages) -> bool:
        """Whether the models run in shards, one per fleet partition (``service.shard_models``,
        with models on and more than one fleet partition)."""
        return (
            self.cfg.service.shard_models and stages.fleet is not None and not stages.progress_only and self.n_fleet > 1
        )

    def _new_engine(self, partition: int) -> Detector:
        """The host stage's detector of a partition: with models (or rules only with a hang
        detector) a ``Topology`` whose fleet stage runs elsewhere (its forwarded records, all or
        the progress records, go to the fleet topic)."""
        stages = self._stages()
        # A host's rows of a tick go once the host is complete for it, not once every host of the
        # partition is: the same alerts, up to a second sooner (docs/architecture.md §4, release).
        stages.host.release_hosts = True
        return stages.detector(local_fleet=False)

    def _new_part(self, partition: int, now: float) -> PartitionState:
        """A fresh partition: its task, and what the service reaches in it."""
        from pipeline.service.wiring import live_decoder

        if self.stage == "fleet":
            stages = self._stages()
            make = stages.fleet
            # Every record the host stage accepted comes (models on), which bounds its marks; rules
            # only with a hang detector, the progress records alone.
            records = make is not None and not stages.progress_only
            if make is None:
                if self.incident_config is None:
                    raise StateError("the fleet stage runs the models, the hang detector or incidents, and none is on")
                # Rules only: an engine that is never fed, so the stage's watermark works alike.
                make = partial(Engine, self.cfg.engine_config(), row_checks=[], tick_checks=[], screened=True)

            shard = (partition, self.n_fleet) if self._shards(stages) else None
            # With shards, partition 0 runs what reads every host: the hang detector and the
            # incident stage (the others send it their alerts).
            alone = shard is None or partition == 0
            incidents = IncidentStage(self.incident_config) if self.incident_config is not None and alone else None
            task = FleetTask(
                make,
                self.upstream,
                max_buffer=self.cfg.service.fleet_max_buffer,
                topic=self.topics.fleet,
                group=self.cfg.kafka.group,
                key=self.fleet_key,
                hang=stages.hang() if stages.hang is not None and alone else None,
                incidents=incidents,
                records=records,
                shard=shard,
                forward_alerts=self.incident_config is not None and not alone,
            )
            return PartitionState(partition, task, last_input=now)
        detector = self._new_engine(partition)
        if not isinstance(detector, Topology) and self.incident_config is None:
            return PartitionState(partition, Pipeline(detector, live_decoder()), detector, last_input=now)
        # The fleet stage's engine is built as the host stage's template is: the same fields.
        fields = detector.fleet_engine().decode_fields if isinstance(detector, Topology) else ()
        sharded = isinstance(detector, Topology) and not detector.progress_only
        shards = self.n_fleet if sharded and self.cfg.service.shard_models and self.n_fleet > 1 else None
        outbox = Outbox(
            partition,
            self.upstream,
            self.topics.fleet,
            group=self.cfg.kafka.group,
            key=self.fleet_key,
            fields=fields,
            shards=shards,
            # Hosts released ahead serve only a fleet engine that can run them early.
            hosts_ahead=isinstance(detector, Topology) and detector.fleet_engine().host_local,
        )
        pipe = ForwardingPipeline(detector, live_decoder(), outbox)
        return PartitionState(partition, pipe, detector, outbox, last_input=now)

    # -- group membership ----------------------------------------------------------------------

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
            ps = self._new_part(p, now)
            cp = saved.get(p)
            if cp is not None:
                try:
                    ps.pipe.restore(cp.engine)
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
                    ps = self._new_part(p, now)
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
