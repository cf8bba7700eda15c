"""Helpers of the fault tests: the real service as a subprocess against a real broker, its config,
what it wrote to its topics, and the golden single-run replay it is compared with (its alerts and,
with `--incidents-out`, its incident events)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from pipeline.bus import Topics
from pipeline.bus.kafka import group_settled, group_view  # noqa: F401 - the tests' helpers too
from pipeline.recording import publish

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"


def write_config(path: Path, bootstrap: str, prefix: str, partitions: int = 4, **service: object) -> Path:
    # Rules and models: the host stage per partition, the models in the fleet stage (the same
    # process by default), whose answer is a whole-fleet replay's (pipeline/topology.py).
    svc = {"flush_idle_s": 3, "rules": [str(RULES)], "models": "auto", **service}
    path.write_text(json.dumps({
        "kafka": {"bootstrap": bootstrap, "prefix": prefix, "group": f"{prefix}-svc", "partitions": partitions,
                  "max_poll_records": 200, "session_timeout_ms": 6000},
        "http": {"port": 0},
        "service": svc,
    }))
    return path


# One list for both copies of this module: pytest imports this file as a conftest under its own
# name and the tests import it as tests.faults.conftest, so a plain module-level list would be
# two lists, and the clean-up would never see (or kill) what a failed test started.
_LIVE: list["ServiceProc"] = sys.modules.setdefault("_gpuwarden_fault_services", types.ModuleType(
    "_gpuwarden_fault_services")).__dict__.setdefault("live", [])


class ServiceProc:
    """One `gpuwarden serve` process; its JSON log lines are kept for the assertions.

    Every one started is killed when its test ends, passed or failed (see ``_no_leftovers``).
    """

    def __init__(self, config: Path, log: Path, *args: str) -> None:
        """``args``: more ``serve`` options (``--stage fleet``)."""
        self.config, self.log, self.args = config, log, list(args)
        self.proc: subprocess.Popen | None = None
        _LIVE.append(self)

    def start(self) -> "ServiceProc":
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--config", str(self.config),
                                      *self.args],
                                     stdout=fh, stderr=fh, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def term(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def lines(self) -> list[dict]:
        out = []
        for raw in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                pass
        return out


# One replay per recording and models for the whole session: several cases share a recording,
# and the golden answer of the same bytes is the same answer (keyed by content, not by path).
_GOLDEN: dict[tuple[str, str], tuple[set[tuple[str, str]], Path]] = sys.modules[
    "_gpuwarden_fault_services"].__dict__.setdefault("golden", {})


def golden_alerts(recording: Path, tmp: Path, models: str = "auto") -> set[tuple[str, str]]:
    """The alert ids of one uninterrupted `gpuwarden replay`; its alerts are left in
    ``tmp/golden.jsonl``, its incident events in ``tmp/golden-incidents.jsonl``."""
    key = (hashlib.sha1(recording.read_bytes()).hexdigest(), models)
    out, inc = tmp / "golden.jsonl", tmp / "golden-incidents.jsonl"
    if key in _GOLDEN:
        golden, first = _GOLDEN[key]
        if first != out:
            shutil.copyfile(first, out)
            shutil.copyfile(first.with_name(inc.name), inc)
        return set(golden)
    subprocess.run([sys.executable, "-m", "pipeline", "replay", str(recording), "--rules", str(RULES),
                    "--models", models, "--alerts-out", str(out), "--incidents-out", str(inc), "-q"], check=True,
                   cwd=ROOT, capture_output=True)
    golden = {(a["id"], a["state"]) for a in map(json.loads, out.read_text().splitlines())}
    _GOLDEN[key] = (golden, out)
    return set(golden)


def golden_incidents(recording: Path, tmp: Path, models: str = "auto") -> set[str]:
    """The incident events of the same replay as ``golden_alerts`` (``incident_events``)."""
    golden_alerts(recording, tmp, models)
    return incident_events(list(map(json.loads, (tmp / "golden-incidents.jsonl").read_text().splitlines())))


def incident_events(events: list[dict]) -> set[str]:
    """Incident events as comparable wholes (every field: grouping, order, severity, action and
    members all show), each once: one sent again after a crash is the same event, as an alert is."""
    return {json.dumps(e, sort_keys=True) for e in events}


def alerts_on_topic(bootstrap: str, prefix: str) -> list[dict]:
    """Every alert on the alerts topic when asked: read from the beginning up to the end offsets
    it has at that moment. A fixed end, not an idle wait: after the services stopped it is all
    they sent; while they run, a caller asks again (``wait_for``)."""
    return on_topic(bootstrap, Topics(prefix).alerts)


def incidents_on_topic(bootstrap: str, prefix: str) -> list[dict]:
    """Every incident event on ``<prefix>.incidents`` when asked (as ``alerts_on_topic``)."""
    return on_topic(bootstrap, Topics(prefix).incidents)


def on_topic(bootstrap: str, topic: str) -> list[dict]:
    """Every JSON object on ``topic`` up to its end offsets when asked (``alerts_on_topic``)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts: set[int] | None = None
        deadline = time.monotonic() + 30
        while not parts:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                assert time.monotonic() < deadline, f"no partitions for {topic}"
                time.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: list[dict] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} up to {end}"
            for tp, msgs in sorted(consumer.poll(timeout_ms=500).items()):
                for m in msgs:
                    obj = json.loads(m.value)
                    out += obj if isinstance(obj, list) else [obj]
        return out
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The sum of ``group``'s committed offsets on ``topic``: on a fresh topic, how many of its
    messages the group has committed past."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return sum(o.offset for tp, o in offsets.items() if tp.topic == topic)


