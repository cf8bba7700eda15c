"""The rule loader's audit fixes: a FIFO named as a rule file, YAML 1.1 numbers and repeated units
as durations, ``values:`` names that shadow, files with no rule, a code for a file that cannot be
read, paths named twice, an unknown keyword argument."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.durations import parse_duration
from pipeline.errors import EXIT_INPUT
from pipeline.rules import diagnostics as D
from pipeline.rules import load_rules
from pipeline.rules.loader import NO_RULES, NO_RULES_HERE, UNREADABLE, rule_files
from tests.unit.rules.factories import GOOD

ROOT = Path(__file__).resolve().parents[3]


def rule(extra: str = "", summary: str = "hot") -> str:
    return GOOD + f"    summary: {summary!r}\n" + textwrap.indent(textwrap.dedent(extra), "    ")


def load(tmp_path, text: str, name: str = "r.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return load_rules([p])


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a subprocess: a hang fails the test (TimeoutExpired) instead of the suite."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


# -- 1. a FIFO is refused, never waited on ----------------------------------------------------


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    p = tmp_path / "r.yaml"
    os.mkfifo(p)
    return p


def test_rules_check_refuses_a_fifo_instead_of_hanging(fifo):
    r = cli("rules", "check", str(fifo), timeout=30)
    assert r.returncode == 1, r
    assert f"{fifo}:1:1: cannot read: not a regular file (a FIFO) [{UNREADABLE}]" in r.stdout


def test_replay_refuses_a_fifo_as_rules_instead_of_hanging(fifo, tmp_path):
    rec = tmp_path / "rec.jsonl"
    rec.write_text("")
    r = cli("replay", str(rec), "--rules", str(fifo), "--models", "none", timeout=30)
    assert r.returncode == EXIT_INPUT, r
    assert f"not a regular file (a FIFO) [{UNREADABLE}]" in r.stderr and "do not load" in r.stderr


# -- 2. durations: YAML 1.1 numbers and repeated units ------------------------------------


@pytest.mark.parametrize("text", ["010", "1:30", "0x10", "1_000", "0b11", "+010", "1:30.5"])
@pytest.mark.parametrize("key", ["for", "keep_firing_for"])
def test_a_yaml_11_number_is_no_duration(tmp_path, key, text):
    rs, diags = load(tmp_path, rule(f"{key}: {text}\n"))
    assert rs is None and [(d.line, d.col, d.code) for d in diags] == [(7, len(key) + 7, D.BAD_DURATION)], diags
    assert f"{key}: {text!r} is not a duration" in diags[0].message


@pytest.mark.parametrize(
    ("text", "seconds"), [("30", 30.0), ("0", 0.0), ("1.5", 1.5), ("'010'", 10.0), ("1h30m", 5400.0), ("90s", 90.0)]
)
def test_decimal_seconds_and_units_still_load(tmp_path, text, seconds):
    rs, diags = load(tmp_path, rule(f"for: {text}\n"))
    assert diags == [] and rs.rules[0].spec.for_s == seconds


@pytest.mark.parametrize("text", ["5s5s", "5m1m", "30s1m", "1m1h", "500ms1s", "1h 1h"])
def test_each_unit_once_largest_first(tmp_path, text):
    with pytest.raises(ValueError, match="each unit once, largest first"):
        parse_duration(text)
    rs, diags = load(tmp_path, rule(f"for: {text}\n"))
    assert rs is None and [d.code for d in diags] == [D.BAD_DURATION]


def test_units_in_order_still_parse():
    assert parse_duration("1d2h3m4s500ms") == 86400 + 7200 + 180 + 4.5
    assert parse_duration("1h 30m") == 5400.0


# -- 3. values: names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("host", "is the alert's host"),
        ("gpu", "is the alert's gpu"),
        ("gpu_util", "is a catalog field"),
        ("xid_meaning", "is a name of the XID catalogue's text"),
        ("Bad-Name", "is not a name a summary can use"),
        ("'1st'", "is not a name a summary can use"),
    ],
)
def test_a_values_name_that_shadows_or_cannot_be_named_is_refused(tmp_path, key, why):
    rs, diags = load(tmp_path, rule(f"values:\n  ok_name: gpu_temp\n  {key}: gpu_temp * 2\n"))
    assert rs is None and [(d.line, d.col, d.code, d.rule) for d in diags] == [(9, 7, D.BAD_VALUE, "hot")], diags
    assert f"values: {key.strip(chr(39))!r} {why}" in diags[0].message


def test_the_summary_no_longer_reads_a_shadowing_value(tmp_path):
    rs, diags = load(tmp_path, rule("values: {host: gpu_temp, gpu: gpu_util}\n", summary="{host} {gpu}"))
    assert rs is None and {d.code for d in diags} == {D.BAD_VALUE}
    assert sorted(d.message.split("'")[1] for d in diags) == ["gpu", "host"]


def test_values_with_their_own_names_still_load(tmp_path):
    rs, diags = load(tmp_path, rule("values: {peak_temp: gpu_temp, _x2: gpu_temp * 2}\n", summary="{peak_temp}"))
    assert diags == [] and set(rs.rules[0].values) == {"peak_temp", "_x2"}


@pytest.mark.parametrize("key", ["temp", "util", "DCGM_FI_DEV_GPU_TEMP"])
def test_another_spelling_of_a_field_is_a_name_of_its_own(tmp_path, key):
    # Found by a review: refusing every spelling the catalogue resolves broke packs whose values
    # say ``temp``; only the field's own name (its evidence key) shadows it.
    rs, diags = load(tmp_path, rule(f"values: {{{key}: gpu_temp + 1}}\n", summary=f"{{{key}:.0f}}"))
    assert diags == [] and set(rs.rules[0].values) == {key}


# -- 4. files with no rules, and a missing 'rules:' list -------------------------------------


@pytest.mark.parametrize("text", ["", "# to do\n", "rules: []\n", "description: later\nrules: []\n"])
def test_rules_check_warns_of_a_file_with_no_rules(tmp_path, capsys, text):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    assert main(["rules", "check", str(p)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{p}:1:1: warning: this file holds no rules [{NO_RULES}]\n"
    assert "ok: 0 rules in 1 file(s), 1 warning(s)" in err
    assert main(["rules", "check", "--strict", str(p)]) == 1


@pytest.mark.parametrize("text", ["", "rules: []\n"])
def test_a_folder_whose_rule_files_hold_no_rules_is_an_empty_folder(tmp_path, capsys, text):
    d = tmp_path / "pack"
    d.mkdir()
    (d / "a.yaml").write_text(text)
    assert main(["rules", "check", str(d)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"{d}: {NO_RULES_HERE}; nothing checked [GW002]" in err and "ok:" not in err
    rec = tmp_path / "rec.jsonl"
    rec.write_text("")
    assert main(["replay", str(rec), "--rules", str(d), "--models", "none"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"{d}:1:1: {NO_RULES_HERE} [{D.SHAPE}]" in err and "nothing replayed" in err
    rs, diags = load_rules([d, d])  # serve's start and a hot reload: refused, once
    assert rs is None and [str(x) for x in diags] == [f"{d}:1:1: {NO_RULES_HERE} [{D.SHAPE}]"]
    # A pack of models alone is a pack: an empty rule file beside models.yaml is a warning.
    (d / "models.yaml").write_text("models: []\n")
    assert load_rules([d])[1] == []
    (d / "models.yaml").unlink()
    # One rule in another file: a pack, whose empty file is a warning.
    (d / "b.yaml").write_text(GOOD)
    assert main(["rules", "check", str(d)]) == 0
    out, err = capsys.readouterr()
    assert f"{d / 'a.yaml'}:1:1: warning: this file holds no rules [{NO_RULES}]" in out and "ok: 1 rules" in err


@pytest.mark.parametrize(
    "text", ["rules: [\n", "rules:\n", "rulez: []\n", "rules: []\nrulez: []\n", "rules: !foo []\n"]
)
def test_a_folder_whose_file_does_not_load_reports_it(tmp_path, capsys, text):
    d = tmp_path / "pack"
    d.mkdir()
    (d / "a.yaml").write_text(text)
    assert main(["rules", "check", str(d)]) == 1
    assert "[R0" in capsys.readouterr().out


def test_a_missing_rules_list_is_wrong_structure(tmp_path):
    rs, diags = load(tmp_path, "description: a pack\n")
    assert rs is None and [(d.code, d.message) for d in diags] == [(D.SHAPE, "missing 'rules:' list")]


# -- 5. a file that cannot be read -----------------------------------------------------------


def test_a_missing_rule_file_cannot_be_read(tmp_path):
    rs, diags = load_rules([tmp_path / "nope.yaml"])
    assert rs is None and [str(d) for d in diags] == [
        f"{tmp_path / 'nope.yaml'}:1:1: cannot read: No such file or directory [{UNREADABLE}]"
    ]


def test_a_symlink_loop_says_so(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    rs, diags = load_rules([tmp_path / "a.yaml"])
    assert rs is None and [(d.code, d.message) for d in diags] == [
        (UNREADABLE, "cannot read: Too many levels of symbolic links")
    ]


def test_a_rule_test_naming_a_missing_rule_file_says_it_cannot_be_read(tmp_path, capsys):
    t = tmp_path / "tests"
    t.mkdir()
    (t / "t.yaml").write_text(
        "tests:\n  - name: x\n    rule_files: [nope.yaml]\n"
        "    series:\n      - {host: n1, gpu: 0, values: {gpu_temp: 40x5}}\n    never: [hot]\n"
    )
    assert main(["rules", "test", str(t / "t.yaml")]) == 1
    out = capsys.readouterr().out
    assert f"nope.yaml:1:1: cannot read: No such file or directory [{UNREADABLE}]" in out and "R001" not in out


# -- 6. a path named twice -------------------------------------------------------------------


def test_a_path_named_twice_is_read_once(tmp_path, capsys):
    d = tmp_path / "my"
    d.mkdir()
    (d / "mine.yaml").write_text(GOOD)
    (d / "more.yaml").write_text(GOOD.replace("name: hot", "name: hot2"))
    for args in (
        [d, d],
        [d / "mine.yaml", d],
        [d, d / "mine.yaml"],
        [d / "mine.yaml", tmp_path / "my/../my/mine.yaml"],
    ):
        rs, diags = load_rules(args)
        assert diags == [] and len(rs) == (2 if d in args else 1), (args, diags)
    assert rule_files([d / "mine.yaml", d]) == [d / "mine.yaml", d / "more.yaml"]
    assert main(["rules", "check", str(d), str(d)]) == 0
    assert "ok: 2 rules in 2 file(s)" in capsys.readouterr().err


# -- 7. an unknown keyword argument ----------------------------------------------------------


def test_an_unknown_keyword_is_named_even_with_a_duration_value(tmp_path):
    rs, diags = load(tmp_path, GOOD.replace("gpu_temp > 85", "increase(ecc_sbe_volatile, w=1m) > 1"))
    assert rs is None and [(d.line, d.col, d.code) for d in diags] == [(5, 43, D.ARITY)]
    assert "increase() has no argument w=" in diags[0].message
