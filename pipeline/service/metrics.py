"""Prometheus metrics and the /healthz + /metrics HTTP endpoint of the service."""

from __future__ import annotations

import json
import threading
import time
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.records = Counter("gpuwarden_records", "Telemetry records decoded and processed", registry=r)
        self.records_per_s = Gauge("gpuwarden_records_per_second", "Records processed per second (last batch)",
                                   registry=r)
        self.dead = Counter("gpuwarden_dead_letters", "Dead letters by reason", ["reason"], registry=r)
        self.alerts = Counter("gpuwarden_alerts", "Alert events by fault family and state", ["family", "state"],
                              registry=r)
        self.lag = Gauge("gpuwarden_consumer_lag", "Messages behind the end of each assigned partition",
                         ["partition"], registry=r)
        self.batch_seconds = Histogram("gpuwarden_batch_processing_seconds",
                                       "Poll-to-commit time of a batch (decode, detect, deliver, checkpoint)",
                                       buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=r)
        self.event_lag = Gauge("gpuwarden_event_time_lag_seconds",
                               "Wall clock minus the newest event time processed", registry=r)
        self.partitions = Gauge("gpuwarden_assigned_partitions", "Telemetry partitions assigned", registry=r)
        self.rules = Gauge("gpuwarden_rules_loaded", "Rules in the working set", registry=r)
        self.reload_failures = Counter("gpuwarden_rule_reload_failures", "Rule reloads refused (broken files)",
                                       registry=r)
        self.delivery_retries = Counter("gpuwarden_delivery_retries", "Batches whose output had to be re-sent",
                                        registry=r)


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:  # requests are not worth a log line each
        pass


class HttpEndpoint:
    """``/metrics`` (Prometheus) and ``/healthz`` (200 while the poll loop is alive) in a thread."""

    def __init__(self, host: str, port: int, metrics: Metrics, health: Callable[[], tuple[bool, dict]]) -> None:
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO") == "/healthz":
                ok, detail = health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **detail}).encode()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
                return [body]
            return metrics_app(environ, start_response)

        self.server: WSGIServer = make_server(host, port, app, handler_class=_Quiet)
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
