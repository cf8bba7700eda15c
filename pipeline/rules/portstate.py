"""One NIC port's past, as the port checks (``pipeline.rules.ports``) keep it between records,
and its plain-data form for the engine's snapshot."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pipeline.rules import portrates


@dataclass
class PortPast:
    """What one port's past says: seen ACTIVE, ACTIVE at its last sample, gone down since,
    its returns to ACTIVE and symbol errors within their windows, its counters' last values;
    the rate checks' snapshots and verdicts, the windowed checks' increases, when it was last
    polled and its last state; the checks' conditions at its last record (a check that reads a
    counter stuck at its width's maximum holds its own), and the windows' running sums."""

    seen_active: bool = False
    up: bool | None = None
    went_down: bool = False
    flaps: deque = field(default_factory=deque)  # event times of returns to ACTIVE
    errors: deque = field(default_factory=deque)  # (event time, symbol errors since the sample before)
    prev: dict[str, int] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)
    netdev: str | None = None
    link_layer: str | None = None
    peer: dict[str, str] = field(default_factory=dict)  # the link partner's labels (``peer``, ``peer_port``...)
    rates: portrates.Rates = field(default_factory=dict)
    sums: dict[str, deque] = field(default_factory=dict)  # windowed check -> (event time, increase)
    last_polled: float = math.nan
    state: int | None = None
    phys_state: int | None = None
    cond: dict[str, bool] = field(default_factory=dict)  # check -> its condition at the last record
    saturated: list[str] = field(default_factory=list)  # counters at their width's maximum, as last read
    errors_sum: int = 0  # sum of ``errors``' increases
    sums_total: dict[str, int] = field(default_factory=dict)  # windowed check -> sum of its ``sums``

    def to_state(self) -> dict[str, Any]:
        return {
            "seen": self.seen_active,
            "up": -1 if self.up is None else int(self.up),
            "down": self.went_down,
            "flaps": list(self.flaps),
            "errors": [list(e) for e in self.errors],
            "prev": self.prev,
            "gpus": self.gpus,
            "netdev": self.netdev,
            "ll": self.link_layer,
            "peer": self.peer,
            "rates": portrates.to_state(self.rates),
            "sums": {k: [list(e) for e in v] for k, v in self.sums.items()},
            "polled": None if math.isnan(self.last_polled) else self.last_polled,
            "st": [self.state, self.phys_state],
            "held": [k for k, v in self.cond.items() if v],
            "sat": list(self.saturated),
        }

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "PortPast":
        state, phys_state = (None if x is None else int(x) for x in d.get("st", [None, None]))
        port = cls(
            bool(d["seen"]),
            None if d["up"] == -1 else bool(d["up"]),
            bool(d["down"]),
            deque(float(t) for t in d["flaps"]),
            deque((float(t), int(n)) for t, n in d["errors"]),
            {str(k): int(v) for k, v in d["prev"].items()},
            [int(g) for g in d["gpus"]],
            d["netdev"],
            d["ll"],
            {str(k): str(v) for k, v in d.get("peer", {}).items()},  # absent in a snapshot from before peers
            portrates.from_state(d.get("rates", {})),
            {str(k): deque((float(t), int(n)) for t, n in v) for k, v in d.get("sums", {}).items()},
            math.nan if d.get("polled") is None else float(d["polled"]),
            state,
            phys_state,
            # Both absent in a snapshot from before saturation: nothing held.
            cond={str(k): True for k in d.get("held", [])},
            saturated=[str(n) for n in d.get("sat", [])],
        )
        port.errors_sum = sum(n for _, n in port.errors)
        port.sums_total = {k: sum(n for _, n in q) for k, q in port.sums.items()}
        return port
