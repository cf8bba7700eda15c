"""A record too large for any broker is dropped and counted, never retried, and the records
behind it are delivered; a topic whose limit is below ours gets its messages halved until they fit."""

from __future__ import annotations

from kafka.errors import MessageSizeTooLargeError

from pipeline.errors import DeliveryError
from pipeline.schema import dcgm
from producers.common import BoundedSender, KafkaSink
from tests.factories import T0


class SizeLimitedProducer:
    """Stands in for ``KafkaBusProducer``: a message over ``limit`` bytes fails as kafka-python
    (client side) or the broker (topic side) fails it, with ``MessageSizeTooLargeError``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent: list[tuple[bytes | None, bytes]] = []
        self._pending: list[bytes] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None, headers: object = None) -> None:
        self._pending.append(value)
        if len(value) <= self.limit:
            self.sent.append((key, value))

    def flush_results(self, timeout: float | None = None) -> list[BaseException | None]:
        out: list[BaseException | None] = [
            None if len(v) <= self.limit else MessageSizeTooLargeError(f"{len(v)} bytes") for v in self._pending
        ]
        self._pending = []
        return out

    def flush(self, timeout: float | None = None) -> int:  # what a caller that checks only all-or-nothing sees
        failed = [e for e in self.flush_results() if e is not None]
        if failed:
            raise DeliveryError(f"{len(failed)} sends not acknowledged", failed=len(failed), retriable=False)
        return 0

    def close(self, timeout: float = 0) -> None:
        pass


def _recs(n: int, label: str = "") -> list:
    out = []
    for i in range(n):
        r = dcgm(T0 + i, "h", 0, {"gpu_temp": 50})
        if label and i == 3:
            r.labels = {"long": label}
        out.append(r)
    return out


def test_a_record_over_the_message_limit_is_dropped_and_the_rest_delivered():
    # Before: the 9 MB record failed the whole batch, which was retried forever as an outage;
    # nothing behind it was ever sent.
    p = SizeLimitedProducer(8 * 1024 * 1024)
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p, encoding="json")
    sender = BoundedSender(sink, backoff_s=0.0)
    sender.submit(_recs(10, label="x" * (9 * 1024 * 1024)))
    for _ in range(3):
        sender.pump(force=True)
    s = sender.stats
    assert s.too_large == 1 and s.sent == 9 and s.failures == 0 and len(sender) == 0
    assert sum(v.count(b'"ts"') for _, v in p.sent) == 9


def test_a_topic_limit_below_ours_halves_messages_until_they_fit():
    p = SizeLimitedProducer(2000)
    sink = KafkaSink("unused:1", "gw.telemetry", ensure=False, make_client=lambda: p, encoding="json")
    recs = _recs(40, label="y" * 5000)
    assert sink.deliver(recs) == 1  # the 5 KB record alone cannot fit: refused, counted
    assert sum(v.count(b'"ts"') for _, v in p.sent) == 39 and all(len(v) <= 2000 for _, v in p.sent)
