"""The host stage's side of ``<prefix>.fleet`` (docs/operations.md, "Topology"): what a host-stage
task forwarded, its alerts and its marks queue in an ``Outbox`` until the service sends them with
the batch's alerts. What the messages hold and their envelope: ``pipeline.service.fleetwire``;
what a fleet-stage partition makes of them: ``pipeline.service.fleet``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import msgspec

from pipeline import rows
from pipeline.rows import Batches
from pipeline.schema import AlertEvent, NcclRecord, TelemetryRecord
from pipeline.service.fleetwire import MAX_FORWARD_ALERTS, AlertBatch, Mark, Send, wrap
from pipeline.service.forwarded import MAX_FORWARD, Encoder
from pipeline.shards import by_scorer, by_shard, shard_memo
from pipeline.fleetstage import FLEET_KEY

_KEY = FLEET_KEY.encode()


class Outbox:
    """Where a host-stage task's forwarded records, alerts and marks queue (a ``FleetSide``) until
    the service sends them with the batch's alerts (step 2 of the commit protocol, ``take``)."""

    def __init__(
        self,
        partition: int,
        n_upstream: int,
        topic: str,
        *,
        group: str = "",
        key: bytes | None = None,
        fields: Sequence[str] | None = None,
        shards: int | None = None,
        hosts_ahead: bool = True,
    ) -> None:
        """``partition``: the telemetry partition of the task (each message's sender). ``group``
        and ``key``: what each message's MAC binds it to and is made with (the fleet key,
        ``derived_key(state key, "fleet")``; None: unsigned, ``--insecure-state``). ``fields``:
        the DCGM fields the fleet stage's engine reads (``Engine.decode_fields``; None: all).
        ``shards``: the models run in that many shards, one per fleet partition
        (``service.shard_models``): a host's DCGM records go to its shard's partition
        (``shard_of``), an NCCL record to its lane's scorer's (``scorer_of``), the rest and the
        alerts to partition 0, each mark to every partition, naming the partitions it has sent
        NCCL records to (``Mark.nccl``). ``hosts_ahead``: each mark names the hosts released
        ahead of it (``Mark.hosts``; with shards, each partition's mark its own hosts), for a
        fleet stage whose engine is host-local (``Engine.host_local``)."""
        self.partition, self.n_upstream, self.topic = partition, n_upstream, topic
        self.hosts_ahead = hosts_ahead
        self.group, self.key = group, key
        self.shards = shards
        self._where: dict[str, int] = {}  # each host's fleet partition, hashed once
        self._nccl_to: set[int] = set()  # the fleet partitions sent NCCL records
        self._records = Batches()
        self._alerts: list[AlertEvent] = []
        self._mark: tuple[float, bool, dict[str, float] | None] | None = None
        self._sent: tuple[float, bool, dict[str, float] | None] | None = None
        self._enc = msgspec.json.Encoder()
        self._columns = Encoder(fields)

    def feed(self, records: Sequence[TelemetryRecord]) -> None:
        """Queue records the host stage accepted (a ``Batches``' parts each in its shape)."""
        if isinstance(records, Batches):
            self._records.parts.extend(records.parts)
        else:
            self._records.add(records)

    def alerts(self, events: Sequence[AlertEvent]) -> None:
        """Queue the host stage's alerts for the fleet stage's incident stage."""
        self._alerts.extend(events)

    def mark(
        self, upstream: int, upto: float, final: bool = False, *, hosts: Mapping[str, float] | None = None
    ) -> None:
        """Queue this task's progress (``upstream``: its partition, which every message names
        as its sender anyway) and its hosts released ahead of it (``hosts``, sent with
        ``hosts_ahead``); only the latest is sent."""
        ahead = dict(hosts) if hosts and self.hosts_ahead else None
        self._mark = (upto, final, ahead)

    @property
    def upto(self) -> float:
        """The latest mark's bound (-inf before any)."""
        return self._mark[0] if self._mark is not None else -math.inf

    def take(self) -> list[Send]:
        """The messages to send now: the records, the alerts, then a mark when it moved (all keyed
        alike, so the mark lands after what it covers on their partition)."""
        out: list[Send] = []
        recs, self._records = self._records.joined(), Batches()
        to = None if self.shards is None else 0  # the incident stage's partition: alerts
        for part, chunk in self._by_partition(recs):
            for i in range(0, len(chunk), MAX_FORWARD):
                out.append((self.topic, _KEY, self._wrap(self._columns.encode(chunk[i : i + MAX_FORWARD])), part))
        alerts, self._alerts = self._alerts, []
        for i in range(0, len(alerts), MAX_FORWARD_ALERTS):
            body = self._enc.encode(AlertBatch(alerts[i : i + MAX_FORWARD_ALERTS]))
            out.append((self.topic, _KEY, self._wrap(body), to))
        if self._mark is not None and self._mark != self._sent:
            upto, final, ahead = self._mark
            if self.shards is None:
                out.append((self.topic, _KEY, self._mark_body(upto, final, ahead), None))
            else:
                nccl = sorted(self._nccl_to)
                mine: list[dict[str, float]] = [{} for _ in range(self.shards)]
                for h, t in (ahead or {}).items():
                    mine[shard_memo(h, self.shards, self._where)][h] = t
                for p in range(self.shards):
                    out.append((self.topic, _KEY, self._mark_body(upto, final, mine[p] or None, nccl), p))
            self._sent = self._mark
        return out

    def _mark_body(
        self, upto: float, final: bool, ahead: dict[str, float] | None, nccl: list[int] | None = None
    ) -> bytes:
        return self._wrap(
            self._enc.encode(
                Mark(
                    self.partition, None if math.isinf(upto) and upto < 0 else upto, final, self.n_upstream, nccl, ahead
                )
            )
        )

    def _by_partition(self, recs: Sequence[TelemetryRecord]) -> list[tuple[int | None, Sequence[TelemetryRecord]]]:
        """The records by the fleet partition they go to (None: the key's), each in order;
        columns stay columns."""
        if self.shards is None or not len(recs):
            return [(None, recs)] if len(recs) else []
        dcgm, other = rows.split(recs)
        out: dict[int, Sequence[TelemetryRecord]] = dict(by_shard(dcgm, self.shards, self._where))
        for p, mine in by_scorer(other, self.shards).items():
            if p not in self._nccl_to and any(isinstance(r, NcclRecord) for r in mine):
                self._nccl_to.add(p)
            # An NCCL record goes to its lane's scorer, progress to partition 0, after the DCGM rows.
            out[p] = rows.concat([out.get(p, []), mine])[0]
        return sorted(out.items())

    def _wrap(self, body: bytes) -> bytes:
        return wrap(self.key, self.topic, self.group, self.partition, body)

    def final_sent(self) -> bool:
        return self._sent is not None and self._sent[1]
