"""``gpuwarden serve`` starting against a real broker: what an operator's mistakes get."""

from __future__ import annotations

import logging
import socket

import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_INPUT

pytestmark = pytest.mark.kafka


def test_serve_on_an_http_port_in_use_exits_3_naming_the_key(kafka_bootstrap, topic_prefix, monkeypatch, capsys):
    # Found by an audit: a second serve on the machine was "internal error: OSError(98, ...)",
    # exit 70 (README: a bug).
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # noqa: S104 - where serve's default http.host listens
        taken.listen()
        port = taken.getsockname()[1]
        try:
            code = main(["serve", "--kafka", kafka_bootstrap, "--prefix", topic_prefix, "--insecure-state",
                         "--http-port", str(port)])  # fmt: skip
        finally:  # serve sets up JSON logging on the root logger
            root.handlers[:], root.level = handlers, level
    assert code == EXIT_INPUT
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "config key 'http.port'" in last and f":{port}: " in last and "in use" in last
