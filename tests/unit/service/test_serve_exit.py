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
