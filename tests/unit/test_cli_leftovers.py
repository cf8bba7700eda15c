"""Operator-facing leftovers of a UX pass, each a user's mistake or a surprise that now gets the
house answer (README "Exit status"; tests/unit/test_cli_conventions.py): one line on stderr
naming the command and the value, its own exit status, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_FINDINGS, EXIT_INPUT, EXIT_USAGE
from pipeline.resources import default_routes, rules_dir


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


# -- --models FILE that is not there ---------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "r.jsonl", "--models", "nope.yaml"],
        ["report", "--telemetry", "r.jsonl", "--alerts", "r.jsonl", "--out", "x.html", "--models", "nope.yaml"],
        ["demo", "--hosts", "1", "--duration", "10", "--models", "nope.yaml"],
    ],
)
def test_a_models_file_that_is_not_there_is_an_input_error_naming_it(argv, tmp_path, monkeypatch, capsys):
    # Before: "config key 'nope.yaml': cannot read nope.yaml ..." (the file called a config key);
    # report wrote its page anyway and demo ran with no models and exited 0.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.jsonl").write_text("")
    assert main(argv) == EXIT_INPUT
    err = _one_line(capsys.readouterr().err)
    assert err.startswith(f"gpuwarden {argv[0]}: --models nope.yaml: no such file")
    assert "config key" not in err
    assert not (tmp_path / "x.html").exists()


def test_a_models_path_that_is_a_directory_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.jsonl").write_text("")
    (tmp_path / "models").mkdir()
    assert main(["replay", "r.jsonl", "--models", "models"]) == EXIT_INPUT
    assert "--models models: not a file" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("models", ["auto", "none", str(rules_dir() / "models.yaml")])
def test_auto_none_and_a_real_models_file_still_replay(models, tmp_path, capsys):
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    assert main(["replay", str(rec), "--models", models]) == 0, capsys.readouterr().err


# -- rules test FILE outside a tests/ directory ----------------------------------------------

HOT_RULE = (
    "rules:\n  - name: hot\n    fault: thermal_hot\n    severity: warning\n    condition: gpu_temp > 90\n"
    "    summary: hot\n"
)
QUIET_TEST = (
    "tests:\n  - name: a cool GPU fires nothing\n    series:\n      - {host: n1, gpu: 0, values: {gpu_temp: 40x5}}\n"
    "    alerts:\n      - {at: 2s, firing: []}\n"
)
HOT_TEST = (
    "tests:\n  - name: hot fires\n{files}    series:\n      - {{host: n1, gpu: 0, values: {{gpu_temp: 95x5}}}}\n"
    "    alerts:\n      - {{at: 2s, firing: [{{rule: hot, host: n1, gpu: 0}}]}}\n"
)


def test_a_test_file_outside_tests_runs_on_the_shipped_rules(tmp_path, capsys):
    # Before: it loaded its own directory as the rules, the test file among them, so every such
    # test failed with "missing 'rules:' list [R005]" on the test file itself.
    t = tmp_path / "check.yaml"
    t.write_text(QUIET_TEST)
    assert main(["rules", "test", str(t)]) == 0
    out = capsys.readouterr().out
    assert "ok   " in out and "1 passed, 0 failed" in out and "R005" not in out


def test_its_rule_files_are_relative_to_it(tmp_path, capsys):
    (tmp_path / "hot.yaml").write_text(HOT_RULE)
    t = tmp_path / "hot_test.yaml"
    t.write_text(HOT_TEST.format(files="    rule_files: [hot.yaml]\n"))
    assert main(["rules", "test", str(t)]) == 0, capsys.readouterr().out


def test_a_failure_of_a_test_outside_tests_says_which_rules_it_ran_on(tmp_path, capsys):
    (tmp_path / "hot.yaml").write_text(HOT_RULE)
    t = tmp_path / "hot_test.yaml"
    t.write_text(HOT_TEST.format(files=""))
    assert main(["rules", "test", str(t)]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "expects unknown rule 'hot'" in out
    assert f"ran on the rules in {rules_dir()}" in out and "rule_files:" in out


def test_a_test_file_in_tests_still_runs_on_the_rules_beside_it(tmp_path, capsys):
    (tmp_path / "hot.yaml").write_text(HOT_RULE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "hot.yaml").write_text(HOT_TEST.format(files=""))
    assert main(["rules", "test", str(tmp_path / "tests" / "hot.yaml")]) == 0, capsys.readouterr().out
    assert main(["rules", "test", str(tmp_path / "tests")]) == 0


def test_the_docs_say_where_the_rules_of_a_test_come_from():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()
    assert "relative to the test file" in doc and "not in a `tests/` directory" in doc


# -- routes test with values no alert has ----------------------------------------------------

ROUTES = ["routes", "test", "--config", str(default_routes())]


@pytest.mark.parametrize(
    "pairs, says",
    [
        (["fault=nope", "severity=critical"], "fault=nope: unknown fault family 'nope'"),
        (["fault=hmb_dbe", "severity=critical"], "fault=hmb_dbe: unknown fault family 'hmb'"),
        (["fault=hbm_dbe", "severity=crit"], "severity=crit: unknown severity (one of critical, warning, info)"),
        (["fault=hbm_dbe", "severity=Critical"], "severity=Critical: unknown severity"),
        (["fault=hbm_dbe", "severity=critical", "state=gone"], "state=gone: unknown state (one of firing, resolved)"),
    ],
)
def test_routes_test_refuses_a_value_no_alert_has(pairs, says, capsys):
    # Before: exit 0 and "root -> receiver log-only", as if the route tree sent that alert there.
    assert main(ROUTES + pairs) == EXIT_USAGE
    err = _one_line(capsys.readouterr().err)
    assert err.startswith("gpuwarden routes test: ") and says in err
    if "family" in says:
        assert "thermal, hbm, nvlink" in err  # the known ones


@pytest.mark.parametrize(
    "pairs",
    [
        ["fault=hbm_uncorrectable_error", "severity=critical", "host=gpu-node-007", "gpu=3"],
        ["fault=thermal_throttling", "severity=warning", "state=resolved"],
        ["fault=network_port_down", "severity=info"],
        ["fault=hbm_dbe"],  # no severity: matches routes that do not ask for one
    ],
)
def test_routes_test_takes_every_value_an_alert_can_have(pairs, capsys):
    assert main(ROUTES + pairs) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["sim", "demo"])
def test_a_scenario_that_needs_more_hosts_is_a_usage_error(command, tmp_path, capsys):
    # mixed_fleet delays host 4's delivery: with 4 hosts that host does not exist.
    from pipeline.cli import main

    extra = ["--out", str(tmp_path / "x.jsonl")] if command == "sim" else []
    assert main([command, "--scenario", "mixed_fleet", "--hosts", "4", "--duration", "60", *extra]) == 2
    err = capsys.readouterr().err
    assert "host index 4 out of range (the fleet has 4 hosts)" in err and "internal error" not in err
