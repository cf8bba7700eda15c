"""What every producer shares: a bounded buffer, a retrying sender and the poll loop.

A producer's source (an exporter scrape, a ``dcgmi`` stream, NVML, a directory of dumps) is
polled on an interval; its records go into a bounded buffer, and the sender ships the buffer to
Kafka as one message per host (``per_host_messages``) or to a JSONL file. When the broker is
away the buffer keeps the newest records and drops the oldest (counted and logged), the source
keeps being polled, and no send waits longer than ``send_timeout_s``: a telemetry agent that
blocks its source hides exactly the incident it should report.

Delivery is at least once: a batch is removed from the buffer only after the broker
acknowledged all of it, so a partly acknowledged batch is sent again after an outage. A record
that no broker would take (larger than the message limit on its own) is dropped and counted
(``record_too_large``), never retried: it would hold every record behind it for good. So is
a record no encoder can write (``unencodable``: a lone surrogate, a value JSON has not).

A file source (``--file``, nccl-tests) has all of its input at hand, so its sender applies
back-pressure (``backpressure=True``): the loop waits for the sink to take the records instead
of dropping the oldest, as long as the sink makes progress (``stall_s``).

Nothing is dropped silently: every source's ``summary()`` counts what it read and, under
``dropped.<reason>`` keys, what it left out; ``run`` logs those counts periodically and at exit,
and ``ProducerMetrics`` serves them on ``/metrics`` (``--metrics-port``; docs/producers.md).
"""

from __future__ import annotations

import logging
import signal
import struct
import sys
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import msgspec

from pipeline.bus.telemetry import COLUMNAR, COLUMNAR_HEADERS, ENCODINGS, array, sized_host_groups
from pipeline.colwire import encode_dcgm
from pipeline.errors import BrokerUnavailableError, BusError
from pipeline.schema import encode

log = logging.getLogger(__name__)

# A record as the schema's Struct, or as the dict the simulator builds (same JSON either way).
Record = msgspec.Struct | dict[str, Any]
# The client's max_request_size (pipeline/bus/kafka.py) less room for the batch's own framing.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024 - 64 * 1024


class Sink(Protocol):
    """Where batches go; ``deliver`` raises ``BusError`` unless all of them arrived, except those
    refused for good as too large, whose number it returns."""

    def deliver(self, records: list[Record]) -> int | None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One record a line into a JSONL file (``.gz`` compressed), as ``gpuwarden sim --out`` writes.

    Each delivery is written whole or not at all: its lines are encoded before anything is
    written (a record no encoder can write fails the delivery before a byte of it is out), and a
    write that fails part-way (a full disk) is cut back off the file, so a retry writes the
    delivery once and whole. A ``.gz`` output is one gzip stream, flushed at each delivery (a
    follower such as ``zcat`` sees each interval's records at once); its compressor moves on only
    once a delivery's bytes are all written, so a failed write leaves no hole in the stream (it
    did: every record after it was unreadable). The stream's end (its CRC and size) is written
    at ``close``. A pipe or stdout cannot be cut back: there a failed write may leave part of a
    delivery, and a retry writes it again.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        if path == "-":
            self._fh: Any = None  # sys.stdout's, looked up at each write (a caller may swap it)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "wb", buffering=0)  # noqa: SIM115 - held open for the producer's life
        self._good = 0  # bytes of whole deliveries in the file
        # .gz: raw deflate inside a gzip header and trailer of our own, so that a delivery is
        # compressed on a copy of the compressor, kept only once its bytes are written.
        self._z = zlib.compressobj(5, zlib.DEFLATED, -zlib.MAX_WBITS) if path.endswith(".gz") else None
        self._crc = 0
        self._size = 0

    def deliver(self, records: list[Record]) -> int:
        data = b"".join(encode(r) + b"\n" for r in records)
        if self._z is None:
            self._write(data)
            return 0
        z = self._z.copy()
        out = z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)
        self._write(_GZIP_HEADER + out if self._good == 0 else out)
        self._z, self._crc, self._size = z, zlib.crc32(data, self._crc), self._size + len(data)
        return 0

    def _write(self, data: bytes) -> None:
        if self._fh is None:
            out = sys.stdout.buffer
            out.write(data)
            out.flush()  # a follower (a pipe's reader) sees each interval's records at once
            return
        view = memoryview(data)
        try:
            while view:
                n = self._fh.write(view)
                if not n:
                    raise OSError(f"{self.path}: a write took nothing")
                view = view[n:]
        except BaseException:
            self._cut_back()
            raise
        self._good += len(data)

    def _cut_back(self) -> None:
        """Take the part of a failed delivery that was written back off the file (not possible
        on a FIFO or a device, where it stays)."""
        try:
            if self._fh.seekable():
                self._fh.truncate(self._good)
                self._fh.seek(self._good)
        except OSError as e:
            log.warning("%s: could not cut a failed write back off the file: %s", self.path, e)

    def close(self) -> None:
        try:
            if self._z is not None:
                tail = self._z.flush(zlib.Z_FINISH) + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)
                self._z = None
                self._write(_GZIP_HEADER + tail if self._good == 0 else tail)
        finally:
            if self._fh is None:
                sys.stdout.buffer.flush()
            else:
                self._fh.close()


