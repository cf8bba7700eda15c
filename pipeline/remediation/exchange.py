"""One HTTP exchange under one deadline, its answer read into a bounded buffer
(docs/remediation.md#http).

httpx's timeouts are per operation: a server that sends one byte every two seconds never lets a
read time out, so a silences query or a webhook post could hold the remediator (one loop, one
thread) for as long as the server liked. Here every exchange has one deadline for all of it
(connect, TLS, request, headers, body): a watchdog timer shuts the exchange's socket down when
it passes, which wakes whatever read is blocked on it, and the exchange fails with
``DeadlineTimeout`` (a timeout: retried like one). The socket is found through httpcore's
trace events, so no connection is kept between exchanges (a pooled one would have been opened
under another exchange's watch). The timer thread lives as long as one exchange at most.

The answer is read as chunks joined once (linear), up to ``max_body`` bytes; what is beyond is
not read, and the answer says it was cut. Redirects are never followed: an alert or a silences
query goes to the configured host and scheme or fails visibly.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any

import httpx


class DeadlineTimeout(httpx.TimeoutException):
    """No complete answer within the exchange's deadline."""


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes
    truncated: bool = False  # the body was longer than max_body; what is here is its start

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def new_client(timeout: float) -> httpx.Client:
    """A client for ``exchange``: redirects not followed, no connection kept for the next one."""
    return httpx.Client(
        timeout=timeout,
        follow_redirects=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


class _Watchdog:
    """Shuts down the sockets an exchange opened once its deadline has passed."""

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._socks: list[Any] = []
        self.fired = False
        self._done = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keeps each new connection's socket (TCP, then TLS)."""
        if not event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
            if self.fired and not self._done:
                _shut(sock)  # connected after the deadline (a slow name lookup): no use going on

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            for s in self._socks:
                _shut(s)

    def stop(self) -> bool:
        """No more shutting down (the exchange is over or about to close its socket); whether
        the deadline had passed."""
        with self._lock:
            self._done = True
        self._timer.cancel()
        return self.fired


def _shut(sock: Any) -> None:
    # socket.socket's own shutdown even on an SSLSocket: it wakes the blocked read without
    # unwrapping TLS under the reading thread; a socket already closed has no fd (EBADF).
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, TypeError, ValueError):
        pass


def exchange(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    deadline: float,
    max_body: int,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
) -> Answer:
    """Send one request and read its answer, all within ``deadline`` seconds.

    Raises httpx's errors (``DeadlineTimeout`` when the deadline passed first)."""
    dog = _Watchdog(deadline)
    ext = {**(extensions or {}), "trace": dog.trace}
    # No compression: a small compressed answer could inflate far beyond what was received.
    hdrs = {"Accept-Encoding": "identity", **(headers or {})}
    dog.start()
    try:
        with client.stream(method, url, content=content, headers=hdrs, extensions=ext) as r:
            chunks: list[bytes] = []
            size, truncated = 0, False
            for chunk in r.iter_bytes():
                if size + len(chunk) > max_body:
                    chunks.append(chunk[: max_body - size])
                    truncated = True
                    break
                chunks.append(chunk)
                size += len(chunk)
            if dog.stop():
                # The socket was shut under a read: what came may look complete and is not.
                raise DeadlineTimeout(f"no complete answer within {deadline:g}s", request=r.request)
            return Answer(r.status_code, r.headers, b"".join(chunks), truncated)
    except DeadlineTimeout:
        raise
    except Exception:
        if dog.stop():
            raise DeadlineTimeout(f"no complete answer within {deadline:g}s") from None
        raise
    finally:
        dog.stop()
