"""Records held until the engine's watermark passes them: what the stages that judge records
as they are share (``Stage.nic_release``, ``NcclReader.nccl_release``).

The NIC port checks (``pipeline.rules.ports.PortStage``), the NICs' AER checks
(``pipeline.rules.nicaer.NicAerStage``) and the NCCL wrong-results check
(``wrongresults.WrongResults``) judge their records in event time, so each holds what arrived
until the engine releases a watermark past it. The hold is bounded: past ``limit`` records the
oldest go first, counted in ``dropped``.

>>> from pipeline.schema import NicRecord
>>> hold = Hold(NicRecord, limit=2, order=("ts", "host", "device"))
>>> hold.arrive([NicRecord(ts=t, host="n1", device="mlx5_0", port=1) for t in (3.0, 1.0, 2.0)])
1
>>> [r.ts for r in hold.take(2.5)], hold.dropped, len(hold)
([2.0], 1, 1)
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

import msgspec

R = TypeVar("R")


class Hold(Generic[R]):
    """At most ``limit`` records of type ``kind`` (a msgspec struct with ``ts``), released in
    event time (``order``: the sort keys)."""

    def __init__(self, kind: type[R], limit: int, order: tuple[str, ...]) -> None:
        self.limit = limit
        self.order = operator.attrgetter(*order)
        self.records: list[R] = []
        self.dropped = 0  # records past ``limit``
        self._decode: Any = msgspec.json.Decoder(list[kind])  # type: ignore[valid-type]

    def __len__(self) -> int:
        return len(self.records)

    def arrive(self, records: Iterable[R]) -> int:
        """Hold ``records``; past the limit the oldest go (counted in ``dropped``): how many went."""
        self.records.extend(records)
        over = len(self.records) - self.limit
        if over > 0:
            self.records.sort(key=self.order)
            del self.records[:over]
            self.dropped += over
        return max(over, 0)

    def take(self, upto: float) -> list[R]:
        """The held records older than ``upto`` (inf: all), in event time; they leave the hold."""
        go = [r for r in self.records if r.ts < upto]  # type: ignore[attr-defined]
        if go:
            self.records = [r for r in self.records if not r.ts < upto]  # type: ignore[attr-defined]
            go.sort(key=self.order)
        return go

    def to_state(self) -> bytes:
        """The held records as JSON (a snapshot's ``pending``)."""
        return msgspec.json.encode(self.records)

    def load_state(self, blob: bytes) -> None:
        """Take back ``to_state``'s records; raises ``msgspec.DecodeError`` (or ``ValidationError``)
        on anything else."""
        self.records = self._decode.decode(blob)
