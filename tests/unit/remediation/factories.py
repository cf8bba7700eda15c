"""Factories of the remediation tests: alerts and configs, fake scontrol/kubectl/nvidia-smi on PATH
that record their argv, a remediator harness, and loopback servers (a scripted webhook receiver, a
fake Alertmanager silences API, a server that trickles its answer one byte at a time)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pipeline.remediation.actions import Context
from pipeline.remediation.audit import AuditLog
from pipeline.remediation.config import parse_config
from pipeline.remediation.guardrails import StateStore
from pipeline.remediation.remediator import Remediator
from pipeline.schema import AlertEvent
from tests.factories import T0

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


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 in a thread, serving ``handler``; ``url`` is its address."""

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SilencesApi(LoopbackServer):
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

        self.serve(H)


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


# One script serves as all three programs (argv[0] says which). Node state lives in files in the
# fake's directory, so a test can drain a node "by hand" and the fake's queries see it.
FAKE = r'''#!{python}
import json, os, sys, time
prog = os.path.basename(sys.argv[0]); args = sys.argv[1:]
d = {state!r}
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"prog": prog, "argv": args, "t": time.time()}}) + "\n")
def lines(name):
    p = os.path.join(d, name)
    return open(p).read().split() if os.path.exists(p) else []
def add(name, v):
    with open(os.path.join(d, name), "a") as f: f.write(v + "\n")
fail = os.path.join(d, "fail-" + prog)
if os.path.exists(fail):
    sys.stderr.write("fake failure\n"); sys.exit(int(open(fail).read() or 1))
if os.path.exists(os.path.join(d, "hang-" + prog)):
    time.sleep(60)
if prog == "scontrol":
    if args[:2] == ["show", "node"]:
        n = args[-1]
        st = "IDLE+DRAIN Reason=admin:bad_fan" if n in lines("drained") else "ALLOCATED"
        print(f"NodeName={{n}} Arch=x86_64 State={{st}} Partitions=gpu")
    elif args[:1] == ["update"]:
        kv = dict(a.split("=", 1) for a in args[1:])
        if kv.get("state") == "drain": add("drained", kv["nodename"])
elif prog == "sinfo":
    for n in lines("nodes"): print(n)
    for n in lines("nodes"): print(n)   # a node in two partitions is listed twice
elif prog == "kubectl":
    while args and args[0] in ("--context", "--kubeconfig"): args = args[2:]
    if args[:2] == ["get", "nodes"]:
        for n in lines("nodes"): print("node/" + n)
    elif args[:2] == ["get", "node"]:
        print("true" if args[2] in lines("cordoned") else "", end="")
    elif args[:1] == ["cordon"]:
        add("cordoned", args[1])
elif prog == "nvidia-smi":
    if any(a.startswith("--query-compute-apps") for a in args):
        gpu = args[args.index("-i") + 1]
        for pid in lines("busy-" + gpu): print(pid)
elif prog == "sleeper":
    # A command that hangs and leaves a child behind: the timeout must kill both.
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    add("sleeper-pids", f"{{os.getpid()}} {{child.pid}}")
    time.sleep(60)
'''


class Fakes:
    def __init__(self, root: Path) -> None:
        self.dir = root / "fakebin"
        self.dir.mkdir()
        script = FAKE.format(python=sys.executable, state=str(self.dir))
        for prog in ("scontrol", "kubectl", "nvidia-smi", "scancel", "sleeper", "sinfo"):
            p = self.dir / prog
            p.write_text(script)
            p.chmod(0o755)

    def calls(self, prog: str | None = None) -> list[list[str]]:
        p = self.dir / "calls.jsonl"
        if not p.exists():
            return []
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        return [r["argv"] if prog else [r["prog"], *r["argv"]] for r in rows if prog in (None, r["prog"])]

    def updates(self) -> list[list[str]]:
        """scontrol calls that change something (not the `show node` queries)."""
        return [c for c in self.calls("scontrol") if c[:1] == ["update"]]

    def mark(self, name: str, value: str) -> None:
        with open(self.dir / name, "a") as f:
            f.write(value + "\n")

    def fail(self, prog: str, code: int = 1) -> None:
        (self.dir / f"fail-{prog}").write_text(str(code))

    def heal(self, prog: str) -> None:
        (self.dir / f"fail-{prog}").unlink(missing_ok=True)
        (self.dir / f"hang-{prog}").unlink(missing_ok=True)

    def hang(self, prog: str) -> None:
        (self.dir / f"hang-{prog}").write_text("")


def alert(host: str | None = "n1", gpu: int | None = 0, *, fault: str = "hbm_uncorrectable_error",
          severity: str = "critical", state: str = "firing", id: str | None = None, job: str | None = None,
          labels: dict[str, str] | None = None, ts: float = T0) -> AlertEvent:
    return AlertEvent(id=id or f"a-{host}-{gpu}-{fault}", state=state, fault=fault, severity=severity,
                      rule=f"rule_{fault}", host=host, gpu=gpu, job=job, ts=ts, started_at=ts - 30,
                      summary=f"{fault} on {host}", labels=labels or {})


