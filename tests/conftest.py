"""Shared fixtures. Kafka tests talk to a real broker: KAFKA_BOOTSTRAP, or the one `make test` started.

With CI=true a Kafka test that finds no broker fails; it never silently skips.
"""

from __future__ import annotations

import os
import signal
import socket
import uuid

import pytest

# `gpuwarden serve` refuses to start without a checkpoint key (pipeline/service/state.py); every
# service the tests start, in process or as a child, signs with this one unless a test says otherwise.
os.environ.setdefault("GPUWARDEN_STATE_KEY", "gpuwarden-tests-state-key-0123456789")


@pytest.fixture(autouse=True)
def _sigpipe_ignored_after_each_test():
    """`gpuwarden` commands run in process set SIGPIPE to its default action (pipeline/cli, for
    `| head`); left so, a later test's loopback server writing to a client that hung up would
    end the whole test run instead of raising EPIPE in its thread."""
    yield
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _reachable(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP") or f"127.0.0.1:{os.environ.get('KAFKA_PORT', '9092')}"
    if not _reachable(bootstrap):
        msg = (f"no Kafka broker at {bootstrap}: run `make test` (it starts one) or set KAFKA_BOOTSTRAP")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return bootstrap


@pytest.fixture
def topic_prefix() -> str:
    """A fresh topic prefix per test, so tests never see each other's messages."""
    return f"gwtest-{uuid.uuid4().hex[:10]}"


_REPORT: list[str] = []


@pytest.fixture(scope="session")
def kafka_report() -> list[str]:
    """Lines the Kafka integration tests want shown at the end of the run."""
    return _REPORT


def pytest_terminal_summary(terminalreporter):  # noqa: D103 - pytest hook
    if _REPORT:
        terminalreporter.section("what really went through Kafka")
        for line in _REPORT:
            terminalreporter.write_line(line)
