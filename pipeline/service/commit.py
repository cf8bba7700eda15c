"""The service's commit protocol (docs/operations.md, How it keeps its promises): deliver a
batch's output and wait for the broker, checkpoint on the cadence, and only then commit.

1. each partition's share of a poll runs through its task (``Service._process``);
2. the alerts, dead letters and what the host stage forwards are sent, and ``_deliver``
   returns only once the broker acknowledged every one;
3. on the partition's cadence (``service.checkpoint_interval_s`` or ``checkpoint_records``) and
   always on revoke, idle flush and shutdown, ``_checkpoint`` writes its task's snapshot, with
   the offset to resume at, to the state store and waits for the acknowledgement;
4. only then ``_commit`` commits that partition's offset: a committed offset always has a
   checkpoint.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

from prometheus_client import Counter

from pipeline.bus.base import Producer
from pipeline.bus.group import GroupConsumer
from pipeline.bus.retry import Backoff, is_retriable, retry
from pipeline.bus.sinks import OutputSink
from pipeline.engine import EngineOutput
from pipeline.errors import BusError, DeliveryError
from pipeline.service.config import Config
from pipeline.service.fleetwire import Send
from pipeline.service.metrics import Metrics
from pipeline.service.partitions import PartitionState
from pipeline.service.state import Checkpoint, StateStore

log = logging.getLogger("gpuwarden.service")


class CommitProtocol:
    """Steps 2 to 4 for a ``Service``'s partitions."""

    cfg: Config
    consumer: GroupConsumer
    producer: Producer
    state: StateStore
    output: OutputSink
    metrics: Metrics
    backoff: Backoff
    parts: dict[int, PartitionState]
    clock: Callable[[], float]
    _grid0: float
    _phase_deliver: Counter
    _phase_checkpoint: Counter
    _phase_commit: Counter

    def _deliver(self, outputs: list[EngineOutput], sends: list[Send] | None = None) -> None:
        """Send every alert and dead letter of the batch, and what the host stage forwards to the
        fleet stage; return only once all were acknowledged."""
        if not sends and not any(out.alerts or out.dead for out in outputs):
            return
        t0 = time.perf_counter()

        def send_and_flush() -> None:
            # Sent again whole on a retry: the fleet stage drops records it has (pipeline/fleetstage.py)
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
                self.state.save(Checkpoint(ps.partition, offsets[ps.partition], ps.pipe.snapshot()))
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


def _retriable_delivery(e: BaseException) -> bool:
    return isinstance(e, DeliveryError) and is_retriable(e)
