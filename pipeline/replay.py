"""Replay recorded telemetry files through the engine, as fast as it goes, in event time; the
alerts through the incident stage when one is given (docs/architecture.md, "Incidents")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

from pipeline.bus.base import Message
from pipeline.bus.files import FileSink, read_merged
from pipeline.bus.sinks import FileOutput, OutputSink
from pipeline.engine import EngineOutput
from pipeline.incidents import IncidentStage
from pipeline.incidents.feed import AlertFeed
from pipeline.protocols import Detector
from pipeline.runner import Pipeline, Totals
from pipeline.schema import encode
from pipeline.topology import Topology


@dataclass
class ReplayResult:
    totals: Totals
    seconds: float
    alerts: int
    incidents: int = 0  # incidents opened
    incident_events: int = 0
    # What kept part of a file from being read, one line each, naming the file: it was skipped
    # (not gzip, unreadable) or ended early (a truncated or damaged gzip); the others were replayed.
    problems: list[str] = field(default_factory=list)
    late_by_file: dict[str, int] = field(default_factory=dict)  # `late` dead letters by file

    @property
    def records_per_s(self) -> float:
        return self.totals.records / self.seconds if self.seconds > 0 else 0.0


def incident_watermark(detector: Detector) -> float:
    """How far the alerts of ``detector`` are complete, for the incident stage's ``AlertFeed``:
    its fleet stage's watermark (inf once it flushed), or the engine's ``released`` in one stage.
    The service's fleet stage releases its feed by the same rule (``FleetTask``)."""
    if isinstance(detector, Topology) and detector.fleet is not None:
        return max(detector.fleet.released, detector.fleet.last_watermark)
    return detector.released


def _batches(messages: Iterable[Message], size: int) -> Iterator[list[Message]]:
    it = iter(messages)
    while batch := list(islice(it, size)):
        yield batch


def replay(
    paths: list[str | Path],
    *,
    engine: Detector | None = None,
    alerts_out: str | None = None,
    dlq_out: str | None = None,
    batch_size: int = 2000,
    on_batch: Callable[[int, EngineOutput], None] | None = None,
    sink: OutputSink | None = None,
    incidents: IncidentStage | None = None,
    incidents_out: str | None = None,
) -> ReplayResult:
    """Run every line of ``paths`` through a pipeline; write alerts and dead letters as JSONL
    (``alerts_out``, ``dlq_out``), or through ``sink`` when given (closed at the end either way).
    With ``incidents``, the alerts go through that stage too and its incident events are written
    to ``incidents_out`` (JSONL, ``.gz`` compressed, ``-`` standard output) when given. Several
    files are merged in event time (``read_merged``). A file that
    cannot be read, or is cut short, is named in the result's ``problems``; the rest are replayed."""
    pipe = Pipeline(engine)
    out_sink: OutputSink = sink if sink is not None else FileOutput(alerts_out, dlq_out)
    inc_sink = FileSink(incidents_out, atomic=True) if incidents is not None and incidents_out else None
    # The alerts reach the incident stage in canonical order, as in the service (AlertFeed).
    feed = incidents.feed() if incidents is not None else AlertFeed()
    n_alerts = n_opened = n_events = 0
    problems: list[str] = []
    late: dict[str, int] = {}
    t0 = time.perf_counter()

    def emit(out: EngineOutput, n_msgs: int, final: bool = False) -> None:
        nonlocal n_alerts, n_opened, n_events
        n_alerts += len(out.alerts)
        out_sink.alerts(out.alerts)
        out_sink.dead(out.dead)
        for d in out.dead:
            if d.reason == "late":
                f = d.origin.rsplit(":", 1)[0]
                late[f] = late.get(f, 0) + 1
        if incidents is not None:
            feed.add(out.alerts)
            events = incidents.process(feed.flush() if final else feed.release(incident_watermark(pipe.engine)))
            n_events += len(events)
            n_opened += sum(e.state == "opened" for e in events)
            if inc_sink is not None:
                inc_sink.write_many(encode(e) for e in events)
        if on_batch:
            on_batch(n_msgs, out)

    try:
        # Merged in event time: several hosts' recordings of the same hours interleave.
        for batch in _batches(read_merged(paths, problems), batch_size):
            emit(pipe.handle_guarded(batch), len(batch))
        emit(pipe.flush(), 0, final=True)
    finally:
        try:
            out_sink.close()
        finally:
            if inc_sink is not None:
                inc_sink.close()
    return ReplayResult(pipe.totals, time.perf_counter() - t0, n_alerts, n_opened, n_events, problems, late)
