"""Putting telemetry on a bus: event-time pacing and the paced send loop.

``Pacer`` spaces a stream by its event time at a speed factor (``replay --to-kafka --speed``,
``gpuwarden sim --realtime``, the latency benchmark's 1 Hz publisher); ``send_paced`` sends
wire messages (``pipeline/bus/telemetry.py``) through any ``Producer`` and waits for every
acknowledgement, so a caller knows what arrived.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable

from pipeline.bus.base import Producer
from pipeline.bus.telemetry import WireMessage

FLUSH_EVERY = 1000  # messages between waits for acknowledgements when nothing paces the stream


class Pacer:
    """Event time at ``speed`` times the wall clock: the first event time seen is due at once
    (the wall clock of construction), each later one ``(ts - first) / speed`` seconds after.

    ``speed=None`` is as fast as it goes (nothing ever waits). Late events never wait, and a
    pacer that fell behind does not hurry to catch up: it only never runs ahead.
    """

    def __init__(
        self,
        speed: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if speed is not None and (isinstance(speed, bool) or not math.isfinite(speed) or speed <= 0):
            raise ValueError(f"speed: expected a positive factor of event time, got {speed!r}")
        self.speed = speed
        self.clock = clock
        self.sleep = sleep
        self.wall0 = clock()
        self.ts0: float | None = None

    def delay(self, ts: float) -> float:
        """Seconds until event time ``ts`` is due (<= 0: it is due now)."""
        if self.speed is None:
            return 0.0
        if self.ts0 is None:
            self.ts0 = ts
        return (ts - self.ts0) / self.speed - (self.clock() - self.wall0)

    def wait(self, ts: float, before_sleep: Callable[[], object] | None = None) -> float:
        """Sleep until ``ts`` is due; ``before_sleep`` runs first when there is a wait (a
        producer's flush: what is already queued goes out on time). Returns the seconds slept."""
        d = self.delay(ts)
        if d <= 0:
            return 0.0
        if before_sleep is not None:
            before_sleep()
        self.sleep(d)
        return d


def send_paced(
    producer: Producer,
    topic: str,
    messages: Iterable[WireMessage],
    *,
    pacer: Pacer | None = None,
    flush_every: int = FLUSH_EVERY,
) -> int:
    """Send ``messages`` to ``topic`` in order, each no sooner than ``pacer`` says its event time
    is due (unstamped ones at once), waiting for acknowledgements every ``flush_every`` messages,
    before each wait and at the end; returns how many were sent. ``flush`` raises
    ``DeliveryError`` when the broker did not acknowledge one."""
    sent = 0
    for m in messages:
        if pacer is not None and m.ts is not None:
            pacer.wait(m.ts, before_sleep=producer.flush)
        producer.send(topic, m.value, m.key)
        sent += 1
        if sent % flush_every == 0:
            producer.flush()
    producer.flush()
    return sent
