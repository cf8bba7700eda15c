"""Messages -> decoder -> engine: the step every driver (service, replay, demo, bench) shares."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from pipeline.bus.base import Message
from pipeline.decode import Decoder
from pipeline.engine import Engine, EngineOutput


@dataclass
class Totals:
    messages: int = 0
    records: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    alerts: Counter[str] = field(default_factory=Counter)   # firing alerts by fault family

    def add(self, out: EngineOutput) -> None:
        for d in out.dead:
            self.dead[d.reason] += 1
        for a in out.alerts:
            if a.state == "firing":
                self.alerts[a.family] += 1


class _Origins(Sequence[str]):
    """The messages' origins, spelled out only when one is read (by a dead letter)."""

    __slots__ = ("messages",)

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [m.origin for m in self.messages[i]]
        return self.messages[i].origin


class Pipeline:
    """Decode a batch of messages and feed the engine; dead letters from both stages come back."""

    def __init__(self, engine: Engine | None = None, decoder: Decoder | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        """``clock``: a live consumer's monotonic wall clock (see ``EngineConfig.idle_timeout``)."""
        self.engine = engine or Engine()
        self.decoder = decoder or Decoder()
        self.clock = clock
        self.totals = Totals()

    def handle(self, messages: Sequence[Message]) -> EngineOutput:
        out = EngineOutput()
        if self.decoder.fields is not self.engine.decode_fields:   # new engine or rules reloaded
            self.decoder.set_fields(self.engine.decode_fields)
        d = self.decoder.decode_many([m.value for m in messages], _Origins(messages))
        records, origins = d.records, d.origins
        out.dead.extend(d.dead)
        out.extend(self.engine.process(records, origins, now=self.clock() if self.clock else None))
        self.totals.messages += len(messages)
        self.totals.records += len(records)
        self.totals.add(out)
        return out

    def flush(self) -> EngineOutput:
        out = self.engine.flush()
        self.totals.add(out)
        return out
