"""What the service's HTTP threads read of its loop's state (the ``/incidents`` page): asked for
by a request, computed by the loop thread between turns, handed back.

The stages a page reads (the incident stage of a fleet-stage task) are not thread-safe: read from
an HTTP thread while the loop feeds them, a page could show an incident half-way through an
alert joining it, or fail on a dict changing size. Computed by the loop between turns, it shows
them as a whole turn left them, and the loop pays nothing while nobody asks (one comparison a
turn)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar, cast

T = TypeVar("T")


class LoopQuery(Generic[T]):
    """``ask`` (any thread) waits until the loop next calls ``answer``, which runs ``compute``
    once for every request waiting then.

    >>> q = LoopQuery(lambda: 42)
    >>> import threading
    >>> got = []
    >>> t = threading.Thread(target=lambda: got.append(q.ask(5.0)))
    >>> t.start()
    >>> while not q.pending():
    ...     pass
    >>> q.answer()
    >>> t.join()
    >>> got
    [42]
    """

    def __init__(
        self, compute: Callable[[], T], fresh_for: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._compute = compute
        self._cond = threading.Condition()
        self._asked = 0  # requests made so far
        self._answered = 0  # requests covered by the latest answer
        self._value: T | None = None
        self._error: BaseException | None = None
        # An answer younger than ``fresh_for`` seconds is given again without asking the loop: a
        # client asking in a loop costs the loop one computation a ``fresh_for`` (a page of 10,000
        # incidents is ~18 ms of it), not one a turn.
        self.fresh_for, self._clock = fresh_for, clock
        self._at: float | None = None  # when the latest answer was computed

    def pending(self) -> bool:
        """Whether a request waits for the loop."""
        return self._asked != self._answered

    def ask(self, timeout: float) -> T:
        """What ``compute`` returns on the loop's next ``answer``; ``TimeoutError`` when the loop
        does not get there within ``timeout`` seconds (busy, stuck in a back-off, or stopped). An
        exception ``compute`` raised is raised here, in the asking thread."""
        with self._cond:
            if self._at is not None and self._error is None and self._clock() - self._at < self.fresh_for:
                return cast(T, self._value)
            self._asked += 1
            ticket = self._asked
            if not self._cond.wait_for(lambda: self._answered >= ticket, timeout):
                raise TimeoutError("the service loop did not answer in time")
            if self._error is not None:
                raise self._error
            return cast(T, self._value)  # set with _answered, so set for this ticket

    def answer(self) -> None:
        """On the loop thread, between turns: answer every request waiting now."""
        if not self.pending():
            return
        with self._cond:
            upto = self._asked
        value: T | None = None
        error: BaseException | None = None
        try:
            value = self._compute()
        except Exception as e:  # noqa: BLE001 - a page's failure is its request's, never the loop's
            error = e
        with self._cond:
            self._value, self._error, self._answered, self._at = value, error, upto, self._clock()
            self._cond.notify_all()
