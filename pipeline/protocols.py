"""The serve path's interfaces: what the drivers feed, what a host stage forwards to, and what the
service's commit protocol drives (docs/architecture.md §8).

- ``Detector``: fed batches of records by replay, the demo, the evaluation and each service
  partition; an ``Engine`` or a ``Topology`` (``pipeline/topology.py``).
- ``FleetSide``: what a host stage forwards its accepted records and its progress to; the
  ``FleetStage`` of a ``Topology`` in process, the service's ``Outbox`` to the fleet topic.
- ``PartitionTask``: one partition of the service's input, as its commit protocol drives it; the
  host stage's ``Pipeline`` (``pipeline/runner.py``), the fleet stage's ``FleetTask``.
- ``IncidentSource``: a partition task that runs the incident stage on its alerts (the fleet
  stage's task); the service's ``/incidents`` page reads the open incidents of each it holds.

Conformance is checked in tests/unit/test_protocols.py, at run time (``runtime_checkable``) and by
mypy (assignments to these types).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, runtime_checkable

from pipeline.engine import EngineOutput
from pipeline.schema import TelemetryRecord

if TYPE_CHECKING:
    from pipeline.bus.base import Message
    from collections import Counter

    from pipeline.engine import EngineConfig
    from pipeline.engine.stage import Stage
    from pipeline.incidents import IncidentStage
    from pipeline.runner import Totals


@runtime_checkable
class Detector(Protocol):
    """What the drivers feed: batches of records in, alerts and dead letters out, its state as bytes."""

    @property
    def config(self) -> EngineConfig: ...

    @property
    def rules(self) -> Stage | None:  # the engine knows its rule set as a stage (pipeline/engine/stage.py)
        ...

    @property
    def models(self) -> Stage | None:  # likewise its model set
        ...

    @property
    def stats(self) -> Counter[str]: ...

    @property
    def released(self) -> float: ...

    def hosts_ahead(self) -> dict[str, float]: ...

    @property
    def held_dropped(self) -> dict[str, int]: ...

    @property
    def decode_fields(self) -> tuple[str, ...]: ...

    @property
    def pending(self) -> int: ...

    def set_rules(self, rules: Stage) -> None: ...

    def process(
        self, records: Sequence[TelemetryRecord], origins: Sequence[str] | None = None, now: float | None = None
    ) -> EngineOutput: ...

    def flush(self) -> EngineOutput: ...

    def snapshot(self) -> bytes: ...

    def restore(self, blob: bytes) -> None: ...


@runtime_checkable
class FleetSide(Protocol):
    """What a host stage forwards to: its accepted records (``feed``) and how far it has released
    (``mark``: every record it forwards later is at or after ``upto``; ``final``: it holds nothing
    back; ``hosts``: hosts it has released further on their own, each with how far: it forwards
    no more of that host's DCGM samples before it). The ``FleetStage`` in process, the service's
    ``Outbox`` to the fleet topic."""

    def feed(self, records: Sequence[TelemetryRecord]) -> None: ...

    def mark(
        self, upstream: int, upto: float, final: bool = False, *, hosts: Mapping[str, float] | None = None
    ) -> None: ...


@runtime_checkable
class PartitionTask(Protocol):
    """One partition of the service's input, as its commit protocol drives it (pipeline/service/)."""

    @property
    def totals(self) -> Totals: ...

    @property
    def pending(self) -> int: ...

    def handle_guarded(self, messages: Sequence[Message]) -> EngineOutput: ...

    def flush(self) -> EngineOutput: ...

    def checkpoint_offset(self, next_offset: int) -> int: ...

    def snapshot(self) -> bytes: ...

    def restore(self, blob: bytes) -> None: ...


@runtime_checkable
class IncidentSource(Protocol):
    """A partition task that runs the incident stage (docs/architecture.md, "Incidents") on the
    alerts it makes: ``incidents`` is that stage, or None where it runs none."""

    @property
    def incidents(self) -> IncidentStage | None: ...
