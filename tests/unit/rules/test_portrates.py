"""The port checks' velocity (``pipeline.rules.portrates``) on its own: the verdict holds until the
next span closes, a reset or a change in the counters summed restarts the span, and the
snapshot comes back from its plain data (NaN as None)."""

from __future__ import annotations

import math

import msgspec

from pipeline.rules import portrates
from pipeline.rules.portconfig import DEFAULTS, PortCheck
from pipeline.schema import NicRecord

LER = DEFAULTS["link_error_recovery"]  # more than 5 per 60 s


def _rec(t: float, **counters: int) -> NicRecord:
    return NicRecord(ts=t, host="n1", device="mlx5_0", port=1, counters=counters)


def _run(check: PortCheck, key: str, samples: list[tuple[float, dict[str, int]]]) -> tuple[list[bool], dict]:
    rates: portrates.Rates = {}
    return [portrates.velocity(rates, key, check, _rec(t, **c)) for t, c in samples], rates


def test_the_verdict_holds_until_the_next_span_closes():
    got, rates = _run(LER, "link_error_recovery", [(0, {"link_error_recovery": 0}), (60, {"link_error_recovery": 9}),
                                                   (90, {"link_error_recovery": 9}), (120, {"link_error_recovery": 9})])
    assert got == [False, True, True, False]
    assert portrates.evidence(DEFAULTS, rates) == {
        "network_link_error_recovery": {"rate": 0.0, "increase": 0, "over_s": 60.0}}


def test_a_reset_or_other_counters_restart_the_span_with_no_verdict():
    got, rates = _run(LER, "link_error_recovery", [(0, {"link_error_recovery": 50}), (60, {"link_error_recovery": 3}),
                                                   (120, {"link_error_recovery": 4})])
    assert got == [False, False, False] and rates["link_error_recovery"][:3] == [120, 4, 1]
    two = PortCheck("x", "x", "warning", threshold=5, window_s=60.0, counters=("a", "b"))
    got, _ = _run(two, "x", [(0, {"a": 0}), (60, {"a": 0, "b": 9}), (120, {"a": 0, "b": 20})])
    assert got == [False, False, True]  # the sum of a and b starts at 60 s: only its span counts
    # A record without the check's counters says nothing new: the last verdict stands.
    got, _ = _run(LER, "link_error_recovery", [(0, {"link_error_recovery": 0}), (60, {"link_error_recovery": 9}),
                                               (70, {})])
    assert got == [False, True, True]


def test_the_snapshots_come_back_from_plain_data():
    _, rates = _run(LER, "link_error_recovery", [(0, {"link_error_recovery": 0})])
    data = msgspec.json.decode(msgspec.json.encode(portrates.to_state(rates)))
    back = portrates.from_state(data)
    assert back.keys() == rates.keys() and math.isnan(back["link_error_recovery"][4])
    assert portrates.to_state(back) == portrates.to_state(rates)
