"""Two stages of detection in one object: per host, then across hosts (docs/architecture.md §8).

Detection that needs one host's data (the rules, absence) runs in the **host stage**, an engine
keyed by host: any partitioning of hosts gives it the same answer. Detection that compares
across hosts runs in the **fleet stage** (``pipeline.fleetstage.FleetStage``: its watermark from
upstream, its input in canonical order), fed what the host stage accepted and released.

``Topology`` runs both stages in one process, fed like an ``Engine`` (replay, the demo, the
evaluation, each service partition); without a local fleet stage it is the service's host
stage, whose forwards go to the fleet topic. Dead letters come from the host stage, which
screened the records the fleet stage sees (the values of either stage's fields:
``Engine.screen_for``), and from the fleet stage only for what it alone can cause.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import msgspec

from pipeline import rows
from pipeline.engine import Engine, EngineConfig, EngineOutput
from pipeline.engine.stage import Stage
from pipeline.errors import StateError
from pipeline.fleetstage import FleetStage, records_decoder
from pipeline.hang import HangDetector
from pipeline.schema import ProgressRecord, TelemetryRecord

STATE_VERSION = 1  # the two-stage snapshot's (the fleet stage's part has its own)


class Topology:
    """Both stages, fed like an ``Engine`` (a ``Detector``: ``process``/``flush``/``snapshot``).

    ``process`` returns what the host stage forwarded (``EngineOutput.forwarded``). With
    ``local_fleet`` (the default) a ``FleetStage`` in this process gets it and its alerts join the
    output; without, the caller sends it on (the service's host stage, to the fleet topic).

    >>> from pipeline.schema import dcgm
    >>> from pipeline.engine import Engine
    >>> topo = Topology(Engine(), lambda: Engine(row_checks=[], tick_checks=[], screened=True))
    >>> out = topo.process([dcgm(1764403200.0 + t, "n1", 0, {"gpu_temp": 50}) for t in range(5)])
    >>> len(out.forwarded)
    5
    >>> out.extend(topo.flush())
    >>> topo.fleet.engine().stats["records.dcgm"]
    5
    """

    def __init__(
        self,
        host: Engine,
        make_fleet_engine: Callable[[], Engine],
        local_fleet: bool = True,
        make_hang: Callable[[], HangDetector] | None = None,
        progress_only: bool = False,
        fleet: FleetStage | None = None,
    ) -> None:
        """``make_hang``: the fleet stage's hang detector; ``progress_only``: the fleet stage runs
        it alone (rules only), so the host stage forwards only the progress records; ``fleet``: a
        local fleet stage built by the caller (the models in shards, pipeline/shards.py)."""
        self.host = host
        self.progress_only = progress_only
        self.make_fleet_engine = make_fleet_engine
        if fleet is None and local_fleet:
            fleet = FleetStage(make_fleet_engine, hang=make_hang() if make_hang is not None else None)
        self.fleet: FleetStage | None = fleet if local_fleet else None
        self._template: Engine | None = None  # what the fleet stage reads, without a local one
        # The host stage returns what it accepted in its output (``EngineOutput.forwarded``),
        # its values screened as the fleet stage reads them: a bad one is dead-lettered there.
        self.host.forwards = True
        if not progress_only:
            self.host.screen_for(self.fleet_engine().columns)
        self._fields: tuple[str, ...] | None = None

    def fleet_engine(self) -> Engine:
        """A fleet engine as the fleet stage builds it: what it reads, which models it runs."""
        if self.fleet is not None:
            return self.fleet.engine()
        if self._template is None:
            self._template = self.make_fleet_engine()
        return self._template

    # What the drivers read of an engine (``Detector``).
    @property
    def config(self) -> EngineConfig:
        return self.host.config

    @property
    def rules(self) -> Stage | None:
        return self.host.rules

    @property
    def models(self) -> Stage | None:
        return self.fleet_engine().models

    @property
    def stats(self) -> Counter[str]:
        return self.host.stats

    @property
    def released(self) -> float:
        return self.host.released

    def hosts_ahead(self) -> dict[str, float]:
        """The host stage's hosts whose rows went ahead of ``released`` (``Engine.hosts_ahead``)."""
        return self.host.hosts_ahead()

    @property
    def held_dropped(self) -> dict[str, int]:
        """The host stage's held records let go past their bound (``Engine.held_dropped``): the
        fleet stage's engines hold none."""
        return self.host.held_dropped

    @property
    def decode_fields(self) -> tuple[str, ...]:
        """Both stages' fields, as one tuple object while neither changes (the runner compares
        by identity to know when to tell its decoder)."""
        names = tuple(dict.fromkeys(self.host.decode_fields + self.fleet_engine().decode_fields))
        if self._fields != names:
            self._fields = names
        return self._fields

    def set_rules(self, rules: Stage) -> None:
        self.host.set_rules(rules)

    def process(
        self, records: Sequence[TelemetryRecord], origins: Sequence[str] | None = None, now: float | None = None
    ) -> EngineOutput:
        """The host stage's output for the batch with the records it forwarded (``forwarded``),
        and with a local fleet stage what that released after them."""
        out = self.host.process(records, origins, now)
        if self.progress_only and out.forwarded.parts:
            out.forwarded = rows.Batches(_progress(rows.split(p)[1]) for p in out.forwarded.parts)
        if self.fleet is not None:
            self.fleet.feed(out.forwarded.joined())
            self.fleet.mark(0, self.host.released)
            out.extend(self.fleet.advance())
        return out

    def flush(self) -> EngineOutput:
        out = self.host.flush()
        if self.fleet is not None:
            out.extend(self.fleet.flush())
        return out

    @property
    def pending(self) -> int:
        return self.host.pending + (self.fleet.pending if self.fleet is not None else 0)

    def snapshot(self) -> bytes:
        """Both stages' state; without a local fleet stage its part is empty (the fleet stage
        checkpoints its own, and what was not sent is sent again by the replay)."""
        fleet = self.fleet.snapshot() if self.fleet is not None else b""
        return msgspec.msgpack.encode({"topology": STATE_VERSION, "host": self.host.snapshot(), "fleet": fleet})

    def restore(self, blob: bytes) -> None:
        try:
            d = msgspec.msgpack.decode(blob)
        except msgspec.DecodeError as e:
            raise StateError(f"cannot restore the topology: {e}") from e
        if isinstance(d, dict) and "topology" not in d and self.progress_only and self.fleet is None:
            # A rules-only host stage checkpointed before it ran the hang detector: its engine
            # alone, which is all this side of the stages holds (the fleet stage keeps its own).
            self.host.restore(blob)
            return
        if not isinstance(d, dict) or d.get("topology") != STATE_VERSION:
            raise StateError("not a two-stage snapshot (written by an engine with the models in one stage?)")
        self.host.restore(d["host"])
        if self.fleet is not None:
            self.fleet.restore(d["fleet"], records_decoder(self.fleet.engine().decode_fields))


def _progress(records: Sequence[TelemetryRecord]) -> Sequence[TelemetryRecord]:
    """The progress records of ``records`` (the decoder's subclasses too), in their order.

    >>> from pipeline.schema import dcgm
    >>> [type(r).__name__ for r in _progress([dcgm(1.0, "n", 0, {}), ProgressRecord(ts=1.0, host="n", rank=0,
    ...                                                                             source="ras", state="progress")])]
    ['ProgressRecord']
    """
    types = set(map(type, records))
    progress = {t for t in types if issubclass(t, ProgressRecord)}
    if not progress:
        return []  # most batches: the type test per distinct type, not per record
    if types == progress:
        return records
    return [r for r in records if type(r) in progress]
