"""Loopback servers for remediation's HTTP tests: a fake Alertmanager silences API, and a server
that trickles its answer one byte at a time (real sockets on 127.0.0.1, threads)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# CLI tests in the same process set SIGPIPE to its default action: a write to a connection the
# client closed (as a client at its deadline does) must be an error here, not the end of the run.
NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)

# (pattern, host, whether Alertmanager silences that host). Before: the first two kinds passed
# the backtracking screen and one re.fullmatch took hours (remediation stuck for every alert);
# the last two were refused by it and then counted as matching every host.
HOSTILE_SILENCES = [
    (".?" * 40 + "!", "gpu-node-0001.cluster", False),
    (".?" * 40 + "!", "gpu-node-01!", True),
    ("a{0,16}" * 40, "a" * 60 + "-1", False),
    ("a{0,16}" * 40, "a" * 60, True),
    ("(rack7-[0-9]+,?)+", "gpu-node-7", False),
    ("(rack7-[0-9]+,?)+", "rack7-12", True),
    ("(a+)+$", "n1", False),
    ("(a+)+$", "a" * 63, True),
]


def silence(sid: str, *matchers: tuple[str, str, bool, bool], state: str = "active") -> dict[str, Any]:
    """One silence as ``GET /api/v2/silences`` lists it; a matcher is (name, value, isRegex, isEqual)."""
    return {
        "id": sid,
        "matchers": [{"name": n, "value": v, "isRegex": r, "isEqual": e} for n, v, r, e in matchers],
        "startsAt": "2025-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "ops",
        "comment": "maintenance",
        "status": {"state": state},
    }


class SilencesApi:
    """``GET /api/v2/silences`` answering ``silences`` (a list, settable); every GET counted."""

    def __init__(self, silences: list[dict[str, Any]]) -> None:
        self.silences, self.gets = silences, 0
        api = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                api.gets += 1
                body = json.dumps(api.silences).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TrickleServer:
    """Answers every connection with ``head`` then ``body``, one byte every ``every`` seconds,
    for at most ``limit`` seconds (so that a client without an overall deadline is held that
    long, then let go). ``where``: "head" trickles from the status line on; "body" sends the
    head at once and trickles the body. ``accepted``: connections taken."""

    def __init__(self, where: str = "head", every: float = 0.2, limit: float = 30.0,
                 status: str = "200 OK", body: bytes = b"[]" + b" " * 10_000) -> None:
        head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.slow = head + body if where == "head" else body
        self.fast = b"" if where == "head" else head
        self.every, self.limit, self.accepted = every, limit, 0
        self._stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.limit
        try:
            conn.settimeout(1.0)
            try:
                conn.recv(65536)  # the request (its head is enough)
            except OSError:
                pass
            if self.fast:
                conn.sendall(self.fast, NOSIGNAL)
            for i in range(len(self.slow)):
                if self._stop.is_set() or time.monotonic() > end:
                    break
                conn.sendall(self.slow[i:i + 1], NOSIGNAL)
                time.sleep(self.every)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
