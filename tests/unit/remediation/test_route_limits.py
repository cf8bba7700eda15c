"""Hostile route files: durations that are not finite, alias bombs and regular expressions RE2
does not accept are refused at load time with the key (and line) that holds them; every pattern
RE2 accepts matches as in Alertmanager, in linear time."""

from __future__ import annotations

import time

import pytest

from pipeline.errors import ConfigError
from pipeline.remediation.config import load_config, parse_config, parse_duration
from pipeline.remediation.routes import Matcher, RouteTree
from tests.unit.remediation.factories import alert, config


def doc(**over):
    d = {"actions": {"log": {"type": "log"}}, "receivers": [{"name": "r", "actions": ["log"]}],
         "route": {"receiver": "r"}, "inventory": {"source": "any"}}
    d.update(over)
    return d


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "9" * 400 + "s", 10 ** 400, "400d",
                                   "1e3s"])
@pytest.mark.parametrize("where, key", [
    (lambda v: {"guardrails": {"cooldown": v}}, "guardrails.cooldown"),
    (lambda v: {"guardrails": {"attempt_window": v}}, "guardrails.attempt_window"),
    (lambda v: {"guardrails": {"breaker": {"window": v}}}, "guardrails.breaker.window"),
    (lambda v: {"route": {"receiver": "r", "group_wait": v}}, "route.group_wait"),
    (lambda v: {"route": {"receiver": "r", "routes": [{"matchers": ['a="b"'], "repeat_interval": v}]}},
     "route.routes[0].repeat_interval"),
    (lambda v: {"actions": {"log": {"type": "log"}, "w": {"type": "webhook", "url": "http://x/", "timeout": v}}},
     "actions.w.timeout"),
])
def test_durations_must_be_finite_and_bounded_naming_the_key(where, key, value):
    with pytest.raises(ConfigError) as e:
        parse_config(doc(**where(value)))
    assert e.value.key == key and e.value.code == "GW100", str(e.value)


def test_durations_within_the_limits_still_parse():
    assert parse_duration("366d", "k") == 366 * 86400 and parse_duration(0, "k") == 0
    assert parse_duration(" 90s ", "k") == 90


def alias_bomb() -> str:
    # About 800 bytes; expanded it is 10^9 strings (msgspec grew by ~100 MB/s converting it).
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for p, q in zip("abcdefgh", "bcdefghi"):
        text += f"{q}: &{q} [" + ",".join([f"*{p}"] * 9) + "]\n"
    return text + "route: {receiver: r, matchers: *i}\nreceivers: [{name: r}]\n"


@pytest.mark.parametrize("text, where", [
    (alias_bomb(), ":6:8: aliases expand to more than"),
    ("route: &r {receiver: r, routes: [*r]}\nreceivers: [{name: r}]\n",
     ":1:34: alias *r refers to a node that contains it"),
    ("route: " + "{routes: [" * 40 + "]}" * 40 + "\n", "nested more than 64 levels deep"),
    ("state_file: " + "x" * 20000 + "\n", "a string longer than"),
    ("# padding\n" * 120_000, "the file is"),
    ("guardrails: {max_attempts: " + "9" * 5000 + "}\n", "cannot read a value"),
])
def test_hostile_yaml_is_a_config_error_with_its_position(tmp_path, text, where):
    p = tmp_path / "routes.yaml"
    p.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert time.monotonic() - t0 < 5
    assert e.value.key == "(yaml)" and where in str(e.value), str(e.value)


@pytest.mark.parametrize("pattern, words", [
    ("(a)\\\\1", "invalid escape sequence"),   # \\ in a quoted matcher is one backslash: a backreference
    ("(?=a)b", "invalid perl operator"),
    ("a\\\\C", "\\C"),                          # RE2 takes \C (any byte); Go, and so Alertmanager, does not
    ("x{99999999999}", "invalid repeat count"),
    ("x{1001}", "invalid repetition size"),
    ("(unclosed", "missing )"),
    ("(" * 600 + ")" * 600, "longer than"),
])
def test_patterns_re2_does_not_accept_are_refused_at_load_time(pattern, words):
    with pytest.raises(ConfigError) as e:
        parse_config(doc(route={"receiver": "r", "routes": [{"matchers": [f'host=~"{pattern}"']}]}))
    assert e.value.key == "route.routes[0].matchers[0]" and words in str(e.value), str(e.value)


@pytest.mark.parametrize("pattern", ["rack7-.*", "staging-.*", "gpu-node-0[0-9]+", "(\\d{1,3}\\.){3}\\d{1,3}",
                                     "hbm_uncorrectable_error|hbm_row_remap_failed|nvlink_xid74",
                                     "(bar|baz)+", ".*-gpu[0-9]+-.*", "(a+)+$", "(a|ab)+", ".*a.*a.*a.*b",
                                     "(?i)GPU-NODE-.*", "(?P<n>x)y", "\\Qa.b\\E"])
