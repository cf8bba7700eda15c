"""Hosts whose records come on more than one telemetry partition.

A host's state (its windows, clock, absence, peers) lives in the engine of the partition its
messages land on, which the Kafka key decides: ``gpuwarden``'s producers key every message by
its host. A producer that does not (no key, so the client spreads messages round robin; a GPU's
UUID) splits a host between engines, each seeing part of its samples: gaps that are not there,
peer comparisons of half a host, an alert missed or raised twice. Nothing in one message shows
it, so the service looks across its partitions' engines from time to time (``Upkeep``), and
a fleet partition across the host stages that forward to it (``SenderLog``): every replica's
host stage forwards there (models on), so it sees a host split between replicas that each
hold one of its partitions, which no one process's engines show.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np

from pipeline.engine import Engine

MAX_LOGGED_HOSTS = 200_000  # hosts a fleet partition keeps senders for: far beyond a fleet, bounded


def split_hosts(engines: Mapping[int, Engine], horizon_s: float) -> dict[str, list[int]]:
    """Hosts that more than one of ``engines`` (by partition) heard from within ``horizon_s`` of
    event time before the newest record any of them has, with those partitions. A host its
    partition lost long ago (partitions were added, which moves hosts) is not one.

    >>> from pipeline.schema import dcgm
    >>> a, b = Engine(row_checks=[], tick_checks=[]), Engine(row_checks=[], tick_checks=[])
    >>> _ = a.process([dcgm(100.0, "n1", 0, {}), dcgm(100.0, "n2", 0, {})])
    >>> _ = b.process([dcgm(101.0, "n1", 0, {})])
    >>> split_hosts({0: a, 1: b}, 30.0)
    {'n1': [0, 1]}
    """
    newest = [(p, e.clock.hwm[: e.entities.n_hosts]) for p, e in engines.items()]
    top = max((float(np.nanmax(h)) for _, h in newest if len(h) and not np.isnan(h).all()), default=-math.inf)
    seen: dict[str, list[int]] = {}
    for p, hwm in sorted(newest, key=lambda x: x[0]):
        with np.errstate(invalid="ignore"):
            recent = np.flatnonzero(hwm >= top - horizon_s)
        names = engines[p].entities.hosts
        for i in recent.tolist():
            seen.setdefault(names[i], []).append(p)
    return {h: ps for h, ps in seen.items() if len(ps) > 1}


class SenderLog:
    """Which telemetry partitions' host stages forwarded each host's DCGM records, and the
    newest event time from each: what ``split`` reads. Only DCGM records count: a collective's
    records (NCCL, RAS) name the ranks' hosts from wherever their tool ran, so one host's come
    from another's partition by design. At most ``max_hosts`` hosts are kept (``untracked``
    counts the notes of further hosts, one per host a message names).

    >>> log = SenderLog()
    >>> log.note(["n1", "n2"], 0, 100.0)
    >>> log.note(["n1"], 3, 101.0)
    >>> log.split(30.0)
    {'n1': [0, 3]}
    """

    def __init__(self, max_hosts: int = MAX_LOGGED_HOSTS) -> None:
        self.max_hosts = max_hosts
        self.seen: dict[str, dict[int, float]] = {}
        self.newest = -math.inf
        self.untracked = 0

    def note(self, hosts: Iterable[str], sender: int, ts: float) -> None:
        """``hosts`` came from ``sender`` (a telemetry partition) in records up to event time ``ts``."""
        if ts > self.newest:
            self.newest = ts
        for h in hosts:
            by = self.seen.get(h)
            if by is None:
                if len(self.seen) >= self.max_hosts:
                    self.untracked += 1
                    continue
                by = self.seen[h] = {}
            if by.get(sender, -math.inf) < ts:
                by[sender] = ts

    def split(self, horizon_s: float) -> dict[str, list[int]]:
        """Hosts that came from more than one partition within ``horizon_s`` of event time before
        the newest record, with those partitions; a sender older than that is forgotten (a host
        moves when partitions are added), and a host with none left."""
        lo = self.newest - horizon_s
        out: dict[str, list[int]] = {}
        for h in list(self.seen):
            by = self.seen[h]
            for p in [p for p, t in by.items() if t < lo]:
                del by[p]
            if not by:
                del self.seen[h]
            elif len(by) > 1:
                out[h] = sorted(by)
        return out
