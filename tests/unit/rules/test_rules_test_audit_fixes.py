"""`gpuwarden rules test`: the audit's findings (nothing to run, an expected alert without its
host or GPU, failures without file:line:col or code, test names given twice)."""

from __future__ import annotations

import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_FINDINGS, EXIT_INPUT
from pipeline.rules.testing import run_tests

HOT_RULE = (
    "rules:\n  - name: hot\n    fault: thermal_hot\n    severity: warning\n    condition: gpu_temp > 90\n"
    "    summary: hot\n"
)
HOST_RULE = (
    "rules:\n  - name: hot_host\n    fault: thermal_hot\n    severity: warning\n    level: host\n"
    "    condition: gpu_util > 90\n    summary: busy\n"
)
SERIES = "    series:\n      - {host: n1, gpu: 0, values: {gpu_temp: 95x5}}\n"
GOOD = (
    "tests:\n  - name: hot fires\n"
    + SERIES
    + "    alerts:\n      - {at: 2s, firing: [{rule: hot, host: n1, gpu: 0}]}\n"
)


def pack(tmp_path, **tests: str):
    """A rule pack with ``hot`` (GPU-level) and ``hot_host``, and the given test files in tests/."""
    (tmp_path / "hot.yaml").write_text(HOT_RULE)
    (tmp_path / "host.yaml").write_text(HOST_RULE)
    d = tmp_path / "tests"
    d.mkdir()
    for name, text in tests.items():
        (d / name).write_text(text)
    return d


# 1. Nothing to run is an input error that says so, not "0 passed, 0 failed" and exit 1.