def config(tmp_path: Path, *, actions: dict[str, Any] | None = None, receivers: list[dict] | None = None,
           route: dict | None = None, guardrails: dict | None = None, **top: Any):
    doc = {
        "state_file": str(tmp_path / "state.sqlite"),
        "audit": {"kafka": False, "file": str(tmp_path / "audit.jsonl")},
        "guardrails": {"dry_run": False, **(guardrails or {})},
        "actions": actions if actions is not None else {"drain": {"type": "slurm_drain"}},
        "receivers": receivers if receivers is not None else [{"name": "drain", "actions": ["drain"]}],
        "route": route or {"receiver": "drain"},
        # Tests of the other guardrails trust every host; test_inventory.py tests the inventory.
        "inventory": {"source": "any"},
        **top,
    }
    return parse_config(doc, base_dir=tmp_path)


def incident_config(tmp_path: Path, url: str, **top: Any):
    """Incident mode against the webhook server at ``url``: ``drain`` and ``reset`` are disruptive
    webhooks (a fleet manager's API) on the host and the GPU, ``inspect`` asks for an inspection;
    routes pick them by the incident's recommended action."""
    return config(
        tmp_path,
        source="incidents",
        inventory={"source": "list", "hosts": ["n1", "n2"]},
        actions={
            "drain": {"type": "webhook", "url": url + "/drain/{host}", "disruptive": True, "retries": 0},
            "reset": {"type": "webhook", "url": url + "/reset/{host}/{gpu}", "disruptive": True, "entity": "gpu",
                      "retries": 0},
            "inspect": {"type": "webhook", "url": url + "/inspect/{host}", "retries": 0},
            "log": {"type": "log"},
        },
        receivers=[
            {"name": "log", "actions": ["log"]},
            {"name": "drain", "actions": ["drain"]},
            {"name": "drain-and-inspect", "actions": ["drain", "inspect"]},
            {"name": "reset", "actions": ["reset"]},
        ],
        route={"receiver": "log", "routes": [
            {"name": "inspect", "matchers": ['action="drain_and_inspect"'], "receiver": "drain-and-inspect"},
            {"name": "drain", "matchers": ['action="drain_node"'], "receiver": "drain"},
            {"name": "reset", "matchers": ['action="reset_gpu"'], "receiver": "reset"},
        ]},
        **top,
    )


class Clock:
    """Wall-clock time that only moves when a test moves it (the CLI, run alongside, reads the real one)."""

    def __init__(self, t: float | None = None) -> None:
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t


class Harness:
    """A remediator over a state file; ``restart()`` builds a fresh one over the same file."""

    def __init__(self, cfg, clock: Clock | None = None, ctx: Context | None = None) -> None:
        self.cfg, self.clock, self.ctx = cfg, clock or Clock(), ctx
        self.all: list = []
        self._open()

    def _open(self) -> None:
        self.store = StateStore(self.cfg.state_file)
        self.audit = AuditLog(clock=self.clock)
        self.rem = Remediator(self.cfg, self.store, self.audit, ctx=self.ctx, clock=self.clock)

    def handle(self, a: AlertEvent, **kw: Any) -> list:
        n = len(self.audit.records)
        self.rem.handle(a, **kw)
        new = self.audit.records[n:]
        self.all.extend(new)
        return new

    def handle_incident(self, ev: Any, **kw: Any) -> list:
        n = len(self.audit.records)
        self.rem.handle_incident(ev, **kw)
        new = self.audit.records[n:]
        self.all.extend(new)
        return new

    def restart(self) -> None:
        self.rem.close()
        self.store.close()
        self._open()

    def decisions(self, which: str | None = None) -> list:
        return [r for r in self.all if which in (None, r.decision)]

    def close(self) -> None:
        self.rem.close()
        self.store.close()


class ScriptedServer(LoopbackServer):
    """A real HTTP server on 127.0.0.1 that answers the i-th POST with ``script[i]`` (the last
    one repeats): a status, or (status, headers). Every request is kept in ``hits``."""

    def __init__(self, script: list) -> None:
        self.script = [x if isinstance(x, tuple) else (x, {}) for x in script]
        self.hits: list[dict] = []
        srv = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                srv.hits.append({"t": time.monotonic(), "path": self.path, "body": body,
                                 "headers": dict(self.headers)})
                code, headers = srv.script[min(len(srv.hits) - 1, len(srv.script) - 1)]
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.serve(H)


def install_fakes(tmp_path: Path, monkeypatch: Any) -> Fakes:
    """The fake programs first on PATH for this test."""
    f = Fakes(tmp_path)
    monkeypatch.setenv("PATH", f"{f.dir}:/usr/bin:/bin")
    return f
