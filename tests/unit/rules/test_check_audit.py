"""``rules check`` and ``replay --rules`` on packs an audit found mishandled: a pack with no
tests under ``--strict``, a condition with several mistakes, a folder with no rule files."""

import json
import textwrap

import pytest

from pipeline.cli import main
from pipeline.resources import rules_dir
from pipeline.errors import EXIT_INPUT
from pipeline.rules import load_rules

TWO_RULES = """
rules:
  - name: hot
    fault: thermal_hot
    severity: warning
    condition: gpu_temp > 85
  - name: hotter
    fault: thermal_hotter
    severity: warning
    condition: gpu_temp > 95
"""
TEST_HOT = """
tests:
  - name: cool never fires
    series:
      - {host: n1, gpu: 0, values: {gpu_temp: 70x5}}
    never: [hot]
"""


def pack(tmp_path, rules=TWO_RULES, tests=None):
    d = tmp_path / "pack"
    d.mkdir()
    (d / "r.yaml").write_text(textwrap.dedent(rules))
    if tests is not None:
        (d / "tests").mkdir()
        (d / "tests" / "t.yaml").write_text(textwrap.dedent(tests))
    return d


def w201(out):
    return sorted(line.split('rule "')[1].split('"')[0] for line in out.splitlines() if "[W201]" in line)


def test_strict_flags_untested_rules_of_a_pack_without_tests(tmp_path, capsys):
    d = pack(tmp_path)
    assert main(["rules", "check", "--strict", str(d)]) == 1
    assert w201(capsys.readouterr().out) == ["hot", "hotter"]
    # The same for the pack's rule file named alone (its tests are the tests/ beside it).
    assert main(["rules", "check", "--strict", str(d / "r.yaml")]) == 1
    assert w201(capsys.readouterr().out) == ["hot", "hotter"]
    # Without --strict, a pack with no tests is checked as before: no lint, status 0.
    assert main(["rules", "check", str(d)]) == 0
    out, err = capsys.readouterr()
    assert "[W201]" not in out and "ok: 2 rules in 1 file(s)" in err


def test_strict_on_a_rule_file_reads_the_tests_beside_it(tmp_path, capsys):
    d = pack(tmp_path, tests=TEST_HOT)
    assert main(["rules", "check", "--strict", str(d / "r.yaml")]) == 1
    assert w201(capsys.readouterr().out) == ["hotter"]
    assert main(["rules", "check", "--strict", str(d)]) == 1
    assert w201(capsys.readouterr().out) == ["hotter"]


BROKEN = """
rules:
  - name: hot
    fault: thermal_hot
    severity: warning
    condition: gpu_tmp > 85 and sm_clok < 100 and avg_over(gpu_temp) > 2
    summary: "{t:.0f} {gpu_temp}"
"""


def test_every_mistake_of_a_condition_once_and_no_summary_cascade(tmp_path, capsys):
    d = pack(tmp_path, rules=BROKEN)
    assert main(["rules", "check", str(d)]) == 1
    out = capsys.readouterr().out
    got = [(line.split(":")[1], line.split(":")[2], line.rsplit("[", 1)[1].rstrip("]")) for line in out.splitlines()]
    assert got == [("6", "16", "E102"), ("6", "33", "E102"), ("6", "51", "E104"), ("7", "15", "R009")]
    assert "'gpu_tmp'" in out and "'sm_clok'" in out and "avg_over() takes 2 arguments" in out
    assert "unknown name 't'" in out and "'gpu_temp'" not in out.split("[E104]")[1]


@pytest.mark.parametrize(
    "condition, summary, codes",
    [
        # A named value's or the condition's error does not make the summary's names wrong.
        ("gpu_temp > 85", "{peak:.0f}", ["E102"]),
        ("xid_nope > 0", "{xid_meaning} {gpu_temp}", ["E102"]),
        ("gpu_temp + 1", "{gpu_temp}", ["E105"]),
        # Each argument and operand is checked: unknown function, bad field and bad type at once.
        ("nope(gpu_temp) > 1 or increase(gpu_tmp, 1m) > 0 or (gpu_temp and 1 > 0)", "", ["E103", "E102", "E105"]),
        ("peer_median(sm_clok, by=rack) > 0", "", ["E108", "E102"]),
        # 'values:' that is not a mapping: reported, and the summary's names are not judged on it.
        ("gpu_temp > 85", "{peak}", ["R003"]),
    ],
)
def test_reported_all_at_once(tmp_path, condition, summary, codes):
    values = {"{peak:.0f}": '\n    values: {peak: "max_over(gpu_tmp, 1m)"}', "{peak}": "\n    values: [peak]"}.get(summary, "")
    (tmp_path / "r.yaml").write_text(
        "rules:\n  - name: hot\n    fault: thermal_hot\n    severity: warning\n"
        f"    condition: {condition}\n    summary: {json.dumps(summary)}{values}\n"
    )
    rs, diags = load_rules([tmp_path / "r.yaml"])
    assert rs is None
    assert sorted(d.code for d in diags) == sorted(codes), [str(d) for d in diags]


def test_the_first_problem_is_still_the_one_compile_expr_raises():
    from pipeline.rules.compile import CompileError, compile_expr
    from pipeline.rules.windows import WindowStore

    with pytest.raises(CompileError) as e:
        compile_expr("gpu_tmp > 1 and sm_clok < 2", WindowStore(1.0))
    assert e.value.code == "E102" and "gpu_tmp" in e.value.message and e.value.pos == 0
    assert [x.pos for x in e.value.errors] == [0, 16]


def test_a_folder_without_rule_files_is_an_input_error_for_check(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("rules go here\n")  # not a YAML file
    for strict in ([], ["--strict"]):
        assert main(["rules", "check", *strict, str(empty)]) == EXIT_INPUT
        err = capsys.readouterr().err
        assert f"{empty}: no rule files" in err and "ok:" not in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    rec = tmp_path_factory.mktemp("rec") / "r.jsonl"
    assert main(["sim", "--hosts", "1", "--duration", "20", "--seed", "1", "--scenario", "healthy", "--out", str(rec)]) == 0
    return rec


def test_replay_refuses_a_rules_folder_without_rule_files(tmp_path, recording, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["replay", str(recording), "--rules", str(empty)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"--rules {empty}: no rule files" in err and "replayed" not in err.split("nothing replayed")[0]
    # A pack of models alone is a pack: its models run.
    (empty / "models.yaml").write_text((rules_dir() / "models.yaml").read_text())
    assert main(["replay", str(recording), "--rules", str(empty)]) == 0
    said = capsys.readouterr().err
    assert f"loaded 0 rules (0 files) from {empty}, " in said and " online models" in said


def test_replay_says_what_it_loaded(tmp_path, recording, capsys):
    d = pack(tmp_path)
    assert main(["replay", str(recording), "--rules", str(d), "--models", "none"]) == 0
    err = capsys.readouterr().err
    assert f"loaded 2 rules (1 file) from {d}\n" in err
