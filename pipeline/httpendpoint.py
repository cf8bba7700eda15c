"""The hardened ``/metrics`` + ``/healthz`` HTTP endpoint the service and the producers serve,
and read-only pages a caller adds by path (``pages``: the service's ``/incidents``).

The endpoint serves each connection in its own (daemon) thread, and a client has ``timeout``
seconds to send its whole request, so an idle or dribbling client (slowloris) cannot hold a
thread for long. When every one of the ``max_connections`` slots is taken, a new connection
evicts the one that has spent longest still sending its request: a liveness probe sends its
whole request at once, so slow clients, however many, cannot keep it out and get a healthy
process killed (docs/operations.md, Security).

>>> from prometheus_client import CollectorRegistry
>>> ep = HttpEndpoint("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {})).start()
>>> import urllib.request
>>> urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/healthz", timeout=5).status
200
>>> ep.stop()
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import socketserver
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Callable, Mapping, cast
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

log = logging.getLogger("gpuwarden.http")

Page = tuple[str, bytes]  # what a page's provider returns: content type, body
# Page requests answered at once, all pages together; more are 503 at once. One: a page is
# rendered in Python holding the GIL, and two renders back to back under a flood of page requests
# starve the accept loop and the service loop (probes time out; docs/operations.md, Security).
MAX_PAGE_REQUESTS = 1
# On every answer, not only the pages': a browser sent to /metrics, /healthz or an error reads
# text/plain and application/json as what they say and never sniffs one into HTML.
NOSNIFF = ("X-Content-Type-Options", "nosniff")
# A request line and its headers, all together; past it a 431, the rest unread: http.server takes
# 100 header lines of 64 KiB each, which its parser holds as ~12 MB a connection (64 slots: ~800 MB).
MAX_REQUEST_BYTES = 96 * 1024
# An Accept header's media range that prometheus_client may read: it copies a ``version`` into the
# answer's Content-Type and compares it as numbers, so any other one is a 500 (a TypeError) or the
# client's text, control characters and folded lines included, in the answer's headers.
_MEDIA_RANGE = re.compile(
    r"\s*[\w.+*/-]+(\s*;\s*(version=\d{1,9}(\.\d{1,9}){0,3}|(?!version=)[\w.+-]+=[\w.+-]+))*\s*", re.ASCII
)
# Added to every page's answer: a page shows data from telemetry, so even if its escaping failed
# the browser runs no script and loads nothing (inline styles only), and never sniffs a type.
PAGE_HEADERS = [
    ("Cache-Control", "no-store"),
    NOSNIFF,
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"),
]


class _TooLarge(Exception):
    """The request went past ``MAX_REQUEST_BYTES``."""


class _DeadlineReader(io.RawIOBase):
    """Socket reads that all share one deadline and one budget of bytes: a per-read timeout alone
    lets a client sending a byte a second hold its thread forever."""

    def __init__(self, sock: socket.socket, deadline: float, budget: int = MAX_REQUEST_BYTES) -> None:
        self.sock, self.deadline, self.budget = sock, deadline, budget

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        if self.budget <= 0:
            raise _TooLarge
        self.sock.settimeout(left)
        with memoryview(b) as view:
            n = self.sock.recv_into(view, min(view.nbytes, self.budget))
        self.budget -= n
        return n


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


class _ServerHandler(ServerHandler):
    """wsgiref's handler, its failures logged rather than printed to stderr: a client that stops
    reading its answer is a debug line, not a traceback a flood of them writes to stderr."""

    request_handler: WSGIRequestHandler  # for its log line, as wsgiref sets it
    error_headers = [("Content-Type", "text/plain"), NOSNIFF]  # its 500, when an application raised

    def log_exception(self, exc_info) -> None:
        if isinstance(exc_info[1], OSError):  # timeouts, resets: the client's problem
            log.debug("http client: %s", exc_info[1])
            return
        log.error("http request failed", exc_info=exc_info)


class _Handler(WSGIRequestHandler):
    timeout = 5.0  # set per endpoint

    def handle(self) -> None:
        """``WSGIRequestHandler.handle`` with ``_ServerHandler``: one request, then close."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        try:
            if not self.parse_request():  # an error was answered
                return
        except _TooLarge:
            self.send_error(431)
            return
        if self.request_version == "HTTP/0.9":
            # A request line without a version: refused (send_error answers with headers).
            self.send_error(400, "HTTP/0.9 requests are not served")
            return
        # Evicted while sending it: the end of its input ended its headers, and the request it
        # half sent, a page that waits on the service loop say, must not hold the slot it freed.
        if isinstance(self.server, _ThreadingServer) and not self.server.request_read(self.connection):
            return
        wfile = cast(IO[bytes], self.wfile)
        handler = _ServerHandler(self.rfile, wfile, self.get_stderr(), self.get_environ(), multithread=False)
        handler.request_handler = self
        app = cast(WSGIServer, self.server).get_app()
        assert app is not None  # set by make_server
        handler.run(app)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """``BaseHTTPRequestHandler.send_error`` (a request too long or not HTTP: an HTML page
        that echoes it, escaped), with ``nosniff`` as every other answer has."""
        self._nosniff = True
        if getattr(self, "request_version", None) == "HTTP/0.9":
            # http.server answers HTTP/0.9 with the body alone: no status, content type or nosniff
            # (a HEAD or POST without a version, one past the header budget, took that path).
            self.request_version = "HTTP/1.0"
        super().send_error(code, message, explain)

    def end_headers(self) -> None:
        if getattr(self, "_nosniff", False):
            self._nosniff = False
            self.send_header(*NOSNIFF)
        super().end_headers()

    def setup(self) -> None:
        super().setup()  # socket timeout for every read and write
        plain_r, plain_w = self.rfile, self.wfile
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, time.monotonic() + self.timeout))
        self.wfile = _Writer(self.connection)
        plain_r.close()
        plain_w.close()

    def get_environ(self):
        # The request is read (and no longer evictable, ``handle``): the answer gets the full
        # timeout, not what is left of it.
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

    def request_read(self, request: socket.socket) -> bool:
        """``request`` has sent its whole request (or is gone): it is no longer evictable. False
        where it was evicted before."""
        with self._lock:
            return self._reading.pop(request, None) is not None

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


