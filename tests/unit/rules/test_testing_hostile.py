"""Hostile rule test files (``gpuwarden rules test``): each one a failure that says what is
wrong, never an exception, a hang, unbounded memory or a test that silently checks nothing."""

from __future__ import annotations

import os
import threading
import tracemalloc

import pytest

from pipeline.cli import main
from pipeline.rules import testing
from pipeline.rules.testing import MAX_SAMPLES, expand_series, run_tests

RULE = "rules:\n  - name: hot\n    fault: thermal_hot\n    severity: warning\n    condition: gpu_temp > 85\n"
SERIES = "    series: [{host: n1, gpu: 0, values: {gpu_temp: 90x10}}]\n"


def layout(tmp_path, test: str):
    """``rules/thermal.yaml`` with the rule ``hot``, and ``rules/tests/t.yaml`` holding ``test``."""
    (tmp_path / "rules" / "tests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "rules" / "thermal.yaml").write_text(RULE)
    (tmp_path / "rules" / "tests" / "t.yaml").write_text(test)
    return tmp_path / "rules" / "tests"


HOSTILE = {
    # name: (test file text, the start of its first failure)
    # PyYAML keeps the last of a key given twice: the first list of checks was silently dropped.
    "alerts_twice": ("tests:\n  - name: t\n" + SERIES + "    alerts: [{at: 5s, firing: []}]\n"
                     "    alerts: [{at: 9s, firing: [{rule: hot, host: n1, gpu: 0}]}]\n",
                     "cannot read: line 5, column 5: key 'alerts' given twice in one mapping"),
    "field_twice": ("tests:\n  - name: t\n    series: [{host: n1, values: {gpu_temp: 1, gpu_temp: 90x10}}]\n"
                    "    never: [hot]\n", "cannot read: line 3, column 47: key 'gpu_temp' given twice"),
    "tests_twice": ("tests: []\ntests:\n  - name: t\n" + SERIES + "    never: [hot]\n",
                    "cannot read: line 2, column 1: key 'tests' given twice"),
    # The plain loader ignored tags: a python tag was read as the text beside it.
    "python_tag": ("tests:\n  - name: !!python/name:os.system t\n" + SERIES + "    never: [hot]\n",
                   "cannot read: line 2, column 11: YAML tag 'tag:yaml.org,2002:python/name:os.system' is not allowed"),
    "custom_tag": ("tests: !foo []\n", "cannot read: line 1, column 8: YAML tag '!foo' is not allowed"),
    # A value no decoder lets through (it dead-letters it) made a test of something that never happens.
    "infinite_sample": ("tests:\n  - name: t\n    series: [{host: n1, values: {gpu_temp: 90x5 1e309}}]\n"
                        "    never: [hot]\n", "bad test input: bad series term '1e309': not a finite number"),
    "infinite_step": ("tests:\n  - name: t\n    series: [{host: n1, values: {gpu_temp: 1+" + "9" * 400 + "x3}}]\n"
                      "    never: [hot]\n", "bad test input: bad series term '1+9999"),
    "digits_past_a_double": ("tests:\n  - name: t\n    series: [{host: n1, values: {gpu_temp: " + "9" * 5000 + "}}]\n"
                             "    never: [hot]\n", "bad test input: bad series term '9999"),
    # Nothing to check: it passed whatever the rules did.
    "no_checks": ("tests:\n  - name: t\n" + SERIES, "checks nothing"),
    "null_checks": ("tests:\n  - name: t\n" + SERIES + "    alerts:\n    never:\n", "checks nothing"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_test_files_fail_with_the_reason(tmp_path, name):
    text, failure = HOSTILE[name]
    tests = layout(tmp_path, text)
    results = run_tests([tests])
    assert len(results) == 1 and results[0].failures and results[0].failures[0].startswith(failure), results
    testing.tested_rules([tests])  # the W201 lint reads the same file: no exception either


def test_expand_series_refuses_values_that_are_not_finite():
    for term in ("1e309", "-1e309", "1.5e400x3", "1+1" + "0" * 400 + "x2"):
        with pytest.raises(testing.SeriesError, match="not a finite number"):
            expand_series(term)
    assert expand_series("1e308 -1e308") == [1e308, -1e308]


def test_the_sample_bound_holds_for_a_file_not_each_test(tmp_path):
    # An alias (or a copy) made every test of a file 1,000,000 samples: a 100-byte file held
    # millions, minutes of engine time each. '_' samples cost no engine time, so this is quick.
    half = MAX_SAMPLES // 2 + 1
    tests = layout(tmp_path, (
        "tests:\n"
        f"  - {{name: a, series: &s [{{host: n1, values: {{gpu_temp: _x{half} 40}}}}], never: [hot]}}\n"
        "  - {name: b, series: *s, never: [hot]}\n"))
    a, b = run_tests([tests])
    assert a.ok, a
    assert b.failures[0].startswith(f"bad test input: series term '_x{half}': more than {MAX_SAMPLES} samples in one test file")


def test_at_most_max_tests_in_a_file(tmp_path):
    n = testing.MAX_TESTS + 1
    tests = layout(tmp_path, "tests:\n" + "".join(f"  - {{name: t{i}, never: [hot]}}\n" for i in range(n)))
    (r,) = run_tests([tests])
    assert r.name == "(file)" and r.failures == [f"cannot read: more than {testing.MAX_TESTS} tests in one file"]


def test_a_big_test_file_is_not_read_whole(tmp_path):
    tests = layout(tmp_path, "")
    with open(tests / "t.yaml", "wb") as fh:  # sparse: 64 MiB on disk costs nothing
        fh.truncate(64 << 20)
    tracemalloc.start()
    try:
        (r,) = run_tests([tests])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.name == "(file)" and "limit of 4194304 bytes" in r.failures[0], r
    assert peak < 32 << 20, peak


def _finishes(fn, fifo, seconds=10.0):
    """Whether ``fn()`` returns within ``seconds``; a reader left blocked on ``fifo`` is released."""
    done = threading.Event()
    t = threading.Thread(target=lambda: (fn(), done.set()), daemon=True)
    t.start()
    t.join(seconds)
    finished = done.is_set()
    if not finished:  # open a writer so the blocked open() of the reader returns
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(seconds)
    return finished


def test_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    tests = layout(tmp_path, "tests: []\n")
    (tests / "t.yaml").unlink()
    os.mkfifo(tests / "t.yaml")
    got = []
    assert _finishes(lambda: got.extend(run_tests([tests])), tests / "t.yaml")
    assert [(r.name, r.failures) for r in got] == [("(file)", ["cannot read: not a regular file"])]
    # main() sets signal handlers, which only the main thread may: it runs here, once the above holds.
    assert main(["rules", "test", str(tests / "t.yaml")]) == 1
    assert "cannot read: not a regular file" in capsys.readouterr().out
