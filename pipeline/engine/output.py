"""What the engine gives back for a batch, and the origins of records handed over without any."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, overload

from pipeline.rows import Batches
from pipeline.schema import AlertEvent, DeadLetter


@dataclass
class EngineOutput:
    """The alert state changes and dead letters a batch (or a flush) caused, in order, and the
    records a host stage accepted for its fleet side (``forwarded``, each batch's in the shape
    it came in, columns or records; empty unless the engine ``forwards``)."""

    alerts: list[AlertEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    forwarded: Batches = field(default_factory=Batches)

    def extend(self, other: "EngineOutput") -> None:
        """Append ``other``'s alerts, dead letters and forwarded records to these."""
        self.alerts.extend(other.alerts)
        self.dead.extend(other.dead)
        self.forwarded.parts.extend(other.forwarded.parts)


class Numbered(Sequence[str]):
    """``batch#0``, ``batch#1``, ...: the origins of records handed over without any, spelled
    only when a dead letter reads one.

    >>> list(Numbered("batch", 2)), Numbered("batch", 3)[2]
    (['batch#0', 'batch#1'], 'batch#2')
    """

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [f"{self.name}#{j}" for j in range(*i.indices(self.n))]
        # range() raises IndexError past the end: iteration (Sequence.__iter__) stops there.
        return f"{self.name}#{range(self.n)[i]}"