# A gzip member's header: deflate, no name, no time (a stream written over hours has none that
# is right), no extra flags, "unknown" OS; as ``gzip.compress(..., mtime=0)`` writes, less the OS.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class KafkaSink:
    """Per-host messages to ``topic``; the Kafka client is (re)made lazily so a broker that is
    down at start-up is just an outage, not a crash.

    ``max_block_ms`` bounds how long kafka-python's ``send`` may wait for metadata; after a
    failed delivery the client is closed and rebuilt, so nothing it still holds is sent twice
    behind the buffer's back.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        send_timeout_s: float = 5.0,
        security: dict[str, Any] | None = None,
        ensure: bool = True,
        max_records_per_message: int = 1000,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        make_client: Callable[[], Any] | None = None,
        encoding: str = COLUMNAR,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding {encoding!r} (one of {', '.join(ENCODINGS)})")
        self.encoding = encoding
        self.bootstrap = bootstrap
        self.max_records_per_message = max_records_per_message
        self.max_message_bytes = max_message_bytes
        self.make_client = make_client  # tests: a stand-in for KafkaBusProducer
        self.topic = topic
        self.send_timeout_s = send_timeout_s
        self.security = security
        self.ensure = ensure
        self._producer: Any = None

    def _client(self) -> Any:
        if self._producer is None and self.make_client is not None:
            self._producer = self.make_client()
        if self._producer is None:
            from pipeline.bus.kafka import KafkaBusProducer

            ms = int(self.send_timeout_s * 1000)
            # bootstrap_timeout_ms: kafka-python otherwise waits 30 s for a first broker inside
            # the constructor, and the source would wait with it.
            self._producer = KafkaBusProducer(
                self.bootstrap,
                security=self.security,
                max_block_ms=ms,
                request_timeout_ms=ms,
                bootstrap_timeout_ms=ms,
                delivery_timeout_ms=2 * ms,
                reconnect_backoff_max_ms=1000,
            )
        if self.ensure and self.topic.endswith(".telemetry"):
            # Only once a broker answered: topic creation would otherwise block on a dead one too.
            from pipeline.bus import Topics
            from pipeline.bus.kafka import ensure_topics

            ensure_topics(
                self.bootstrap,
                Topics(self.topic.removesuffix(".telemetry")),
                security=self.security,
                timeout_s=self.send_timeout_s,
            )
            self.ensure = False
        return self._producer

    def deliver(self, records: list[Record]) -> int:
        """Send ``records``; return how many were refused for good as too large (logged)."""
        from pipeline.bus.kafka import is_too_large

        try:
            p = self._client()
            # A host's records go in one message per interval; after an outage the backlog of one
            # host is split so no message nears the 8 MiB request (and decoder) limit.
            groups, big = sized_host_groups(records, self.max_records_per_message, self.max_message_bytes)
            pending = [(key, parts) for key, parts, _ in groups]
            refused = len(big)
            for r in big:
                self._too_large(r, f"larger than {self.max_message_bytes} bytes encoded")
            for i, (key, parts, recs) in enumerate(groups):
                # Columnar where the records allow it (docs/architecture.md §7): the consumer
                # decodes it without a Python object per value; JSON otherwise.
                cols = encode_dcgm(recs) if self.encoding == COLUMNAR else None
                t = time.monotonic()
                if cols is not None and len(cols) <= self.max_message_bytes:
                    p.send(self.topic, cols, key, headers=COLUMNAR_HEADERS)
                else:
                    p.send(self.topic, array(parts), key)
                if time.monotonic() - t >= self.send_timeout_s:
                    # kafka-python waited max_block_ms (topic metadata, buffer space) and failed the
                    # send; each of the rest would wait as long, one after the other.
                    raise BrokerUnavailableError(
                        f"a send to {self.bootstrap} waited the whole {self.send_timeout_s:g} s "
                        f"(no metadata for {self.topic}, or no buffer space); {len(groups) - i - 1} "
                        f"of {len(groups)} messages not tried"
                    )
            results = p.flush_results(timeout=self.send_timeout_s)
            failed = [e for e in results if e is not None and not is_too_large(e)]
            if failed:
                raise BrokerUnavailableError(f"{len(failed)} of {len(pending)} sends failed: {failed[0]!r}")
            suspects = [m for m, e in zip(pending, results) if e is not None]
            if suspects:
                refused += self._isolate(suspects)
            return refused
        except BusError:
            self._reset()
            raise
        except Exception as e:  # noqa: BLE001 - kafka-python raises many classes for one outage
            self._reset()
            raise BrokerUnavailableError(f"send to {self.bootstrap} failed: {e!r}") from e

    def _isolate(self, suspects: list[tuple[bytes, list[bytes]]]) -> int:
        """Send messages refused as too large again one at a time, halving each until it fits;
        return how many single records were refused. A broker's refusal is fatal to an idempotent
        kafka-python producer (every batch in flight fails with it), hence a fresh client after
        each and one message at a time: the refusal then names the message that caused it."""
        from pipeline.bus.kafka import is_too_large

        refused = 0
        todo = list(suspects)
        self._reset()
        while todo:
            key, parts = todo.pop(0)
            p = self._client()
            p.send(self.topic, array(parts), key)
            (err,) = p.flush_results(timeout=self.send_timeout_s) or [None]
            if err is None:
                continue
            if not is_too_large(err):
                raise BrokerUnavailableError(f"send failed: {err!r}")
            self._reset()
            if len(parts) > 1:
                # The topic's max.message.bytes is below ours: halve the message until it fits.
                half = len(parts) // 2
                todo[:0] = [(key, parts[:half]), (key, parts[half:])]
            else:
                refused += 1
                self._too_large(parts[0], f"refused by the broker: {err!r}")
        return refused

    def _too_large(self, rec: Any, why: str) -> None:
        head = rec[:120] if isinstance(rec, bytes) else encode(rec)[:120]
        log.warning("record dropped (record_too_large), %s: %r...", why, head)

    def _reset(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            try:
                p.close(timeout=0)
            except Exception:  # noqa: BLE001 - closing a broken client must not mask the outage
                pass

    def close(self) -> None:
        self._reset()


@dataclass
class SenderStats:
    """Counters a producer logs and tests read."""

    submitted: int = 0
    sent: int = 0
    dropped: int = 0
    failures: int = 0
    batches: int = 0
    too_large: int = 0  # records no broker would take, dropped (never retried)
    unencodable: int = 0  # records no encoder can write (a lone surrogate, an object JSON has not), dropped
    undelivered: int = 0  # records still buffered when the producer stopped


class BoundedSender:
    """A bounded FIFO of records in front of a ``Sink``: drops the oldest when full, retries with
    back-off, and sends at most ``max_batch`` records per attempt.

    After a failure only one probe batch of ``probe_records`` goes out per retry, so an outage
    costs one short timeout per back-off period, not one per buffered message.

    ``backpressure`` (file sources): ``submit`` never drops; ``wait_for_room`` holds the caller
    until the buffer is back within ``max_records``, and gives up (dropping the oldest, counted)
    only after ``stall_s`` seconds in which the sink took nothing.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        max_records: int = 200_000,
        max_batch: int = 20_000,
        probe_records: int = 64,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        backpressure: bool = False,
        stall_s: float = 120.0,
    ) -> None:
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        self.sink = sink
        self.max_records = max_records
        self.max_batch = max_batch
        self.probe_records = probe_records
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.backpressure = backpressure
        self.stall_s = stall_s
        self.stats = SenderStats()
        self._buf: deque[Record] = deque()
        self._healthy = True
        self._next_try = 0.0
        self._delay = backoff_s
        self._last_drop_log = -1e9
        self.stop: threading.Event | None = None  # run's stop, which bounds ``drain``

    def __len__(self) -> int:
        return len(self._buf)

    def submit(self, records: Iterable[Record]) -> None:
        """Queue records; beyond ``max_records`` the oldest are dropped (counted, logged)."""
        n = 0
        for r in records:
            self._buf.append(r)
            n += 1
        self.stats.submitted += n
        if not self.backpressure:
            self._drop_over()

    def _drop_over(self) -> None:
        over = len(self._buf) - self.max_records
        if over > 0:
            for _ in range(over):
                self._buf.popleft()
            self.stats.dropped += over
            now = self.clock()
            if now - self._last_drop_log >= 10.0:  # one line per 10 s, not one per interval
                self._last_drop_log = now
                log.warning(
                    "send buffer full (%d records): dropped the %d oldest, %d dropped in all",
                    self.max_records,
                    over,
                    self.stats.dropped,
                )

    def pump(self, *, force: bool = False, stop: threading.Event | None = None, until: float | None = None) -> int:
        """Send what the back-off allows; return how many records were delivered. Never raises.

        ``force``: one attempt whatever the back-off. Between batches it also ends once ``stop``
        is set or the clock reaches ``until``: a backlog (a whole file, a long outage's buffer)
        is not all sent before a stop is heard."""
        delivered = 0
        while self._buf:
            if not force and (
                self.clock() < self._next_try
                or (stop is not None and stop.is_set())
                or (until is not None and self.clock() >= until)
            ):
                break
            n = min(len(self._buf), self.max_batch if self._healthy else self.probe_records)
            batch = [self._buf[i] for i in range(n)]
            try:
                refused = self.sink.deliver(batch) or 0
            except Exception as e:  # noqa: BLE001 - any failure is retried later; none may stop the source
                if self._drop_unencodable(n):
                    continue  # the sink's failure was the record's: the rest at once, no back-off
                self.stats.failures += 1
                if self._healthy:
                    log.warning("delivery failed, buffering (%d records held): %s", len(self._buf), e)
                self._healthy = False
                self._next_try = self.clock() + self._delay
                self._delay = min(self._delay * 2, self.max_backoff_s)
                break
            for _ in range(n):
                self._buf.popleft()
            delivered += n - refused
            self.stats.sent += n - refused
            self.stats.too_large += refused
            self.stats.batches += 1
            if not self._healthy:
                log.warning("delivery recovered; %d records still buffered", len(self._buf))
            self._healthy = True
            self._delay = self.backoff_s
            self._next_try = 0.0
            if force:
                force = False  # one forced attempt; the rest follows the normal rules
        return delivered

    def _drop_unencodable(self, n: int) -> int:
        """Drop (counted, logged) the records among the first ``n`` that no encoder can write:
        they would fail every delivery, as an outage that never ends, and hold every record
        behind them. Return how many; 0 when the failure was the sink's."""
        keep: list[Record] = []
        bad = 0
        first: Exception | None = None
        for _ in range(n):
            r = self._buf.popleft()
            try:
                encode(r)
            except Exception as e:  # noqa: BLE001 - whatever the encoder raises, the record cannot go
                bad += 1
                first = first or e
                continue
            keep.append(r)
        self._buf.extendleft(reversed(keep))
        if bad:
            self.stats.unencodable += bad
            log.warning("dropped %d record(s) no encoder can write (unencodable): %s", bad, first)
        return bad

    def wait_for_room(self, stop: threading.Event) -> None:
        """Back-pressure: send until the buffer is within ``max_records`` again, while the sink
        makes progress; after ``stall_s`` without any, drop the excess (counted) and go on. A stop
        leaves the buffer as it is, for ``drain``."""
        last = self.clock()
        while len(self._buf) > self.max_records and not stop.is_set():
            before = len(self._buf)
            self.pump(stop=stop)
            now = self.clock()
            if len(self._buf) < before:
                last = now
            elif now - last >= self.stall_s:
                log.warning(
                    "sink took nothing for %.0fs: dropping the oldest beyond %d", self.stall_s, self.max_records
                )
                self._drop_over()
                return
            else:
                stop.wait(min(0.2, max(0.01, self._next_try - now)))

    def drain(self, deadline_s: float, stop: threading.Event | None = None) -> None:
        """Try to empty the buffer for up to ``deadline_s`` seconds (used at shutdown); with
        back-pressure, for as long as the sink keeps taking records (``stall_s`` without any ends
        it), unless ``stop`` (default: the ``stop`` that ``run`` gave the sender) is set: then for
        ``deadline_s`` from the stop at most.
        What is left is counted as ``undelivered``."""
        stop = stop if stop is not None else self.stop
        end = self.clock() + deadline_s
        stopped = stop is not None and stop.is_set()
        while self._buf and self.clock() < end:
            before = len(self._buf)
            self.pump(force=True, until=end, stop=None if stopped else stop)
            if not stopped and stop is not None and stop.is_set():
                stopped = True
                end = min(end, self.clock() + deadline_s)
            if len(self._buf) == before:
                time.sleep(min(0.2, max(0.0, end - self.clock())))
            elif self.backpressure and not stopped:
                end = max(end, self.clock() + self.stall_s)
        if self._buf:
            self.stats.undelivered = len(self._buf)
            log.warning("stopping with %d records undelivered", len(self._buf))

    def close(self) -> None:
        self.sink.close()


