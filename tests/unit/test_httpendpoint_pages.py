"""Pages added to the HTTP endpoint by path (``HttpEndpoint(pages=...)``): read-only, answered from
their provider at each request, under the endpoint's limits; a failing provider costs its request
only."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from pipeline.httpendpoint import MAX_PAGE_REQUESTS, HttpEndpoint
from pipeline.service.metrics import Metrics

NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


class Provider:
    """A page whose body counts its requests; ``fail`` makes the next one raise it."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail: BaseException | None = None

    def __call__(self) -> tuple[str, bytes]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return "text/html; charset=utf-8", f"<p>call {self.calls}</p>".encode()


@pytest.fixture
def served():
    page = Provider()
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=1.0,
                      pages={"/incidents": page}).start()
    yield ep, page
    ep.stop()


def request(ep: HttpEndpoint, path: str, method: str = "GET", timeout: float = 3.0):
    req = urllib.request.Request(f"http://127.0.0.1:{ep.port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_a_page_is_its_providers_answer_at_each_request_beside_metrics_and_healthz(served):
    ep, page = served
    status, headers, body = request(ep, "/incidents")
    assert status == 200 and body == b"<p>call 1</p>" and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Length"] == str(len(body)) and headers["Cache-Control"] == "no-store"
    assert "default-src 'none'" in headers["Content-Security-Policy"] and "script" not in \
        headers["Content-Security-Policy"]
    assert request(ep, "/incidents")[2] == b"<p>call 2</p>"
    assert request(ep, "/healthz")[0] == 200
    assert b"gpuwarden_records_total" in request(ep, "/metrics")[2] and page.calls == 2


def test_a_page_is_read_only(served):
    ep, page = served
    for method in ("POST", "PUT", "DELETE"):
        status, headers, _ = request(ep, "/incidents", method)
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, body = request(ep, "/incidents", "HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(b"<p>call 1</p>"))
    assert page.calls == 1


def test_a_failing_provider_costs_its_request_only(served):
    ep, page = served
    page.fail = RuntimeError("a bug in the page")
    status, _, body = request(ep, "/incidents")
    assert status == 500 and b"a bug" not in body              # the detail goes to the log, not the client
    page.fail = TimeoutError()
    status, headers, _ = request(ep, "/incidents")
    assert status == 503 and headers["Retry-After"] == "1"
    assert request(ep, "/healthz")[0] == 200
    page.fail = None
    assert request(ep, "/incidents")[:1] == (200,)


def test_a_slow_client_of_a_page_is_dropped_and_healthz_still_answers(served):
    ep, page = served
    slow = []
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", ep.port))
        s.sendall(b"GET /incidents HTTP/1.1\r\n", NOSIGNAL)
        slow.append(s)
    try:
        t0 = time.monotonic()
        assert request(ep, "/healthz")[0] == 200 and time.monotonic() - t0 < 1.0
        for s in slow:   # each had 1 s (the endpoint's timeout) to send its whole request
            s.settimeout(5)
            try:
                assert s.recv(1) == b""
            except OSError:
                pass
        assert time.monotonic() - t0 < 3.0 and page.calls == 0
    finally:
        for s in slow:
            s.close()


def test_page_requests_past_the_limit_are_busy_at_once_and_probes_still_answer():
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow() -> tuple[str, bytes]:
        entered.release()
        release.wait(20)
        return "text/plain", b"done"

    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=5.0,
                      pages={"/a": slow, "/b": slow}).start()
    try:
        results: list[int] = []
        held = [threading.Thread(target=lambda p=p: results.append(request(ep, p, timeout=30)[0]))
                for p in [("/a", "/b")[i % 2] for i in range(MAX_PAGE_REQUESTS)]]
        for t in held:
            t.start()
        for _ in held:
            assert entered.acquire(timeout=10)
        t0 = time.monotonic()
        status, headers, _ = request(ep, "/a")
        assert status == 503 and headers["Retry-After"] == "1" and time.monotonic() - t0 < 1.0
        assert request(ep, "/healthz")[0] == 200
        release.set()
        for t in held:
            t.join(15)
        assert results == [200] * MAX_PAGE_REQUESTS
        assert request(ep, "/b")[:1] == (200,)        # the slots came back
    finally:
        release.set()
        ep.stop()


def test_a_page_request_while_another_renders_is_busy_at_once_and_probes_answer():
    # Renders hold the GIL: a flood of page requests rendering side by side starved the accept
    # loop until probes timed out, so one renders at a time.
    release = threading.Event()
    entered = threading.Event()

    def slow() -> tuple[str, bytes]:
        entered.set()
        release.wait(20)
        return "text/plain", b"done"

    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=5.0,
                      pages={"/a": slow, "/b": slow}).start()
    timer = threading.Timer(3.0, release.set)   # before the fix the second request waited for this
    try:
        held: list[int] = []
        first = threading.Thread(target=lambda: held.append(request(ep, "/a", timeout=30)[0]))
        first.start()
        assert entered.wait(10)
        timer.start()
        status, headers, _ = request(ep, "/b", timeout=10)
        assert status == 503 and headers["Retry-After"] == "1"
        assert request(ep, "/healthz")[0] == 200
        release.set()
        first.join(15)
        assert held == [200]
    finally:
        release.set()
        timer.cancel()
        ep.stop()


