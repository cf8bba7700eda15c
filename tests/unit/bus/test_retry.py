"""One back-off helper for bus operations (pipeline/bus/retry.py)."""

from __future__ import annotations

import pytest

from pipeline.bus.retry import Backoff, retry
from pipeline.errors import BrokerUnavailableError, DeliveryError


def test_retriable_errors_are_retried_with_capped_doubling_delays():
    waits: list[float] = []
    seen: list[int] = []
    calls = iter([BrokerUnavailableError("down")] * 6 + ["ok"])

    def fn():
        v = next(calls)
        if isinstance(v, Exception):
            raise v
        return v
    assert retry(fn, Backoff(base_s=0.5, max_s=4.0, sleep=waits.append), on_retry=lambda n, e: seen.append(n)) == "ok"
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0] and seen == [1, 2, 3, 4, 5, 6]


def test_a_refusal_that_cannot_succeed_is_raised_at_once():
    waits: list[float] = []

    def fn():
        raise DeliveryError("too large", failed=1, retriable=False)
    with pytest.raises(DeliveryError):
        retry(fn, Backoff(sleep=waits.append))
    assert waits == []


def test_attempts_bound_the_calls():
    n = [0]

    def fn():
        n[0] += 1
        raise TimeoutError
    with pytest.raises(TimeoutError):
        retry(fn, Backoff(sleep=lambda s: None), retriable=lambda e: True, attempts=3)
    assert n[0] == 3
