"""Hosts whose records come on more than one telemetry partition.

A host's state (its windows, clock, absence, peers) lives in the engine of the partition its
messages land on, which the Kafka key decides: ``gpuwarden``'s producers key every message by
its host. A producer that does not (no key, so the client spreads messages round robin; a GPU's
UUID) splits a host between engines, each seeing part of its samples: gaps that are not there,
peer comparisons of half a host, an alert missed or raised twice. Nothing in one message shows
it, so the service looks across its partitions' engines from time to time (``Upkeep``).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from pipeline.engine import Engine


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
