"""Service-config errors name file:line:col and suggest the key meant; a rules path that does not
exist is a config error naming service.rules, the path as given and the directory it was resolved
against (found by an audit: "unknown key [GW100]" with no place, and "rules:1:1: cannot read ... [R001]",
a made-up position labelled like a YAML syntax error)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_INPUT, ConfigError
from pipeline.service.config import load_config, load_config_text

ROOT = Path(__file__).resolve().parents[3]


def _error(tmp_path: Path, text: str) -> tuple[Path, ConfigError]:
    p = tmp_path / "serve.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(p, env={})
    return p, e.value


@pytest.mark.parametrize("text, key, where, what", [
    # An unknown key: the place of the key itself, and the key meant.
    ("kafka: {bootstrp: x}\n", "kafka.bootstrp", "1:9", "unknown key; did you mean 'bootstrap'?"),
    ("kafka:\n  prefix: p\n  max_pol_records: 5\n", "kafka.max_pol_records", "3:3",
     "unknown key; did you mean 'max_poll_records'?"),
    ("kafka:\n  security:\n    sasl_mechansim: x\n", "kafka.security.sasl_mechansim", "3:5",
     "unknown key; did you mean 'sasl_mechanism'?"),
    ("http: {}\nsevice: {}\n", "sevice", "2:1", "unknown key; did you mean 'service'?"),
    ("zzz: 1\n", "zzz", "1:1", "unknown key (known: engine, http, kafka, service)"),
    # A private attribute of a loaded config is not a key of the file.
    ("_origin: x\n", "_origin", "1:1", "unknown key"),
    # A value of the wrong type: the place of the value.
    ("kafka:\n  max_poll_records: 1.5\n", "kafka.max_poll_records", "2:21", "Expected `int`, got `float`"),
    ("service:\n  rules:\n    - a\n    - 7\n", "service.rules[1]", "4:7", "Expected `str`, got `int`"),
    # Found by the checks after typing: the place of the value too.
    ("http:\n  port: 70000\n", "http.port", "2:9", "70000 is not a port"),
    ("service: {log_level: loud}\n", "service.log_level", "1:22", "'loud': DEBUG"),
    # The engine's own check of its keys.
    ("engine:\n  tick: 1\n  latenes: 5\n", "engine.latenes", "3:3", "unknown key (known: "),
])
def test_a_bad_key_or_value_names_file_line_and_column(tmp_path, text, key, where, what):
    p, err = _error(tmp_path, text)
    assert err.key == key and err.code == "GW100", str(err)
    assert str(err).startswith(f"config key {key!r}: {p}:{where}: {what}"), str(err)


def test_a_mistake_the_file_does_not_place_still_names_the_file():
    # Not from the file: the environment emptied nothing, so a key absent from the file keeps its message.
    with pytest.raises(ConfigError) as e:
        load_config_text("kafka: {bootstrap: ''}\n", env={}, source="s.yaml")
    assert str(e.value).startswith("config key 'kafka.bootstrap': s.yaml:1:20: empty"), str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config_text("- 1\n", env={}, source="s.yaml")
    assert e.value.key == "(top level)"


def test_a_remediation_unknown_key_names_the_key_and_the_one_meant(tmp_path):
    from pipeline.remediation.config import load_config as load_remediation

    p = tmp_path / "routes.yaml"
    p.write_text("actions:\n  l: {type: log, levl: info}\nreceivers: [{name: r, actions: [l]}]\n"
                 "route: {receiver: r}\n")
    with pytest.raises(ConfigError) as e:
        load_remediation(p)
    assert str(e.value).startswith(f"config key 'actions.l.levl': {p}:2:18: unknown key; did you mean 'level'?")
    # The suggestion comes from the action's own type, not from another action's keys (url: webhook).
    p.write_text("actions:\n  l: {type: log, url: x}\nreceivers: [{name: r, actions: [l]}]\nroute: {receiver: r}\n")
    with pytest.raises(ConfigError) as e:
        load_remediation(p)
    assert "unknown key (known: dry_run, level, message, type)" in str(e.value), str(e.value)


def _serve(argv, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        # A broker that is not there: the rules are checked before any connection is tried.
        code = main(["serve", "--kafka", "127.0.0.1:1", "--insecure-state", *argv])
    finally:  # serve sets up JSON logging on the root logger
        root.handlers[:], root.level = handlers, level
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_serve_with_a_rules_directory_that_does_not_exist_names_key_path_and_directory(tmp_path, monkeypatch, capsys):
    # docs/serve.example.yaml's `rules: [rules]`, run from a directory without one.
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "serve.yaml").write_text((ROOT / "docs" / "serve.example.yaml").read_text())
    line = next(i for i, s in enumerate((conf / "serve.yaml").read_text().splitlines(), 1) if "rules: [rules]" in s)
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    code, last = _serve(["--config", str(conf / "serve.yaml")], monkeypatch, capsys)
    assert code == EXIT_INPUT
    assert last == (f"gpuwarden serve: config key 'service.rules': {conf / 'serve.yaml'}:{line}:11: rules directory "
                    f"'rules' does not exist (relative to the current directory {run}) [GW100]"), last
    assert "R001" not in last and ":1:1:" not in last


def test_serve_rules_from_the_command_line_name_no_place_in_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, last = _serve(["--rules", "nope/"], monkeypatch, capsys)
    assert code == EXIT_INPUT
    assert last == (f"gpuwarden serve: config key 'service.rules': rules directory 'nope/' does not exist "
                    f"(relative to the current directory {tmp_path}) [GW100]"), last


def test_check_rules_load_refuses_a_missing_path_as_a_config_error(tmp_path):
    from pipeline.service.wiring import check_rules_load

    missing = tmp_path / "gone" / "thermal.yaml"
    with pytest.raises(ConfigError) as e:
        check_rules_load([str(missing)])
    assert e.value.key == "service.rules"
    assert e.value.reason == f"rules file {str(missing)!r} does not exist"          # absolute: no directory


def test_relative_rule_paths_resolve_against_the_current_directory_not_the_config_file(tmp_path, monkeypatch):
    # Unchanged (docs/serve.example.yaml's `rules: [rules]` means the rules/ of where serve runs).
    from pipeline.service.config import check_rule_paths

    (tmp_path / "conf").mkdir()
    (tmp_path / "run" / "rules").mkdir(parents=True)
    p = tmp_path / "conf" / "serve.yaml"
    p.write_text("service:\n  rules: [rules]\n")
    cfg = load_config(p, env={})
    monkeypatch.chdir(tmp_path / "run")
    check_rule_paths(cfg.service.rules, cfg)                                     # found in run/
    monkeypatch.chdir(tmp_path / "conf")
    (tmp_path / "conf" / "rules").mkdir()
    (tmp_path / "run" / "rules").rmdir()
    check_rule_paths(cfg.service.rules, cfg)
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(ConfigError, match=f"{p}:2:11: rules directory 'rules' does not exist"):
        check_rule_paths(cfg.service.rules, cfg)