def test_ordinary_and_formerly_refused_patterns_are_accepted(pattern):
    Matcher.parse(f'host=~"{pattern}"', "k")


# Patterns that backtrack in Python's re; RE2 decides each in linear time. The expected result is
# Alertmanager's: Go's regexp on ^(?:pattern)$, worked out by hand for these values.
@pytest.mark.parametrize("pattern, value, hit", [
    ("(a+)+$", "a" * 5000 + "!", False),
    ("(a+)+$", "a" * 5000, True),
    (".?" * 40 + "!", "x" * 40, False),
    (".?" * 40 + "!", "x" * 39 + "!", True),
    ("a{0,16}" * 40, "a" * 400 + "b", False),
    ("a{0,16}" * 40, "a" * 400, True),
    ("(rack7-[0-9]+,?)+", "rack7-1,rack7-22", True),
    ("(rack7-[0-9]+,?)+", "rack7-" + "1" * 3000 + "!", False),
    (".*a.*a.*b", "a" * 5000, False),
])
def test_patterns_that_backtrack_in_python_match_in_linear_time(pattern, value, hit):
    m = Matcher.parse(f'host=~"{pattern}"', "k")
    t0 = time.monotonic()
    assert m.matches({"host": value}) is hit
    assert time.monotonic() - t0 < 1  # generous: RE2 takes microseconds; re took seconds to hours


def test_regex_matchers_are_full_matches_and_a_trailing_newline_does_not_match():
    eq, ne = Matcher.parse('host=~"n1"', "k"), Matcher.parse('host!~"n1"', "k")
    assert eq.matches({"host": "n1"}) and not eq.matches({"host": "n1\n"}) and not eq.matches({"host": "xn1"})
    assert ne.matches({"host": "n1\n"}) and not ne.matches({"host": "n1"})
    assert Matcher.parse('fault=~"a|b"', "k").matches({"fault": "b"})
    # A value cannot close the anchoring group: "a)|(b" made ^(?:a)|(b)$, true for "a-anything"
    # (Alertmanager refuses it too: the value must compile on its own).
    with pytest.raises(ConfigError):
        Matcher.parse('host=~"a)|(b"', "k")
    with pytest.raises(ConfigError):
        Matcher.parse('host="n1"\nseverity="critical"', "k")


def test_long_values_are_matched_like_any_other(tmp_path):
    # Before: a value over 256 characters matched no =~ or !~ matcher (a guard for re's
    # backtracking), unlike Alertmanager; RE2 needs no such guard.
    cfg = config(tmp_path, actions={"log": {"type": "log"}, "drain": {"type": "slurm_drain"}},
                 receivers=[{"name": "log", "actions": ["log"]}, {"name": "drain", "actions": ["drain"]}],
                 route={"receiver": "log", "routes": [{"matchers": ['host!~"staging-.*"'], "receiver": "drain"}]})
    tree = RouteTree.build(cfg.raw.route)
    assert [m.receiver for m in tree.match(alert("prod-1"))] == ["drain"]
    assert [m.receiver for m in tree.match(alert("p" * 300))] == ["drain"]
    assert [m.receiver for m in tree.match(alert("staging-" + "p" * 300))] == ["log"]


def test_a_command_query_match_is_checked_like_a_matcher():
    with pytest.raises(ConfigError) as e:
        parse_config(doc(actions={"log": {"type": "log"}, "c": {"type": "command", "argv": ["true"], "query": ["q"],
                                                                 "query_match": "(x+"}}))
    assert e.value.key == "actions.c.query_match" and "RE2" in str(e.value)
    parse_config(doc(actions={"log": {"type": "log"},
                              "c": {"type": "command", "argv": ["true"], "query": ["q"], "query_match": "(x+)+y"}}))


def test_the_shipped_routes_file_still_loads():
    from pathlib import Path
    load_config(Path(__file__).resolve().parents[3] / "rules" / "routes.yaml")


def test_a_route_regex_re2_does_not_accept_is_a_load_error_with_file_and_line(tmp_path):
    # Before: the error named the key only; an operator with a long routes file had to count.
    p = tmp_path / "routes.yaml"
    p.write_text('actions: {log: {type: log}}\nreceivers: [{name: r, actions: [log]}]\ninventory: {source: any}\n'
                 'route:\n  receiver: r\n  routes:\n    - matchers: [\'fault="x"\']\n'
                 '    - matchers:\n        - \'fault="y"\'\n        - \'host=~"(a)\\\\1"\'\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "route.routes[1].matchers[1]"
    assert f"{p}:10:11: matcher" in str(e.value) and "RE2" in str(e.value), str(e.value)
