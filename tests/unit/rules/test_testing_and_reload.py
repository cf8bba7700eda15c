import textwrap

import pytest

from pipeline.cli import main
from pipeline.engine import Engine, EngineConfig
from pipeline.rules import load_rules
from pipeline.rules import testing
from pipeline.rules.reload import RuleReloader
from pipeline.rules.testing import expand_series, run_tests
from tests.factories import sample

RULE = """
rules:
  - name: hot
    fault: thermal_hot
    severity: warning
    condition: gpu_temp > {limit}
    for: 5s
"""
TEST = """
tests:
  - name: hot fires
    series:
      - host: n1
        gpu: 0
        values:
          gpu_temp: 70x9 90x20
    alerts:
      - at: 5s
        firing: []
      - at: 20s
        firing: [{rule: hot, host: n1, gpu: 0}]
  - name: cool never fires
    series:
      - {host: n1, gpu: 1, values: {gpu_temp: 70x30}}
    never: [hot]
"""


def layout(tmp_path, limit=85, test=TEST):
    (tmp_path / "rules").mkdir(exist_ok=True)
    (tmp_path / "rules" / "thermal.yaml").write_text(RULE.format(limit=limit))
    (tmp_path / "rules" / "tests").mkdir(exist_ok=True)
    (tmp_path / "rules" / "tests" / "t.yaml").write_text(textwrap.dedent(test))
    return tmp_path / "rules"


def test_series_notation():
    assert expand_series("60+1x3 90x1 _ _x1 -1.5") == [60, 61, 62, 63, 90, 90, None, None, None, -1.5]
    assert expand_series("0x120")[:2] == [0, 0] and len(expand_series("0x120")) == 121


