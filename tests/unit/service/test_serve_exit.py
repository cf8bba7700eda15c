"""``gpuwarden serve`` refuses rules that do not load with the input status (README, Exit status)."""

from __future__ import annotations

import logging

from pipeline.cli import main
from pipeline.errors import EXIT_INPUT


def test_serve_with_rules_that_do_not_load_exits_3_in_one_line(tmp_path, monkeypatch, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "broken.yaml").write_text("rules: [[[")
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        # A broker that is not there: the rules are refused before any connection is tried.
        code = main(["serve", "--kafka", "127.0.0.1:1", "--insecure-state", "--rules", str(rules)])
    finally:  # serve sets up JSON logging on the root logger
        root.handlers[:], root.level = handlers, level
    assert code == EXIT_INPUT == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("gpuwarden serve: rules in ") and "do not load" in last and "[GW002]" in last


def test_serve_with_no_broker_exits_4_in_one_line_at_once(tmp_path, monkeypatch, capsys):
    # Found by an audit: a plain broker that is not there gave kafka-python's connection errors,
    # 35 ERROR lines over its 30 s bootstrap timeout, before the one line (docs/operations.md:
    # one line after at most 10 s).
    import socket
    import time

    from pipeline.errors import EXIT_UNAVAILABLE

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    start = time.monotonic()
    try:
        code = main(["serve", "--kafka", f"127.0.0.1:{port}", "--insecure-state", "--http-port", "0"])
    finally:
        root.handlers[:], root.level = handlers, level
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == EXIT_UNAVAILABLE == 4 and took < 10
    assert "kafka" not in err.lower().replace("kafka broker", "")  # (no kafka-python lines)
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpuwarden serve: no Kafka broker answered at 127.0.0.1:") and "[GW301]" in last


def _serve(argv, monkeypatch):
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return main(["serve", *argv])
    finally:  # serve sets up JSON logging on the root logger
        root.handlers[:], root.level = handlers, level


def test_serve_with_an_empty_rules_directory_exits_3(tmp_path, monkeypatch, capsys):
    # Found by an audit: it ran, consuming and committing telemetry with the built-in checks
    # alone (README, Exit status: a rules directory with no rule files is 3).
    empty = tmp_path / "rules"
    empty.mkdir()
    code = _serve(["--kafka", "127.0.0.1:1", "--insecure-state", "--rules", str(empty)], monkeypatch)
    assert code == EXIT_INPUT
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"service.rules: {empty}: no rule files" in last


def test_serve_with_an_http_port_out_of_range_is_a_usage_error(monkeypatch, capsys):
    from pipeline.errors import EXIT_USAGE

    for bad in ("70000", "-5"):
        assert _serve(["--kafka", "127.0.0.1:1", "--insecure-state", "--http-port", bad], monkeypatch) == EXIT_USAGE
        assert "expected a port 0..65535" in capsys.readouterr().err
