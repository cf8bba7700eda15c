"""One HTTP(S) GET under one overall deadline: what a producer's scrape of an exporter needs.

``urllib`` bounds each socket read, not the exchange, so a server that trickles its headers or a
chunk-size line one byte at a time holds the caller for as long as it likes. Here a watchdog
thread shuts the socket down when the deadline passes (or when ``cancel`` is set, e.g. by
SIGTERM), so connect, TLS handshake, headers and body all finish or fail by the deadline. The
body is assembled from a list of chunks (linear) under a size cap, a body shorter than its
``Content-Length`` is refused, and a redirect is followed only to the same scheme, host and port.

Every failure is a ``FetchError`` whose ``reason`` is one of ``REASONS``, for counting.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

REASONS = (
    "timeout",  # the whole exchange did not finish within the deadline
    "interrupted",  # ``cancel`` was set (the producer is stopping)
    "unreachable",  # connect refused, DNS, reset, TLS failure
    "http_status",  # an answer other than 200 (and not a followable redirect)
    "protocol",  # not HTTP/1.x as the standard has it (bad status line, header too long...)
    "short_body",  # the connection closed before the body the server announced was complete
    "too_large",  # the body passed ``max_bytes``
    "redirect_refused",  # to another scheme, host or port, or too many hops
    "bad_url",  # not http(s)://host[:port]/...
)
REDIRECTS = (301, 302, 303, 307, 308)


class FetchError(Exception):
    """A GET that gave no usable body; ``reason`` says why (one of ``REASONS``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Watchdog:
    """Shuts ``sock`` down at ``deadline`` (monotonic) or when ``cancel`` is set, whichever first;
    ``fired`` says which, so the error the caller sees can name it."""

    def __init__(self, sock: socket.socket, deadline: float, cancel: threading.Event | None) -> None:
        self.sock, self.deadline, self.cancel = sock, deadline, cancel
        self.fired: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="http-deadline", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.fired = "timeout"
                break
            if self.cancel is not None and self.cancel.is_set():
                self.fired = "interrupted"
                break
            # A cancel is noticed within 0.1 s; without one, the deadline is the only wake-up.
            self._done.wait(min(left, 0.1) if self.cancel is not None else left)
        else:
            return
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def _origin(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an http(s) URL; FetchError('bad_url') otherwise."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as e:
        raise FetchError("bad_url", f"{url!r}: {e}") from e
    if u.scheme not in ("http", "https") or not u.hostname:
        raise FetchError("bad_url", f"{url!r}: not an http(s)://host/... URL")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return u.scheme, u.hostname, port or (443 if u.scheme == "https" else 80), path


def _exchange(
    url: str, deadline: float, max_bytes: int, cancel: threading.Event | None
) -> tuple[int, str | None, bytes]:
    """One request/response: (status, Location header, body)."""
    scheme, host, port, path = _origin(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchError("timeout", f"{url}: no complete answer within the deadline")
    try:
        sock = socket.create_connection((host, port), timeout=left)
    except OSError as e:
        raise FetchError("unreachable", f"{url}: {e}") from e
    dog = _Watchdog(sock, deadline, cancel)
    conn: http.client.HTTPConnection | None = None
    try:
        if scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        conn = http.client.HTTPConnection(host, port, timeout=left)
        conn.sock = sock  # ours, already connected and watched: http.client does not connect again
        conn.request("GET", path, headers={"Accept": "text/plain", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status in REDIRECTS:
            return resp.status, resp.getheader("Location"), b""
        if resp.status != 200:
            return resp.status, None, b""
        announced = resp.getheader("Content-Length")
        want = None
        if announced is not None and resp.getheader("Transfer-Encoding") is None:
            text = announced.strip()
            # ASCII digits only, as RFC 9110 has it: int() would also read "٣" or 5,000 digits.
            if not (text.isascii() and text.isdigit() and len(text) <= 18):
                raise FetchError("protocol", f"{url}: Content-Length {announced[:40]!r} is not a number")
            want = int(text)
        if want is not None and want > max_bytes:
            raise FetchError("too_large", f"{url}: body of {want} bytes announced, more than {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise FetchError("too_large", f"{url}: body larger than {max_bytes} bytes")
            chunks.append(chunk)
        if dog.fired:
            raise FetchError(dog.fired, f"{url}: {dog.fired} before the body was complete")
        if want is not None and size != want:
            raise FetchError("short_body", f"{url}: {size} of the {want} bytes Content-Length announced")
        return 200, None, b"".join(chunks)
    except FetchError:
        raise
    except (http.client.HTTPException, OSError, ValueError) as e:
        # A shut-down socket surfaces as whatever http.client was reading at the time.
        if dog.fired:
            raise FetchError(dog.fired, f"{url}: no complete answer ({dog.fired})") from e
        if isinstance(e, http.client.IncompleteRead):
            raise FetchError("short_body", f"{url}: body cut short ({e!r})") from e
        if isinstance(e, http.client.HTTPException):
            raise FetchError("protocol", f"{url}: not a valid HTTP answer ({e!r})") from e
        if isinstance(e, socket.timeout):
            raise FetchError("timeout", f"{url}: {e}") from e
        raise FetchError("unreachable", f"{url}: {e!r}") from e
    finally:
        dog.stop()
        if conn is not None:
            conn.close()
        else:
            sock.close()


def get(
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    cancel: threading.Event | None = None,
    max_redirects: int = 3,
) -> bytes:
    """The body of ``url`` (status 200), fetched within ``timeout_s`` overall, redirects included.

    Redirects are followed only to the URL's own scheme, host and port, at most ``max_redirects``
    times. Raises ``FetchError`` (with a ``reason``) for anything else."""
    deadline = time.monotonic() + timeout_s
    first = _origin(url)[:3]
    for _ in range(max_redirects + 1):
        status, location, body = _exchange(url, deadline, max_bytes, cancel)
        if status == 200:
            return body
        if status not in REDIRECTS:
            raise FetchError("http_status", f"{url}: HTTP {status}")
        if not location:
            raise FetchError("protocol", f"{url}: HTTP {status} without a Location")
        target = urljoin(url, location)
        if _origin(target)[:3] != first:
            raise FetchError(
                "redirect_refused", f"{url}: redirect to {target!r} leaves {first[0]}://{first[1]}:{first[2]}"
            )
        url = target
    raise FetchError("redirect_refused", f"{url}: more than {max_redirects} redirects")
