"""Replay recorded telemetry files through the engine, as fast as it goes, in event time."""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

from pipeline.bus.base import Message
from pipeline.bus.files import FileSink, read_lines
from pipeline.engine import Engine, EngineOutput
from pipeline.runner import Pipeline, Totals
from pipeline.schema import encode


@dataclass
class ReplayResult:
    totals: Totals
    seconds: float
    alerts: int

    @property
    def records_per_s(self) -> float:
        return self.totals.records / self.seconds if self.seconds > 0 else 0.0


def _batches(messages: Iterable[Message], size: int) -> Iterator[list[Message]]:
    it = iter(messages)
    while batch := list(islice(it, size)):
        yield batch


def replay(paths: list[str | Path], *, engine: Engine | None = None, alerts_out: str | None = None,
           dlq_out: str | None = None, batch_size: int = 2000,
           on_batch: Callable[[int, EngineOutput], None] | None = None) -> ReplayResult:
    """Run every line of ``paths`` through a pipeline; write alerts and dead letters as JSONL."""
    pipe = Pipeline(engine)
    alerts_sink = FileSink(alerts_out, atomic=True) if alerts_out else None
    dlq_sink = FileSink(dlq_out, atomic=True) if dlq_out else None
    n_alerts = 0
    t0 = time.perf_counter()

    def emit(out: EngineOutput, n_msgs: int) -> None:
        nonlocal n_alerts
        n_alerts += len(out.alerts)
        if alerts_sink:
            alerts_sink.write_many(encode(a) for a in out.alerts)
        if dlq_sink:
            dlq_sink.write_many(encode(d) for d in out.dead)
        if on_batch:
            on_batch(n_msgs, out)

    try:
        for path in paths:
            for batch in _batches(read_lines(path), batch_size):
                emit(pipe.handle_guarded(batch), len(batch))
        emit(pipe.flush(), 0)
    finally:
        for sink in (alerts_sink, dlq_sink):
            if sink:
                sink.close()
    return ReplayResult(pipe.totals, time.perf_counter() - t0, n_alerts)
