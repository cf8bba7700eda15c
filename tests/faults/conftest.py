"""Fault tests: the real service (a subprocess) against a real broker, compared with a golden
single-run replay of the same seeded recording. Fixtures and hooks here; helpers in factories.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.factories import _LIVE, ROOT, PrivateBroker


@pytest.fixture
def private_broker(tmp_path):
    broker = PrivateBroker(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed and any(svc.alive() for svc in _LIVE):
        report.sections.append(("stacks of the live services", _stacks_of_live_services()))
    return report


def _stacks_of_live_services() -> str:
    """Every live service's threads (SIGUSR1, faulthandler) and the end of its log: what a
    failed wait for a stuck replica needs to say where it was stuck."""
    out = []
    for svc in _LIVE:
        if svc.alive():
            before = svc.log.stat().st_size
            svc.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            with open(svc.log, "rb") as fh:
                fh.seek(max(0, before - 20000))  # deep stacks (a YAML load) run to tens of KB
                tail = fh.read().decode(errors="replace")
            out.append(f"--- {' '.join(svc.args) or 'serve'} (pid {svc.proc.pid}), end of {svc.log}:\n{tail}")
    return "\n".join(out)


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    while _LIVE:
        svc = _LIVE.pop()
        if svc.alive():
            svc.kill9()


@pytest.fixture(scope="session")
def _recordings(tmp_path_factory) -> dict:
    return {"dir": tmp_path_factory.mktemp("recordings")}


@pytest.fixture
def sim_recording(_recordings):
    """A seeded `gpuwarden sim` recording, made once per session for each set of parameters
    (tests read it and write what they derive from it under their own tmp_path)."""
    def make(hosts: int = 4, duration: int = 600, seed: int = 3, scenario: str = "mixed") -> Path:
        key = (hosts, duration, seed, scenario)
        if key not in _recordings:
            path = _recordings["dir"] / f"rec-{scenario}-h{hosts}-d{duration}-s{seed}.jsonl"
            subprocess.run([sys.executable, "-m", "pipeline", "sim", "--hosts", str(hosts), "--duration",
                            str(duration), "--seed", str(seed), "--scenario", scenario, "--out", str(path)],
                           check=True, cwd=ROOT, capture_output=True)
            _recordings[key] = path
        return _recordings[key]
    return make
