"""Fixtures of the remediation tests; what they build is in factories.py beside this file."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.remediation.factories import Fakes, Harness, ScriptedServer, install_fakes


@pytest.fixture
def fakes(tmp_path, monkeypatch) -> Fakes:
    return install_fakes(tmp_path, monkeypatch)


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(cfg, **kw: Any) -> Harness:
        h = Harness(cfg, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def server():
    """``server(script)`` starts a ``ScriptedServer``; every one is closed after the test."""
    made: list[ScriptedServer] = []

    def make(script: list) -> ScriptedServer:
        s = ScriptedServer(script)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
