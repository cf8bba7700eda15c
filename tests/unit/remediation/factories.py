"""Loopback servers for remediation's HTTP tests: a fake Alertmanager silences API (real sockets
on 127.0.0.1, threads)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