def _answer(start_response, status: str, ctype: str, body: bytes, head: bool = False, extra=()) -> list[bytes]:
    headers = [("Content-Type", ctype), ("Content-Length", str(len(body))), *extra]
    start_response(status, headers if NOSNIFF in headers else [*headers, NOSNIFF])
    return [] if head else [body]


def _page(provider: Callable[[], Page], slots: threading.BoundedSemaphore, environ, start_response) -> list[bytes]:
    """A page's answer: GET or HEAD only; at most ``slots`` at once, past them 503 at once (a
    flood of page requests must not hold the connection slots a probe needs); a provider that
    fails costs this request only (500; a ``TimeoutError``, busy: 503), never the server."""
    method = environ.get("REQUEST_METHOD", "GET")
    if method not in ("GET", "HEAD"):
        return _answer(
            start_response, "405 Method Not Allowed", "text/plain", b"read-only: GET\n", extra=[("Allow", "GET, HEAD")]
        )
    busy = [("Retry-After", "1")]
    if not slots.acquire(blocking=False):
        return _answer(start_response, "503 Service Unavailable", "text/plain", b"busy; try again\n", extra=busy)
    try:
        ctype, body = provider()
    except TimeoutError:
        return _answer(start_response, "503 Service Unavailable", "text/plain", b"busy; try again\n", extra=busy)
    except Exception:  # noqa: BLE001 - a broken page must not take /metrics and /healthz with it
        log.exception("http page %s failed", environ.get("PATH_INFO"))
        return _answer(start_response, "500 Internal Server Error", "text/plain", b"this page failed; see the log\n")
    finally:
        slots.release()
    return _answer(start_response, "200 OK", ctype, body, head=method == "HEAD", extra=PAGE_HEADERS)


class HttpEndpoint:
    """``/metrics`` (Prometheus) and ``/healthz`` (200 while the poll loop is alive) in a thread,
    and each of ``pages`` (path -> provider of its content type and body) read-only."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, dict]],
        *,
        timeout: float = 5.0,
        pages: Mapping[str, Callable[[], Page]] | None = None,
    ) -> None:
        metrics_app = make_wsgi_app(registry)
        routes = dict(pages or {})
        page_slots = threading.BoundedSemaphore(MAX_PAGE_REQUESTS)
        for path in routes:
            if not path.startswith("/") or path in ("/healthz", "/metrics"):
                raise ValueError(f"page path {path!r}: must start with / and not be /healthz or /metrics")

        def app(environ, start_response):
            method = environ.get("REQUEST_METHOD", "GET")
            # Every route is read-only; answered here, not by prometheus_client, whose 405 echoes
            # the method (any token a client sends) in a body without a content type.
            if method not in ("GET", "HEAD"):
                return _answer(
                    start_response,
                    "405 Method Not Allowed",
                    "text/plain",
                    b"read-only: GET\n",
                    extra=[("Allow", "GET, HEAD")],
                )
            provider = routes.get(environ.get("PATH_INFO", ""))
            if provider is not None:
                return _page(provider, page_slots, environ, start_response)
            if environ.get("PATH_INFO") == "/healthz":
                ok, detail = health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **detail}).encode()
                status = "200 OK" if ok else "503 Service Unavailable"
                return _answer(start_response, status, "application/json", body, head=method == "HEAD")
            # HEAD: the GET's headers, its length included, without its body (wsgiref sends
            # whatever body an app returns, and counts what it sends).
            got: list[tuple[str, list[tuple[str, str]]]] = []
            accept = ",".join(r for r in environ.get("HTTP_ACCEPT", "").split(",") if _MEDIA_RANGE.fullmatch(r))
            scrape = {**environ, "REQUEST_METHOD": "GET", "HTTP_ACCEPT": accept}
            answer = metrics_app(scrape, lambda s, h, *_: got.append((s, h)))
            body = b"".join(answer)
            status, headers = got[0]
            start_response(status, [*headers, ("Content-Length", str(len(body))), NOSNIFF])
            return [] if method == "HEAD" else [body]

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
