"""Hostile inputs to the incidents config loader and the Alertmanager config made from it
(docs/rules.md#incidents): what a review found, each a test that failed before its fix."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.incidents import config as config_mod
from pipeline.incidents.amconfig import alertmanager_config, glob_regex
from pipeline.incidents.config import Cause, load_config, parse_config

CODE = re.compile(r"I0(0[1-9]|1[0-3])")


def _diags(text: str) -> list[str]:
    cfg, diags = parse_config(text, "i.yaml")
    assert (cfg is None) == bool(diags)
    assert all(CODE.fullmatch(d.code) and d.line >= 1 and d.col >= 1 for d in diags)
    return [str(d) for d in diags]


def _go_regex_ok(rx: str) -> bool:
    """What Python's ``re`` cannot tell of Go's regexp (Alertmanager's): no groups or lookarounds,
    and a backslash only before ASCII punctuation (``\\a`` is a bell in Go, ``\\é`` an error)."""
    escaped = re.findall(r"\\(.)", rx, re.S)
    return "(?" not in rx and all(c.isascii() and not (c.isalnum() or c == "_") for c in escaped)


# ---- amconfig: bracket patterns the loader accepts became regexes Alertmanager refuses


@pytest.mark.parametrize("pattern", ["[]", "[]]", "[]a]", "x[]", "[[]"])
def test_loaded_bracket_patterns_give_valid_regexes_that_match_as_fnmatch(pattern: str) -> None:
    text = f"causality:\n  - name: c\n    cause: [gpu_x]\n    explains: ['{pattern}']\n"
    cfg, diags = parse_config(text)
    assert cfg is not None, diags
    rx = glob_regex(cfg.causality[0].explains)
    assert _go_regex_ok(rx)
    compiled = re.compile(f"(?:{rx})")  # Alertmanager anchors it
    for name in ["[", "]", "a", "x", "[]", "]]", "]a", "x[]", "[a]", "x]", "[[", ""]:
        assert bool(compiled.fullmatch(name)) == fnmatch.fnmatchcase(name, pattern), (pattern, name, rx)
    target = alertmanager_config(cfg)["inhibit_rules"][0]["target_matchers"][2]
    assert target.startswith('alertname=~"') and target.endswith('"')


@settings(max_examples=50, deadline=None)
@given(
    # no "-": fnmatch's ranges ("[a-z]") are not translated, and the loader allows no "-"
    st.lists(st.text(alphabet="ab[]!*?_.", max_size=8), min_size=1, max_size=3),
    st.lists(st.text(alphabet="ab[]!_.", max_size=6), max_size=8),
)
def test_glob_regex_is_fnmatch_for_any_pattern(patterns: list[str], names: list[str]) -> None:
    rx = glob_regex(patterns)
    assert _go_regex_ok(rx)
    compiled = re.compile(f"(?:{rx})")
    for name in names:
        assert bool(compiled.fullmatch(name)) == any(fnmatch.fnmatchcase(name, p) for p in patterns), (patterns, name)


def test_glob_regex_leaves_non_ascii_unescaped() -> None:
    assert _go_regex_ok(glob_regex(["gpu\u2014x", "caf\u00e9_*"]))


# ---- load_config: a FIFO made the driver wait for a writer, for ever


def test_a_fifo_is_a_diagnostic_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "incidents.yaml"
    os.mkfifo(fifo)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(load_config(fifo)), daemon=True)
    t.start()
    t.join(10)
    try:
        assert got, "load_config blocked opening a FIFO"
        cfg, diags = got[0]
        assert cfg is None and [(d.code, d.line, d.col) for d in diags] == [("I013", 1, 1)]
    finally:
        if t.is_alive():  # let the blocked open see a writer and end
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            t.join(10)


# ---- the stage asks every entry about every rule of a near incident, for every alert


class _CountingFnmatch:
    def __init__(self) -> None:
        self.calls = 0

    def fnmatchcase(self, name: str, pat: str) -> bool:
        self.calls += 1
        return fnmatch.fnmatchcase(name, pat)

    def translate(self, pat: str) -> str:
        self.calls += 1
        return fnmatch.translate(pat)


def test_a_rule_asked_again_is_not_matched_against_every_pattern_again(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _CountingFnmatch()
    monkeypatch.setattr(config_mod, "fnmatch", counter)
    pats = tuple(f"*z{i}*q" for i in range(100))
    c = Cause("c", pats, pats, "host")
    counter.calls = 0
    for _ in range(200):
        assert not c.caused_by(("gpu_xid_warning", "nvlink_down"))
        assert not c.explains_rule("gpu_xid_warning")
    # Before: 100 patterns x 3 names x 200 asks = 60,000 fnmatch calls.
    assert counter.calls < 200


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.text(alphabet="ab[]*?_", min_size=1, max_size=6), min_size=1, max_size=4),
    st.lists(st.text(alphabet="ab[]_", max_size=5), min_size=1, max_size=6),
)
def test_cause_matching_is_fnmatch(patterns: list[str], rules: list[str]) -> None:
    c = Cause("c", tuple(patterns), tuple(patterns), "gpu")
    for _ in range(2):  # asked again: the remembered answer
        for r in rules:
            want = any(fnmatch.fnmatchcase(r, p) for p in patterns)
            assert c.explains_rule(r) == want and c.caused_by((r,)) == want
        assert c.caused_by(rules) == any(fnmatch.fnmatchcase(r, p) for r in rules for p in patterns)
    assert c == Cause("c", tuple(patterns), tuple(patterns), "gpu")


# ---- configs accepted that make the stage do other than they say

POLICY = "policies:\n  - {name: p, count: %s, per: %s, threshold: 3, window: 1h, action: watch, %s}\n"


def test_a_bad_xid_list_is_one_diagnostic_not_also_a_missing_one() -> None:
    text = POLICY % ("xid", "gpu", "xids: [bad]")
    col = text.splitlines()[1].index("bad") + 1
    assert _diags(text) == [f"i.yaml:2:{col}: policy p: xids: 'bad' is not a whole number from 1 to 1000000 [I006]"]


def test_bad_rules_of_count_alerts_are_one_diagnostic() -> None:
    assert [d[-6:] for d in _diags(POLICY % ("alerts", "gpu", "rules: [BAD]"))] == ["[I006]"]


@pytest.mark.parametrize(
    "count, per, extra",
    [("alerts", "gpu", "rules: [x], xids: [79]"), ("incidents", "host", "rules: [x]")],
)
def test_a_key_the_count_does_not_read_is_refused(count: str, per: str, extra: str) -> None:
    key = extra.split(",")[-1].split(":")[0].strip()
    text = POLICY % (count, per, extra)
    col = text.splitlines()[1].index(f"{key}:") + 1  # the key's own position
    assert _diags(text) == [f"i.yaml:2:{col}: policy p: count {count} does not use {key} [I006]"]


def test_causality_with_nothing_to_cause_or_explain_is_refused() -> None:
    text = "causality:\n  - name: c\n    cause: []\n    explains: []\n"
    assert _diags(text) == [
        "i.yaml:3:12: causality c: cause needs at least one rule or pattern [I006]",
        "i.yaml:4:15: causality c: explains needs at least one rule or pattern [I006]",
    ]


@pytest.mark.parametrize("value", ["010", "1:30", "1:00:00", "0x10", "1_000", "0b11", "1_0.5"])
def test_numbers_yaml_reads_other_than_as_decimal_are_not_durations(value: str) -> None:
    assert _diags(f"join_window: {value}\n") == [
        f"i.yaml:1:14: join_window: {value!r} is not a duration (use e.g. 90s, 1m30s, 1h30m) [I007]"
    ]


@pytest.mark.parametrize("value, secs", [("90", 90.0), ("0", 0.0), ("0.5", 0.5), ("'010'", 10.0), ("1m30s", 90.0)])
def test_decimal_durations_still_load(value: str, secs: float) -> None:
    cfg, diags = parse_config(f"join_window: {value}\n")
    assert cfg is not None and cfg.join_window == secs, diags


# ---- hostile inputs that were already refused with a position: kept so


@pytest.mark.parametrize(
    "text, code",
    [
        ("join_window: -5m", "I007"),
        ("join_window: 1e400", "I007"),
        ("join_window: 999999999999d", "I007"),
        ("join_window: PT5M", "I007"),
        ("join_window: .nan", "I007"),
        ("join_window: " + "9" * 400, "I007"),
        ("join_window: [1]", "I007"),
        ("join_window: 1m\njoin_window: 2m", "I008"),
        ("actions: []", "I006"),
        ("actions: [watch, watch]", "I008"),
        ("causality: {}", "I003"),
        ("causality: [{name: a, cause: [x], explains: [y]}, {name: a, cause: [y], explains: [x]}]", "I008"),
        ("causality: [{name: a, cause: ['" + "*" * 65 + "'], explains: [y]}]", "I006"),
        ("causality:\n" + "".join(f"  - {{name: c{i}, cause: [x], explains: [y]}}\n" for i in range(201)), "I010"),
        ("!!python/object:os.system {}", "I002"),
        (
            "a: &a [x,x,x,x,x,x,x,x,x]\n"
            + "".join(f"{k}: &{k} [{', '.join(['*' + p] * 9)}]\n" for p, k in zip("abcd", "bcde")),
            "I011",
        ),
        ("a: &a [*a]", "I011"),
        ("a: " + "[" * 40 + "]" * 40, "I012"),
    ],
)
def test_hostile_inputs_are_diagnostics(text: str, code: str) -> None:
    diags = _diags(text)
    assert diags and diags[0].endswith(f"[{code}]"), diags
