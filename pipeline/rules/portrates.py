"""The port checks' rates: NVSentinel's velocity of a port's counters (docs/rules.md#nic-ports).

A rate check (``portconfig.RATE_CHECKS``) judges the increase of its ``counters`` over a span of
at least its ``window``, per ``window``, against its ``threshold``; the verdict holds until the
next span closes, so ports sampled every 1, 10 or 30 s are judged alike. ``ports.PortStage``
keeps one ``Rates`` per port: for each rate check its snapshot, ``[snapshot time, snapshot sum,
counters summed, verdict, rate, increase, span]``.

>>> from pipeline.rules.portconfig import DEFAULTS
>>> rates: Rates = {}
>>> check = DEFAULTS["link_error_recovery"]  # more than 5 a minute
>>> [velocity(rates, "link_error_recovery", check, NicRecord(ts=t, host="n1", device="mlx5_0", port=1,
...                                                          counters={"link_error_recovery": n}))
...  for t, n in [(0.0, 0), (30.0, 4), (60.0, 9)]]
[False, False, True]
>>> evidence(DEFAULTS, rates)
{'network_link_error_recovery': {'rate': 9.0, 'increase': 9, 'over_s': 60.0}}
"""

from __future__ import annotations

import math
from typing import Any

from pipeline.recordchecks import MAX_COUNTER
from pipeline.rules.portconfig import PortCheck
from pipeline.schema import NicRecord

Rates = dict[str, list]  # rate check -> [snapshot time, snapshot sum, counters summed, verdict, rate, increase, span]


def velocity(rates: Rates, key: str, c: PortCheck, r: NicRecord) -> bool:
    """Check ``key``'s verdict after record ``r``: the increase of ``c.counters`` since a snapshot
    at least ``c.window_s`` old, per ``c.window_s``, over ``c.threshold``; a span that closes
    replaces ``rates[key]``. A counter that fell (a reset) restarts the span with no verdict."""
    counters = r.counters
    snap = rates.get(key)
    if len(c.counters) == 1:
        one = counters.get(c.counters[0])
        if one is None:
            return bool(snap and snap[3])
        v, k = one, 1
    else:
        vals = [counters[n] for n in c.counters if n in counters]
        if not vals:
            return bool(snap and snap[3])
        # A sum of counters is a counter too, and stops at 2^64-1 as each one does: past it no
        # snapshot (msgpack's integers) could hold it.
        v, k = min(sum(vals), MAX_COUNTER), len(vals)
    t = r.ts
    if snap is None or k != snap[2] or v < snap[1]:
        rates[key] = [t, v, k, False, math.nan, 0, 0.0]
        return False
    span = t - snap[0]
    if span >= c.window_s - 1e-6:
        inc = v - snap[1]
        rate = inc / span * c.window_s
        rates[key] = [t, v, k, rate > c.threshold, rate, inc, span]
    return bool(rates[key][3])


def evidence(checks: dict[str, PortCheck], rates: Rates) -> dict[str, dict[str, Any]]:
    """An alert's ``rates``: each rate check's last closed span, by rule name (none before one closed)."""
    return {checks[k].name: {"rate": round(v[4], 6), "increase": v[5], "over_s": round(v[6], 3)}
            for k, v in rates.items() if k in checks and math.isfinite(v[4])}  # fmt: skip


def to_state(rates: Rates) -> dict[str, list]:
    """Plain data (a snapshot's ``rates``): NaN is None, as JSON has none.

    >>> to_state({"rcv_errors": [5.0, 3, 1, False, math.nan, 0, 0.0]})
    {'rcv_errors': [5.0, 3, 1, False, None, 0, 0.0]}
    """
    return {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v] for k, v in rates.items()}


def from_state(d: dict[str, Any]) -> Rates:
    """Take back ``to_state``'s data."""
    return {
        str(k): [float(v[0]), int(v[1]), int(v[2]), bool(v[3]), math.nan if v[4] is None else float(v[4]), int(v[5]),
                 float(v[6])]
        for k, v in d.items()
    }  # fmt: skip


__all__ = ["Rates", "velocity", "evidence", "to_state", "from_state"]
