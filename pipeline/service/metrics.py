"""Prometheus metrics and the /healthz + /metrics HTTP endpoint of the service.

The endpoint serves each connection in its own (daemon) thread, and a client has ``timeout``
seconds to send its whole request, so an idle or dribbling client (slowloris) cannot hold a
thread for long. When every one of the ``max_connections`` slots is taken, a new connection
evicts the one that has spent longest still sending its request: a liveness probe sends its
whole request at once, so slow clients, however many, cannot keep it out and get a healthy
service killed (docs/operations.md, Security).
"""

from __future__ import annotations

import io
import json
import logging
import socket
import socketserver
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from pipeline.decode import REASONS
from pipeline.schema import FAMILIES

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.records = Counter("gpuwarden_records", "Telemetry records decoded and processed", registry=r)
        self.fleet_records = Counter(
            "gpuwarden_fleet_records",
            "Records the fleet stage released to its models (docs/operations.md#topology)",
            registry=r,
        )
        self.fleet_dropped = Counter(
            "gpuwarden_fleet_dropped_records",
            "Records the fleet stage did not give its models, by why: duplicate (forwarded twice by "
            "an upstream replay) or late (sent for a second already released)",
            ["why"],
            registry=r,
        )
        self.fleet_forced = Counter(
            "gpuwarden_fleet_forced_releases",
            "Times the fleet stage followed the most advanced telemetry partition past "
            "service.fleet_max_buffer (what the others send later for those seconds is late)",
            registry=r,
        )
        self.records_per_s = Gauge(
            "gpuwarden_records_per_second", "Records processed per second (last batch)", registry=r
        )
        self.dead = Counter("gpuwarden_dead_letters", "Dead letters by reason", ["reason"], registry=r)
        self.alerts = Counter(
            "gpuwarden_alerts", "Alert events by fault family and state", ["family", "state"], registry=r
        )
        # Every series from zero: increase() over a series born with its first alert reads 0
        # (Prometheus sees no earlier sample), so a dashboard would miss every family's first one.
        for family in FAMILIES:
            for state in ("firing", "resolved"):
                self.alerts.labels(family, state)
        for reason in REASONS:
            self.dead.labels(reason)
        self.lag = Gauge(
            "gpuwarden_consumer_lag", "Messages behind the end of each assigned partition", ["partition"], registry=r
        )
        self.batch_seconds = Histogram(
            "gpuwarden_batch_processing_seconds",
            "Time to decode, detect and deliver one polled batch",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.event_lag = Gauge(
            "gpuwarden_event_time_lag_seconds", "Wall clock minus the newest event time processed", registry=r
        )
        self.partitions = Gauge("gpuwarden_assigned_partitions", "Telemetry partitions assigned", registry=r)
        self.rules = Gauge("gpuwarden_rules_loaded", "Rules in the working set", registry=r)
        self.reload_failures = Counter(
            "gpuwarden_rule_reload_failures", "Rule reloads refused (broken files)", registry=r
        )
        self.delivery_retries = Counter(
            "gpuwarden_delivery_retries", "Batches whose output had to be re-sent", registry=r
        )
        self.loop_seconds = Counter(
            "gpuwarden_loop_seconds",
            "Time spent in each phase of the service loop (poll, process: decode and "
            "engine, deliver, checkpoint, commit)",
            ["phase"],
            registry=r,
        )
        self.checkpoints = Counter(
            "gpuwarden_state_checkpoints",
            "Partition checkpoints written, by why (first after assignment, interval, records, idle, revoke, shutdown)",
            ["why"],
            registry=r,
        )
        self.checkpoint_seconds = Histogram(
            "gpuwarden_state_checkpoint_seconds",
            "Time to snapshot, sign and write one partition's checkpoint",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.checkpoint_failures = Counter(
            "gpuwarden_state_checkpoint_failures",
            "Checkpoint rounds the broker refused (the previous checkpoint stays)",
            registry=r,
        )
        self.commit_failures = Counter(
            "gpuwarden_offset_commit_failures", "Offset commits refused (the checkpoint holds the position)", registry=r
        )
        self.state_skipped = Counter(
            "gpuwarden_state_checkpoints_skipped",
            "Checkpoints read from the state topic and not used, by reason "
            "(unsigned, bad_signature, misplaced, too_large, corrupt, version, rollback)",
            ["reason"],
            registry=r,
        )


log = logging.getLogger("gpuwarden.service.http")


class _DeadlineReader(io.RawIOBase):
    """Socket reads that all share one deadline: a per-read timeout alone lets a client sending a
    byte a second hold its thread forever."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(b)


_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


class _Writer(io.BufferedIOBase):
    """Writes with MSG_NOSIGNAL: ``gpuwarden`` sets SIGPIPE to its default action (pipeline/cli/__init__.py,
    for ``| head``), and a client that hangs up mid-answer must be an EPIPE in this thread, not a
    signal that kills the service."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: ReadableBuffer) -> int:
        self.sock.sendall(b, _NOSIGNAL)
        with memoryview(b) as v:
            return v.nbytes

    def fileno(self) -> int:
        return self.sock.fileno()


class _Handler(WSGIRequestHandler):
    timeout = 5.0  # set per endpoint

    def setup(self) -> None:
        super().setup()  # socket timeout for every read and write
        plain_r, plain_w = self.rfile, self.wfile
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, time.monotonic() + self.timeout))
        self.wfile = _Writer(self.connection)
        plain_r.close()
        plain_w.close()

    def get_environ(self):
        # The request is read: no longer a candidate for eviction, and the answer gets the full
        # timeout, not what is left of it.
        if isinstance(self.server, _ThreadingServer):
            self.server.request_read(self.connection)
        self.connection.settimeout(self.timeout)
        return super().get_environ()

    def log_message(self, *args: object) -> None:  # requests are not worth a log line each
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck client never delays shutdown
    block_on_close = False
    max_connections = 64
    # Connections the kernel queues while the accept loop evicts: a burst of slow clients must not
    # fill the backlog ahead of a probe (socketserver's default is 5).
    request_queue_size = 256
    # How long the accept loop waits for an evicted client's thread to free its slot.
    evict_wait_s = 1.0

    def __init__(self, *args, **kwargs) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._reading: dict[socket.socket, float] = {}  # connections still sending their request
        self._lock = threading.Lock()
        self.evicted = 0
        self.refused = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._evict_slowest()
            if not self._slots.acquire(timeout=self.evict_wait_s):
                self.refused += 1
                self.shutdown_request(request)
                return
        with self._lock:
            self._reading[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.request_read(request)
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.request_read(request)
            self._slots.release()

    def request_read(self, request: socket.socket) -> None:
        """``request`` has sent its whole request (or is gone): it is no longer evictable."""
        with self._lock:
            self._reading.pop(request, None)

    def _evict_slowest(self) -> None:
        """Cut the connection that has spent longest sending its request; its thread sees the end
        of its input, answers nothing and frees its slot."""
        with self._lock:
            if not self._reading:
                return
            victim = min(self._reading, key=self._reading.__getitem__)
            del self._reading[victim]
        self.evicted += 1
        try:
            victim.shutdown(socket.SHUT_RDWR)
        except OSError:  # already gone: its slot is on its way back
            pass

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # timeouts, resets: the client's problem
            log.debug("http client %s: %s", client_address, sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


class HttpEndpoint:
    """``/metrics`` (Prometheus) and ``/healthz`` (200 while the poll loop is alive) in a thread."""

    def __init__(
        self, host: str, port: int, metrics: Metrics, health: Callable[[], tuple[bool, dict]], *, timeout: float = 5.0
    ) -> None:
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO") == "/healthz":
                ok, detail = health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **detail}).encode()
                start_response(
                    "200 OK" if ok else "503 Service Unavailable",
                    [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
                )
                return [body]
            return metrics_app(environ, start_response)

        handler = type("_TimedHandler", (_Handler,), {"timeout": timeout})
        self.server: WSGIServer = make_server(host, port, app, server_class=_ThreadingServer, handler_class=handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, name="gpuwarden-http", daemon=True)

    def start(self) -> "HttpEndpoint":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def now() -> float:
    return time.monotonic()