def test_passing_and_failing_tests_with_a_diff(tmp_path, capsys):
    rules = layout(tmp_path)
    assert all(r.ok for r in run_tests([rules / "tests"]))
    assert main(["rules", "test", str(rules / "tests")]) == 0
    layout(tmp_path, limit=95)              # the rule changed: the firing test must fail
    res = run_tests([rules / "tests"])
    assert [r.ok for r in res] == [False, True]
    assert "missing:    hot@n1/0" in res[0].failures[0]
    assert main(["rules", "test", str(rules / "tests")]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_never_reports_when_it_fired(tmp_path):
    rules = layout(tmp_path, limit=60)
    res = run_tests([rules / "tests"])
    assert "hot must never fire, but fired at" in res[1].failures[0]


def test_rules_check_cli_lints_untested_rules_and_strict(tmp_path, capsys):
    rules = layout(tmp_path, test="tests: []\n")
    assert main(["rules", "check", str(rules)]) == 0
    assert "[W201]" in capsys.readouterr().out
    assert main(["rules", "check", "--strict", str(rules)]) == 1
    (rules / "thermal.yaml").write_text(RULE.format(limit="hot"))
    assert main(["rules", "check", str(rules)]) == 1
    assert "[E102]" in capsys.readouterr().out


def test_hot_reload_applies_good_files_and_refuses_broken_ones(tmp_path):
    rules = layout(tmp_path)
    rs, _ = load_rules([rules])
    eng = Engine(EngineConfig(allowed_lateness=0), rules=rs)
    reloader = RuleReloader([rules], eng)
    assert reloader.poll() is None                     # nothing changed
    eng.process([sample(t, "n0", 0, gpu_temp=90) for t in range(4)])
    assert eng.lifecycles["hot"].since[0] == sample(0).ts  # pending
    (rules / "thermal.yaml").write_text(RULE.format(limit=85) + "\n# a comment\n")
    res = reloader.poll()
    assert res.applied and eng.lifecycles["hot"].since[0] == sample(0).ts  # same definition: state kept
    (rules / "thermal.yaml").write_text(RULE.format(limit="gpu_tmp"))
    res = reloader.poll()
    assert not res.applied and res.diagnostics[0].code == "E102"
    assert [r.meta.name for r in eng.rules.rules] == ["hot"]   # still the working set
    out = eng.process([sample(t, "n0", 0, gpu_temp=90) for t in range(4, 12)])
    assert [a.rule for a in out.alerts] == ["hot"]
    (rules / "thermal.yaml").write_text(RULE.format(limit=95).replace("name: hot", "name: hotter"))
    assert reloader.poll().applied
    assert "hot" not in eng.lifecycles and "hotter" in eng.lifecycles
    reloader.request()                                  # SIGHUP: reload even without a change
    assert reloader.poll().applied


def test_pipeline_decodes_the_fields_of_reloaded_rules():
    # The pipeline decodes only the fields its engine reads; a reload that adds a field must
    # widen that, and records already pending keep working.
    import msgspec

    from pipeline.bus.base import Message
    from pipeline.runner import Pipeline

    def rules(cond):
        rs, diags = load_rules_text(cond)
        assert rs is not None, diags
        return rs

    def load_rules_text(cond):
        import tempfile
        from pathlib import Path
        d = Path(tempfile.mkdtemp())
        (d / "r.yaml").write_text(RULE.replace("gpu_temp > {limit}", cond))
        return load_rules([d])

    eng = Engine(rules=rules("gpu_temp > 85"))
    pipe = Pipeline(eng)
    t0 = 1764403200.0

    def msg(t):
        rec = {"kind": "dcgm", "ts": t0 + t, "host": "n1", "gpu": 0,
               "fields": {"DCGM_FI_DEV_GPU_TEMP": 70, "DCGM_FI_DEV_SM_CLOCK": 900}}
        return Message("t", 0, t, None, msgspec.json.encode([rec]))

    pipe.handle([msg(t) for t in range(3)])
    assert "DCGM_FI_DEV_SM_CLOCK" not in pipe.decoder.fields
    eng.set_rules(rules("sm_clock < 1000"))
    out = pipe.handle([msg(t) for t in range(3, 40)])
    out.extend(pipe.flush())
    assert "DCGM_FI_DEV_SM_CLOCK" in pipe.decoder.fields
    assert [(a.state, a.rule) for a in out.alerts][:1] == [("firing", "hot")]


SERIES = "    series: [{host: n1, gpu: 0, values: {gpu_temp: 90x10}}]\n"
HOSTILE_TESTS = {
    # name: (test file text, the start of the one failure it must give)
    "tests_not_a_list": ("tests: abc\n", "cannot read: tests must be a list"),
    "root_a_list": ("- a\n", "cannot read: a test file must be a mapping"),
    "misspelt_top_key": ("tset: []\n", "cannot read: a test file: unknown key 'tset'"),
    "test_not_a_mapping": ("tests: [abc]\n", "bad test input: a test must be a mapping"),
    "misspelt_series": ("tests:\n  - name: t\n    sereis: []\n", "bad test input: a test: unknown key 'sereis'"),
    "values_not_a_mapping": ("tests:\n  - name: t\n    series: [{host: n1, values: abc}]\n", "bad test input"),
    "gpu_too_big": ("tests:\n  - name: t\n    series: [{host: n1, gpu: 99999999999999999999999, "
                    "values: {gpu_temp: 1}}]\n", "bad test input"),
    "firing_not_a_list": ("tests:\n  - name: t\n" + SERIES + "    alerts: [{at: 5s, firing: hot}]\n",
                          "bad test input: firing must be a list"),
    "firing_without_rule": ("tests:\n  - name: t\n" + SERIES + "    alerts: [{at: 5s, firing: [{host: n1}]}]\n",
                            "bad test input"),
    "firing_rule_a_list": ("tests:\n  - name: t\n" + SERIES + "    alerts: [{at: 5s, firing: [{rule: [hot]}]}]\n",
                           "bad test input"),
    "firing_gpu_not_a_number": ("tests:\n  - name: t\n" + SERIES
                                + "    alerts: [{at: 5s, firing: [{rule: hot, host: n1, gpu: x}]}]\n", "bad test input"),
    "never_a_string": ("tests:\n  - name: t\n" + SERIES + "    never: hot\n", "bad test input: never must be a list"),
    "never_of_lists": ("tests:\n  - name: t\n" + SERIES + "    never: [[hot]]\n", "bad test input"),
    "rule_files_of_lists": ("tests:\n  - name: t\n    rule_files: [[a]]\n" + SERIES, "bad test input"),
    "interval_zero": ("tests:\n  - name: t\n    interval: 0s\n" + SERIES, "bad test input: interval must be positive"),
    "arabic_digits": ("tests:\n  - name: t\n    series: [{host: n1, values: {gpu_temp: \u0669\u0660x5}}]\n",
                      "bad test input: bad series term"),
    "four_million_samples": ("tests:\n  - name: t\n    series: [{host: n1, values: {gpu_temp: 1x999998, "
                             "gpu_util: 1x999998, sm_clock: 1x999998, power_usage: 1x999998}}]\n",
                             "bad test input: series term '1x999998': more than 1000000 samples in one test"),
    "nul_character": ("tests: [a\x00]\n", "cannot read: line 1, column 10"),
}


@pytest.mark.parametrize("name", list(HOSTILE_TESTS))
def test_hostile_rule_test_files_fail_with_a_reason_never_raise(tmp_path, name):
    text, failure = HOSTILE_TESTS[name]
    rules = layout(tmp_path, test=text)
    results = run_tests([rules / "tests"])
    assert len(results) == 1 and results[0].failures[0].startswith(failure), results
    testing.tested_rules([rules / "tests"])  # the W201 lint reads the same file: no exception either


def test_a_test_file_that_is_not_utf8_is_a_failure(tmp_path):
    rules = layout(tmp_path)
    (rules / "tests" / "t.yaml").write_bytes(b"tests:\n  - name: caf\xe9\n")
    (r,) = run_tests([rules / "tests"])
    assert r.failures == ["cannot read: not UTF-8: byte 0xe9 at offset 20"]
    assert testing.tested_rules([rules / "tests"]) == set()