def test_an_empty_directory_is_an_input_error(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    assert main(["rules", "test", str(tmp_path / "tests")]) == EXIT_INPUT
    out, err = capsys.readouterr()
    assert "0 passed" not in out
    assert f"{tmp_path / 'tests'}: no test files (*.yaml, *.yml) in this directory" in err and "[GW002]" in err


@pytest.mark.parametrize("text", ["", "tests: []\n", "tests:\n", "# nothing yet\n"])
def test_a_folder_of_empty_test_files_is_an_input_error(tmp_path, capsys, text):
    d = pack(tmp_path, **{"a.yaml": text, "b.yml": "tests: []\n"})
    assert main(["rules", "test", str(d)]) == EXIT_INPUT
    out, err = capsys.readouterr()
    assert "0 passed" not in out
    assert f"no tests in {d / 'a.yaml'}, {d / 'b.yml'}" in err and "[GW002]" in err


def test_an_empty_test_file_named_alone_is_an_input_error(tmp_path, capsys):
    d = pack(tmp_path, **{"a.yaml": "tests: []\n"})
    assert main(["rules", "test", str(d / "a.yaml")]) == EXIT_INPUT
    assert f"no tests in {d / 'a.yaml'}" in capsys.readouterr().err


def test_an_empty_test_file_beside_others_is_a_warning_naming_it(tmp_path, capsys):
    d = pack(tmp_path, **{"a.yaml": "tests: []\n", "hot.yaml": GOOD})
    assert main(["rules", "test", str(d)]) == 0
    out, err = capsys.readouterr()
    assert "1 passed, 0 failed" in out
    assert f"{d / 'a.yaml'}:1:1: warning: no tests in this file" in err and "[T006]" in err


def test_run_tests_reports_empty_files(tmp_path):
    d = pack(tmp_path, **{"a.yaml": "", "hot.yaml": GOOD})
    empty = []
    results = run_tests([d], on_empty=empty.append)
    assert empty == [d / "a.yaml"] and [r.ok for r in results] == [True]


# 2. An expected alert names its host, and a GPU-level rule's its GPU.


def _one(tmp_path, firing: str, series: str = SERIES):
    d = pack(
        tmp_path,
        **{"t.yaml": "tests:\n  - name: t\n" + series + f"    alerts:\n      - at: 2s\n        firing: {firing}\n"},
    )
    (r,) = run_tests([d])
    return r


def test_an_expected_alert_without_host_is_bad_input(tmp_path):
    r = _one(tmp_path, "[{rule: hot, gpu: 0}]")
    assert r.name == "t" and r.failures == ["bad test input: firing: missing key host"], r
    assert r.failures[0].pos == (7, 18)


def test_an_expected_alert_without_anything_but_its_rule_is_bad_input(tmp_path):
    r = _one(tmp_path, "[{rule: hot}]")
    assert r.failures == ["bad test input: firing: missing key host"], r


def test_a_gpu_level_expected_alert_without_gpu_is_bad_input(tmp_path):
    r = _one(tmp_path, "[{rule: hot, host: n1}]")
    assert r.failures == ["bad test input: firing: missing key gpu (hot is a GPU-level rule)"], r


def test_a_host_level_expected_alert_needs_no_gpu(tmp_path):
    busy = "    series:\n      - {host: n1, gpu: 3, values: {gpu_util: 95x5}}\n"
    assert _one(tmp_path, "[{rule: hot_host, host: n1}]", busy).ok


def test_the_cli_names_the_test(tmp_path, capsys):
    d = pack(
        tmp_path,
        **{"t.yaml": "tests:\n  - name: t\n" + SERIES + "    alerts:\n      - {at: 2s, firing: [{rule: hot}]}\n"},
    )
    assert main(["rules", "test", str(d)]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert f"FAIL {d / 't.yaml'}: t\n" in out and "bad test input: firing: missing key host" in out
    assert "hot@None" not in out


# 3. Failures say file:line:col and carry a code, as rule files' diagnostics.


def test_bad_test_input_says_where(tmp_path, capsys):
    text = "tests:\n  - name: typo\n    series:\n      - host: n1\n        values:\n          gpu_utl: 1x5\n    never: [hot]\n"
    d = pack(tmp_path, **{"t.yaml": text})
    assert main(["rules", "test", str(d)]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert f"{d / 't.yaml'}:6:11: bad test input: unknown field 'gpu_utl' in series n1/0 [T002]" in out


def test_an_unknown_key_is_placed_at_the_key(tmp_path):
    d = pack(tmp_path, **{"t.yaml": "tests:\n  - name: t\n    sereis: []\n"})
    (r,) = run_tests([d])
    assert r.failures[0].startswith("bad test input: a test: unknown key 'sereis'") and r.failures[0].pos == (3, 5)


def test_a_failed_expectation_says_where_its_at_is(tmp_path, capsys):
    text = "tests:\n  - name: t\n" + SERIES + "    alerts:\n      - at: 2s\n        firing: []\n    never: [hot]\n"
    d = pack(tmp_path, **{"t.yaml": text})
    assert main(["rules", "test", str(d)]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    f = d / "t.yaml"
    assert f"{f}:6:9: at 2s: firing hot@n1/0; expected none [T003]\n      missing:    none\n" in out
    assert f"{f}:8:13: hot must never fire, but fired at 0s on n1/0" in out


def test_a_file_that_cannot_be_read_says_where(tmp_path, capsys):
    d = pack(tmp_path, **{"t.yaml": "tests: [a\x00]\n"})
    assert main(["rules", "test", str(d)]) == EXIT_FINDINGS
    assert f"{d / 't.yaml'}:1:10: cannot read: line 1, column 10" in capsys.readouterr().out


# 4. A test name given twice in one file.


def test_a_test_name_given_twice_is_bad_input_naming_both(tmp_path, capsys):
    text = GOOD + "  - name: hot fires\n    never: [hot]\n"
    d = pack(tmp_path, **{"t.yaml": text})
    first, second = run_tests([d])
    assert first.ok and second.name == "hot fires"
    f = d / "t.yaml"
    assert second.failures == [f"bad test input: test name 'hot fires' given twice (first at {f}:2:11)"]
    assert second.failures[0].pos == (7, 11)
    assert main(["rules", "test", str(d)]) == EXIT_FINDINGS
    assert "1 passed, 1 failed" in capsys.readouterr().out


def test_the_shipped_tests_still_pass(capsys):
    assert main(["rules", "test"]) == 0
    out = capsys.readouterr().out
    assert " 0 failed" in out and not out.startswith("0 passed")


def test_a_rule_file_that_is_a_symlink_loop_is_the_loaders_error_not_a_bug(tmp_path, capsys):
    # A rule_files: entry looping on itself crashed the test (RuntimeError from Path.resolve).
    (tmp_path / "tests").mkdir()
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    (tmp_path / "tests" / "t.yaml").write_text(
        "tests:\n  - name: x\n    rule_files: [../loop.yaml]\n" + SERIES + "    never: [hot]\n"
    )
    assert main(["rules", "test", str(tmp_path / "tests")]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "Too many levels of symbolic links [R014]" in out and "gpuwarden bug" not in out


def test_rules_check_of_a_symlink_loop_says_so(tmp_path, capsys):
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    assert main(["rules", "check", str(tmp_path / "loop.yaml")]) == EXIT_INPUT
    assert "loop.yaml: too many levels of symbolic links" in capsys.readouterr().err


def test_a_test_file_named_twice_runs_once(tmp_path, capsys):
    pack(tmp_path, **{"a.yaml": GOOD})
    assert main(["rules", "test", str(tmp_path / "tests"), str(tmp_path / "tests" / "a.yaml")]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out
