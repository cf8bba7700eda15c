"""NIC records held until the engine's watermark passes them: what the NIC stages share.

The port checks (``ports.PortStage``) and the NICs' AER checks (``nicaer.NicAerStage``) judge
their records in event time, so each holds what arrived until the engine releases a watermark
past it (``Stage.nic_release``). The hold is bounded: past ``limit`` records the oldest go
first, counted in ``dropped``.

>>> from pipeline.schema import NicRecord
>>> hold = NicHold(limit=2, order=("ts", "host", "device"))
>>> hold.arrive([NicRecord(ts=t, host="n1", device="mlx5_0", port=1) for t in (3.0, 1.0, 2.0)])
>>> [r.ts for r in hold.take(2.5)], hold.dropped, len(hold)
([2.0], 1, 1)
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import msgspec

from pipeline.schema import NicRecord

_records = msgspec.json.Decoder(list[NicRecord])


class NicHold:
    """At most ``limit`` NIC records, released in event time (``order``: the sort keys)."""

    def __init__(self, limit: int, order: tuple[str, ...]) -> None:
        self.limit = limit
        self.order = operator.attrgetter(*order)
        self.records: list[NicRecord] = []
        self.dropped = 0  # records past ``limit``

    def __len__(self) -> int:
        return len(self.records)

    def arrive(self, records: Iterable[NicRecord]) -> None:
        """Hold ``records``; past the limit the oldest go (counted in ``dropped``)."""
        self.records.extend(records)
        over = len(self.records) - self.limit
        if over > 0:
            self.records.sort(key=self.order)
            del self.records[:over]
            self.dropped += over

    def take(self, upto: float) -> list[NicRecord]:
        """The held records older than ``upto`` (inf: all), in event time; they leave the hold."""
        go = [r for r in self.records if r.ts < upto]
        if go:
            self.records = [r for r in self.records if not r.ts < upto]
            go.sort(key=self.order)
        return go

    def to_state(self) -> bytes:
        """The held records as JSON (a snapshot's ``pending``)."""
        return msgspec.json.encode(self.records)

    def load_state(self, blob: bytes) -> None:
        """Take back ``to_state``'s records; raises ``msgspec.DecodeError`` on anything else."""
        self.records = _records.decode(blob)