class Source(Protocol):
    """A producer's input. ``poll`` returns the records read since the last call (never raises
    for bad input: it logs and counts); ``done`` is true once a finite input is exhausted.

    Sources also have ``summary() -> dict[str, int]``: what they read, and what they dropped
    under ``dropped.<reason>`` keys (see ``source_counts``)."""

    done: bool

    def poll(self) -> list[Record]: ...

    def close(self) -> None: ...


DROPPED = "dropped."


def source_counts(source: Any) -> dict[str, int]:
    """The source's ``summary()`` (empty when it has none): a copy, safe to read from another
    thread (a scrape of ``/metrics``) while the poll loop updates the counters."""
    summary = getattr(source, "summary", None)
    if summary is None:
        return {}
    for _ in range(3):
        try:
            return {str(k): int(v) for k, v in dict(summary()).items()}
        except RuntimeError:  # "dictionary changed size during iteration": the loop was mid-update
            continue
    return {}


# Drop reasons that are the format's "no value here" or input that is not GPU telemetry by
# design, not input lost: a file producer's exit status ignores them (docs/producers.md).
NOT_LOST = ("blank_sentinel", "na_value", "unknown_metric", "unknown_column", "no_gpu_label", "skipped_entity")


def lost_input(source: Any, result: "RunResult") -> dict[str, int]:
    """What a run lost of its input, by reason (empty: nothing): polls that raised, the
    source's ``dropped.*`` counts other than ``NOT_LOST``, and the sender's drops and leftovers."""
    s = result.sender
    lost = {
        "poll_errors": result.poll_errors,
        "dropped.send_buffer_full": s.dropped,
        "dropped.record_too_large": s.too_large,
        "dropped.unencodable": s.unencodable,
        "undelivered": s.undelivered,
    }
    for k, v in source_counts(source).items():
        if k.startswith(DROPPED) and k[len(DROPPED) :].split(".")[0] not in NOT_LOST:
            lost[k] = lost.get(k, 0) + v
    return {k: v for k, v in lost.items() if v}