def raw(ep: HttpEndpoint, data: bytes) -> tuple[bytes, bytes]:
    """The status line with headers, and the body, of the answer to ``data`` sent as it is."""
    with socket.create_connection(("127.0.0.1", ep.port), timeout=5) as s:
        s.sendall(data, NOSIGNAL)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    return head, body


def test_every_route_is_read_only_and_a_405_never_echoes_the_method(served):
    ep, page = served
    for path in (b"/metrics", b"/healthz", b"/incidents", b"/anything"):
        head, body = raw(ep, b"<script>alert(1)</script> " + path + b" HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 405 ") and b"script" not in head + body, path
        assert b"Content-Type: text/plain" in head and b"Allow: GET, HEAD" in head
        head, _ = raw(ep, b"POST " + path + b" HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 405 "), path
    assert page.calls == 0


def test_head_answers_the_get_headers_without_a_body(served):
    ep, _ = served
    for path in (b"/metrics", b"/healthz", b"/incidents"):
        head, body = raw(ep, b"HEAD " + path + b" HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 ") and body == b"", (path, body[:80])
        assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) > 0


def test_a_client_that_never_reads_its_answer_is_dropped_without_a_traceback(caplog, capfd):
    big = b"x" * (32 << 20)   # more than the socket buffers hold: the write blocks until its timeout
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), timeout=0.5,
                      pages={"/big": lambda: ("text/plain", big)}).start()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(("127.0.0.1", ep.port))
        s.sendall(b"GET /big HTTP/1.0\r\n\r\n", NOSIGNAL)
        slots = ep.server._slots  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while slots._value == 64 and time.monotonic() < deadline:    # its answer is being written
            time.sleep(0.02)
        while slots._value < 64 and time.monotonic() < deadline:     # until the write timed out
            time.sleep(0.1)
        assert slots._value == 64 and request(ep, "/healthz")[0] == 200
    finally:
        s.close()
        ep.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "TimeoutError" not in err, err[-2000:]
    assert not [r for r in caplog.records if r.levelno >= 30]


def test_many_page_requests_at_once_are_each_answered(served):
    ep, page = served
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(request(ep, "/incidents", timeout=10)[0]))
               for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert len(results) == 20 and set(results) <= {200, 503} and results.count(200) == page.calls >= 1


def test_a_page_may_not_shadow_metrics_or_healthz():
    for path in ("/metrics", "/healthz", "incidents"):
        with pytest.raises(ValueError, match="page path"):
            HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}), pages={path: Provider()})


HOSTILE_TEXT = "<script>alert(1)</script>"  # a failing page provider's message, from telemetry


@pytest.fixture
def nosniff_endpoint():
    def failing():
        raise RuntimeError(HOSTILE_TEXT)

    pages = {"/page.json": lambda: ("application/json", b'{"host": "<script>"}'), "/broken": failing}
    ep = HttpEndpoint("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {}), pages=pages).start()
    yield f"http://127.0.0.1:{ep.port}"
    ep.stop()


def _get_any(url: str, method: str = "GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.mark.parametrize(
    "path,method,status,ctype",
    [
        ("/metrics", "GET", 200, "text/plain"),
        ("/healthz", "GET", 200, "application/json"),
        ("/page.json", "GET", 200, "application/json"),
        ("/broken", "GET", 500, "text/plain"),
        ("/metrics", "POST", 405, "text/plain"),
    ],
)
def test_every_answer_says_its_type_and_forbids_sniffing(nosniff_endpoint, path, method, status, ctype):
    # /metrics, /healthz and the errors lacked nosniff: only the pages and the 405 had it.
    got, headers, body = _get_any(nosniff_endpoint + path, method)
    assert got == status and headers["Content-Type"].startswith(ctype)
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers.get_all("X-Content-Type-Options") == ["nosniff"]  # once: a dict would hide a second
    assert HOSTILE_TEXT.encode() not in body


def test_the_servers_own_error_answers_forbid_sniffing_too(nosniff_endpoint):
    # Found in review: a URL too long is answered by http.server's send_error (an HTML page, the
    # request escaped in it), which had no nosniff. (A request line that is not HTTP/1.x gets an
    # HTTP/0.9 answer: a body with no header at all.)
    request_bytes, status = b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414
    host, port = nosniff_endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request_bytes)
        head = b""
        while b"\r\n\r\n" not in head and (chunk := s.recv(4096)):
            head += chunk
    lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert lines[0].split()[1] == str(status)
    assert [ln for ln in lines if ln.lower().startswith("x-content-type-options")] == ["X-Content-Type-Options: nosniff"]
