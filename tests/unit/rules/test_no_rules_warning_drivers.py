"""A rule file that holds no rule (W205, ``NO_RULES``) is said by the drivers that load rules, not
only by ``rules check``: ``replay`` prints it on stderr, ``serve`` logs it at start-up and at each
hot reload, as a warning that changes no exit status."""

from __future__ import annotations

import logging

import pytest

from pipeline.cli import main
from pipeline.engine import Engine, EngineConfig
from pipeline.rules import load_rules
from pipeline.rules.loader import NO_RULES
from pipeline.rules.reload import RuleReloader
from pipeline.schema import dcgm, encode
from pipeline.service.wiring import check_rules_load
from tests.factories import T0
from tests.unit.rules.factories import GOOD



def _pack(tmp_path, empty_text: str):
    """A rules folder with one rule in ``thermal.yaml`` and no rule in ``empty.yaml``."""
    d = tmp_path / "rules"
    d.mkdir()
    (d / "thermal.yaml").write_text(GOOD)
    (d / "empty.yaml").write_text(empty_text)
    return d, d / "empty.yaml"


def _warning(path) -> str:
    return f"{path}:1:1: warning: this file holds no rules [{NO_RULES}]"


def _w205(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if NO_RULES in r.getMessage()]


@pytest.mark.parametrize("empty_text", ["", "rules: []\n"])
def test_replay_warns_of_an_empty_rule_file_and_runs_as_before(tmp_path, capsys, empty_text):
    d, empty = _pack(tmp_path, empty_text)
    rec = tmp_path / "r.jsonl"
    rec.write_bytes(b"".join(encode(dcgm(T0 + s, "n0", 0, {"gpu_temp": 90})) + b"\n" for s in range(3)))
    alerts = tmp_path / "alerts.jsonl"
    assert main(["replay", str(rec), "--rules", str(d), "--models", "none", "--alerts-out", str(alerts)]) == 0
    out, err = capsys.readouterr()
    assert err.count(_warning(empty)) == 1 and str(d / "thermal.yaml") not in err
    assert "loaded 1 rules (2 files)" in err and "replayed 3 records" in err
    assert "hot" in alerts.read_text()  # the real file's rule still fires
    # The same line as `rules check` prints for the file.
    assert main(["rules", "check", str(d)]) == 0
    assert _warning(empty) in capsys.readouterr().out


def test_serve_start_up_logs_the_warning_once(tmp_path, caplog):
    d, empty = _pack(tmp_path, "")
    with caplog.at_level(logging.WARNING):
        assert check_rules_load([str(d)]) == 1  # loads, as before
    assert _w205(caplog) == [f"rules: {_warning(empty)}"]
    assert [r.levelno for r in caplog.records if NO_RULES in r.getMessage()] == [logging.WARNING]


def test_each_hot_reload_logs_the_warning_once(tmp_path, caplog):
    d, empty = _pack(tmp_path, "rules: []\n")
    engines = [Engine(EngineConfig(), rules=load_rules([d])[0]) for _ in range(3)]
    reloader = RuleReloader([d], lambda: engines, tick=1.0)
    with caplog.at_level(logging.WARNING):
        assert reloader.poll() is None  # nothing changed: no load, nothing said
        assert _w205(caplog) == []
        (d / "thermal.yaml").write_text(GOOD + "# edited\n")
        res = reloader.poll()
        assert res is not None and res.applied and res.rules == 1
        assert [str(x) for x in res.diagnostics] == [_warning(empty)]
        assert _w205(caplog) == [f"rules: {_warning(empty)}"]  # once per load, not once per engine
        reloader.request()
        assert reloader.poll() is not None
        assert _w205(caplog) == [f"rules: {_warning(empty)}"] * 2