def format_counts(counts: dict[str, int]) -> str:
    """``rows 31, records 30, dropped.unparsable_row 1``: the summary as one log-friendly line, the
    counters that are not 0 (a source counts a dozen reasons, most of them 0 on most runs).

    >>> format_counts({"rows": 31, "dropped.unparsable_row": 0}), format_counts({"rows": 0})
    ('rows 31', 'nothing counted')
    """
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing counted"


@dataclass
class RunResult:
    polls: int = 0
    records: int = 0
    poll_errors: int = 0
    sender: SenderStats = field(default_factory=SenderStats)


class ProducerMetrics:
    """A long-running producer's counters for Prometheus, read at scrape time (nothing to keep in
    step): records produced, sent, dropped by reason (the source's ``dropped.*`` counts and
    ``send_buffer_full``, ``record_too_large`` and ``unencodable`` for the sender's own drops), failed sends,
    queue depth, polls.

    Served by the hardened endpoint the service uses too (``pipeline.httpendpoint.HttpEndpoint``).
    """

    def __init__(self, name: str, source: Any, sender: "BoundedSender", result: RunResult) -> None:
        from prometheus_client import CollectorRegistry

        self.name, self.source, self.sender, self.result = name, source, sender, result
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def collect(self):  # the prometheus_client collector protocol
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s, res = self.sender.stats, self.result
        counts = source_counts(self.source)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["producer"])
            c.add_metric([self.name], value)
            return c

        yield counter("gpuwarden_producer_records", "Records the source produced", res.records)
        yield counter("gpuwarden_producer_records_sent", "Records the sink acknowledged", s.sent)
        yield counter("gpuwarden_producer_send_failures", "Deliveries that failed (retried later)", s.failures)
        yield counter("gpuwarden_producer_polls", "Polls of the source", res.polls)
        yield counter("gpuwarden_producer_poll_errors", "Polls that raised", res.poll_errors)
        dropped = CounterMetricFamily(
            "gpuwarden_producer_dropped",
            "Input the producer left out, by reason (also in the exit summary)",
            labels=["producer", "reason"],
        )
        dropped.add_metric([self.name, "send_buffer_full"], s.dropped)
        dropped.add_metric([self.name, "record_too_large"], s.too_large)
        dropped.add_metric([self.name, "unencodable"], s.unencodable)
        read = CounterMetricFamily(
            "gpuwarden_producer_read", "What the source read, by unit (rows, lines, ...)", labels=["producer", "what"]
        )
        for k, v in counts.items():
            if k.startswith(DROPPED):
                dropped.add_metric([self.name, k[len(DROPPED) :]], v)
            else:
                read.add_metric([self.name, k], v)
        yield dropped
        yield read
        q = GaugeMetricFamily(
            "gpuwarden_producer_queue_depth", "Records buffered, not yet delivered", labels=["producer"]
        )
        q.add_metric([self.name], len(self.sender))
        yield q


