"""Retry with capped exponential back-off: the one loop for bus operations that may fail for a while.

A broker restart or a leader election makes sends and polls fail for seconds; trying again at
once would spin, waiting forever would hide a refusal that cannot succeed. So an error whose
``retriable`` flag is set (kafka-python's and pipeline/errors.py's) is retried after a delay
that doubles up to ``max_s``; any other error is the caller's.

>>> calls = []
>>> def flaky():
...     calls.append(1)
...     if len(calls) < 3:
...         raise TimeoutError("not yet")
...     return "sent"
>>> retry(flaky, Backoff(sleep=lambda s: None), retriable=lambda e: isinstance(e, TimeoutError))
'sent'
>>> Backoff(base_s=0.5, max_s=3.0).delay(1), Backoff(base_s=0.5, max_s=3.0).delay(5)
(1.0, 3.0)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

T = TypeVar("T")


def is_retriable(err: BaseException) -> bool:
    """The error's own ``retriable`` flag (kafka-python errors and ``GpuwardenError`` carry one)."""
    return bool(getattr(err, "retriable", False))


@dataclass
class Backoff:
    """Delay before attempt ``n + 1`` after ``n`` failures: ``base_s * 2**n``, at most ``max_s``."""

    base_s: float = 0.5
    max_s: float = 10.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def delay(self, failures: int) -> float:
        return min(self.base_s * 2.0**failures, self.max_s)

    def wait(self, failures: int) -> None:
        self.sleep(self.delay(failures))


def retry(
    fn: Callable[[], T],
    backoff: Backoff | None = None,
    *,
    retriable: Callable[[BaseException], bool] = is_retriable,
    on_retry: Callable[[int, BaseException], None] | None = None,
    attempts: int | None = None,
) -> T:
    """``fn()``, called again after each retriable failure (at most ``attempts`` calls if given).

    ``on_retry(failures, error)`` runs before each wait (log it, count it). A failure that is not
    retriable, or the last allowed one, is raised as it is."""
    backoff = backoff or Backoff()
    failures = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the predicate decides; everything else is re-raised
            failures += 1
            if not retriable(e) or (attempts is not None and failures >= attempts):
                raise
            if on_retry is not None:
                on_retry(failures, e)
            backoff.wait(failures)