def wait_for(pred, timeout: float, step: float = 0.5, what: str = "condition", explain=None) -> None:
    """Until ``pred()``; on timeout an ``AssertionError`` naming ``what``, and what ``explain()``
    says of the state then (what is missing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f": {explain()}" if explain else ""))


class PrivateBroker:
    """A broker of the test's own (own directory and ports), so it can be stopped and restarted
    without touching the one every other test uses."""

    def __init__(self, tmp: Path) -> None:
        import socket

        def free() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        self.port = free()
        self.env = {**os.environ, "KAFKA_DIR": str(tmp / "kafka"), "KAFKA_PORT": str(self.port),
                    "KAFKA_CONTROLLER_PORT": str(free()), "PYTHON": sys.executable}
        self.bootstrap = f"127.0.0.1:{self.port}"

    def _run(self, *args: str, **extra: str) -> None:
        done = subprocess.run([str(ROOT / "scripts" / "kafka"), *args], env={**self.env, **extra},
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self, keep_data: bool = False) -> None:
        self._run("start", **({"KAFKA_KEEP_DATA": "1"} if keep_data else {}))

    def stop(self) -> None:
        self._run("stop")


def ids(alerts: list[dict], skip_host: str | None = None) -> set[tuple[str, str]]:
    return {(a["id"], a["state"]) for a in alerts if a.get("host") != skip_host}


def no_conflicting_duplicates(alerts: list[dict]) -> None:
    seen: dict[tuple[str, str], dict] = {}
    for a in alerts:
        k = (a["id"], a["state"])
        if k in seen:
            assert seen[k] == a, f"same id and state, different content: {a} vs {seen[k]}"
        seen[k] = a


def wait_for_incidents(bootstrap: str, prefix: str, golden: set[str], timeout: float = 120) -> None:
    """Until every golden incident event is on ``<prefix>.incidents``."""
    wait_for(lambda: incident_events(incidents_on_topic(bootstrap, prefix)) >= golden, timeout=timeout, step=1,
             what="every golden incident event on the incidents topic")


def published_in_background(path, bootstrap, prefix, speed):
    t = threading.Thread(target=publish, args=([str(path)], bootstrap, Topics(prefix).telemetry),
                         kwargs={"speed": speed}, daemon=True)
    t.start()
    return t