def serve_metrics(metrics: ProducerMetrics, port: int, host: str = "0.0.0.0") -> Any:
    """Start ``/metrics`` (and ``/healthz``) on ``host:port``; returns the endpoint (``.stop()``)."""
    from pipeline.httpendpoint import HttpEndpoint

    return HttpEndpoint(host, port, metrics.registry, lambda: (True, {"producer": metrics.name})).start()


def install_stop_handlers(stop: threading.Event, interrupt: Callable[[], None] | None = None) -> Callable[[], None]:
    """SIGTERM and SIGINT set ``stop``: the loop finishes its interval, drains, and exits.
    ``interrupt`` (a source's ``interrupt``) is called too, so a poll in flight (a scrape) ends
    at once instead of at its deadline.

    Returns a function that puts the previous handlers back.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(*_: Any) -> None:
        stop.set()
        if interrupt is not None:
            interrupt()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


def _log_counts(source: Any, res: RunResult, sender: BoundedSender, what: str) -> None:
    s = sender.stats
    counts = source_counts(source)
    drops = {k: v for k, v in counts.items() if k.startswith(DROPPED) and v}
    log.log(
        logging.WARNING if drops or s.dropped or s.too_large or s.unencodable or res.poll_errors else logging.INFO,
        "producer %s: %d polls, %d records, %d sent, %d send-buffer drops, %d too large, %d unencodable, "
        "%d failed sends, %d queued; %s",
        what,
        res.polls,
        res.records,
        s.sent,
        s.dropped,
        s.too_large,
        s.unencodable,
        s.failures,
        len(sender),
        format_counts(counts),
    )


def run(
    source: Source,
    sender: BoundedSender,
    *,
    interval_s: float,
    stop: threading.Event | None = None,
    max_polls: int | None = None,
    drain_s: float = 10.0,
    log_every_s: float = 60.0,
    result: RunResult | None = None,
) -> RunResult:
    """Poll ``source`` every ``interval_s`` and ship what it gives until ``stop``, ``max_polls`` or
    the source is done; then drain the buffer for up to ``drain_s`` and close both (a file
    source that read to its end drains while the sink takes records; after a ``stop``, a
    backlog is never sent past ``drain_s``: what is left is counted as ``undelivered``).

    Every ``log_every_s`` (and at the end) one line gives the counts, drops by reason included
    (a warning when anything was dropped). ``result`` lets a caller (the ``/metrics`` endpoint)
    read the counters while the loop runs."""
    stop = stop or threading.Event()
    res = result if result is not None else RunResult()
    res.sender = sender.stats
    sender.stop = stop
    next_log = time.monotonic() + log_every_s
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                recs = source.poll()
            except Exception:  # noqa: BLE001 - a broken poll is logged and retried next interval
                res.poll_errors += 1
                log.exception("poll failed")
                recs = []
            res.polls += 1
            res.records += len(recs)
            if recs:
                sender.submit(recs)
            sender.pump(stop=stop)
            if sender.backpressure:
                sender.wait_for_room(stop)
            if time.monotonic() >= next_log:
                next_log = time.monotonic() + log_every_s
                _log_counts(source, res, sender, "running")
            if source.done or (max_polls is not None and res.polls >= max_polls):
                break
            stop.wait(max(0.0, interval_s - (time.monotonic() - t0)))
    finally:
        sender.drain(drain_s)
        source.close()
        sender.close()
        _log_counts(source, res, sender, "stopped")
    return res
