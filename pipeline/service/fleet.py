"""The service's two stages on Kafka (docs/operations.md, "Topology"): what the host stage sends
to ``<prefix>.fleet`` and what a fleet-stage partition makes of it.

On ``<prefix>.fleet`` there are two kinds of message:

- **records**: a JSON array of the records one host-stage task accepted (the wire format of
  the telemetry topic, with only the fields detection reads), keyed by the fleet stage's key
  (``pipeline.topology.FLEET_KEY``), so every record of one key lands on one partition;
- **marks**: ``{"mark": <telemetry partition>, "upto": <ts>, "final": <bool>, "n": <partitions>}``,
  sent by each host-stage task after the records they cover, with the records' key and on the
  same producer, so on the records' partition a mark follows every record it covers. The other
  fleet partitions get neither (they hold nothing to release); a mark to each of them cost
  every host-stage batch one message per fleet partition, for nothing.

A fleet-stage partition releases a second once every telemetry partition's task has marked past
it (``pipeline.topology.FleetStage``), so its alerts do not depend on how many replicas run
either stage or on how the partitions are spread among them.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import msgspec

from pipeline.bus.base import Message
from pipeline.engine import Engine, EngineOutput
from pipeline.errors import StateError
from pipeline.runner import Totals
from pipeline.schema import TelemetryRecord
from pipeline.topology import FLEET_KEY, FleetStage, records_decoder

log = logging.getLogger("gpuwarden.service")
# Records per message on the fleet topic: ~0.5 MB, under the broker's default 1 MiB message limit
# should the topic predate this (ensure_topics gives it 8 MiB).
MAX_FORWARD = 400
# The fleet stage's counters of records its models did not get (FleetStage.stats), and of its
# forced releases (events, not records).
DROPPED = ("duplicate", "late")
FORCED = "forced"
_KEY = FLEET_KEY.encode()


class Mark(msgspec.Struct):
    mark: int
    upto: float | None  # None: -inf (nothing released yet)
    final: bool = False
    n: int = 1


Send = tuple[str, bytes | None, bytes, int | None]  # topic, key, value, partition


class Outbox:
    """The fleet side of a host-stage task's ``Topology``: forwarded records and marks queue here
    until the service sends them with the batch's alerts (step 2 of the commit protocol)."""

    def __init__(self, partition: int, n_upstream: int, topic: str, template: Callable[[], Engine]) -> None:
        self.partition, self.n_upstream, self.topic = partition, n_upstream, topic
        self._template = template
        self._engine: Engine | None = None
        self._records: list[TelemetryRecord] = []
        self._mark: tuple[float, bool] | None = None
        self._sent: tuple[float, bool] | None = None
        self._enc = msgspec.json.Encoder()

    def engine(self, key: str = FLEET_KEY) -> Engine:
        """A fleet engine as the fleet stage builds it: what it reads, for the host's decoder."""
        if self._engine is None:
            self._engine = self._template()
        return self._engine

    def feed(self, records: Sequence[TelemetryRecord], keys: Sequence[str] | None = None) -> None:
        self._records.extend(records)

    def mark(self, upstream: int, upto: float, final: bool = False, n_upstream: int | None = None) -> None:
        self._mark = (upto, final)

    def advance(self) -> EngineOutput:
        return EngineOutput()

    def flush(self) -> EngineOutput:
        upto = self._mark[0] if self._mark else -math.inf
        self._mark = (upto, True)
        return EngineOutput()

    @property
    def pending(self) -> int:
        return 0

    def snapshot(self) -> bytes:
        return b""

    def restore(self, blob: bytes, decode: Any) -> None:
        """Nothing to restore: what was not sent before a crash is sent again by the replay."""

    def take(self) -> list[Send]:
        """The messages to send now: the records, then a mark when it moved (both keyed as the
        records are, so the mark lands after them on their partition)."""
        out: list[Send] = []
        recs, self._records = self._records, []
        for i in range(0, len(recs), MAX_FORWARD):
            out.append((self.topic, _KEY, self._enc.encode(recs[i : i + MAX_FORWARD]), None))
        if self._mark is not None and self._mark != self._sent:
            upto, final = self._mark
            body = self._enc.encode(
                Mark(self.partition, None if math.isinf(upto) and upto < 0 else upto, final, self.n_upstream)
            )
            out.append((self.topic, _KEY, body, None))
            self._sent = self._mark
        return out

    def final_sent(self) -> bool:
        return self._sent is not None and self._sent[1]


class FleetTask:
    """One partition of ``<prefix>.fleet``: what the service's commit protocol drives, shaped as
    its host-stage ``Pipeline`` is (``handle_guarded``, ``flush``, ``totals``, ``engine``)."""

    def __init__(self, make_engine: Callable[[], Engine], n_upstream: int, max_buffer: int = 2_000_000) -> None:
        self.stage = FleetStage(make_engine, upstream=n_upstream, max_buffer=max_buffer)
        self.totals = Totals()
        self.engine = self  # snapshot/restore/pending, as the service reads them of an engine
        self._decode = records_decoder(self.stage.engine().decode_fields)
        self._mark = msgspec.json.Decoder(Mark)
        self.models = self.stage.engine().models
        self.rules = None
        self._taken: dict[str, int] = {}  # each stat as last taken

    def handle_guarded(self, messages: Sequence[Message]) -> EngineOutput:
        for m in messages:
            try:
                if m.value[:1] == b"{":
                    mk = self._mark.decode(m.value)
                    self.stage.mark(mk.mark, -math.inf if mk.upto is None else mk.upto, mk.final, mk.n)
                else:
                    recs = self._decode(m.value)
                    self.stage.feed(recs, at=m.offset)
                    self.totals.records += len(recs)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                # Only the host stage writes this topic: a message it could not have written is
                # skipped and logged, never a reason to stop the stage.
                log.error("fleet: message at %s is not the host stage's (%s); skipped", m.origin, e)
            self.stage.position = m.offset + 1
            self.totals.messages += 1
        out = self.stage.advance()
        self.totals.add(out)
        return out

    def take(self, stat: str) -> int:
        """How much the fleet stage's counter ``stat`` (``FleetStage.stats``) grew since the last
        call: the service's metrics are counters fed these increments."""
        n = self.stage.stats[stat] - self._taken.get(stat, 0)
        self._taken[stat] = self.stage.stats[stat]
        return n

    def flush(self) -> EngineOutput:
        # Idle is no reason to release here: only the marks say when every host has been heard.
        return self.stage.advance()

    @property
    def pending(self) -> int:
        return 0

    def set_rules(self, rules: Any) -> None:
        """The fleet stage runs no rules."""

    def checkpoint_offset(self, next_offset: int) -> int:
        """Where a checkpoint taken now resumes: at the oldest message whose records the stage
        still holds back, which its snapshot leaves out (``FleetStage.snapshot``)."""
        at = self.stage.resume_at()
        return next_offset if at is None else min(at, next_offset)

    def snapshot(self) -> bytes:
        return self.stage.snapshot(replayable=True)

    def restore(self, blob: bytes) -> None:
        try:
            self.stage.restore(blob, self._decode)
        except StateError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged checkpoint costs its partition, as the host stage's
            raise StateError(f"cannot restore the fleet stage: {e}") from e
