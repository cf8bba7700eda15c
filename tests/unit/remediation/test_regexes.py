"""pipeline/remediation/regexes.py: RE2 with Alertmanager's anchoring and Go's syntax."""

from __future__ import annotations

import pytest

from pipeline.remediation.regexes import Anchored, RegexError, Searching


@pytest.mark.parametrize("pattern, value, hit", [
    ("\\Q\\C\\E", "\\C", True),          # \C inside \Q...\E is literal text in Go and RE2
    ("x{01}", "x{01}", True),             # a count with a leading zero: braces are literal in both
    ("x{1000}", "x" * 1000, True),
    ("[{]{2}", "{{", True),               # a brace in a class is no repeat
    ("n1", "n1\n", False),                # no trailing-newline leniency ($ is the end of text)
    ("(?i)k", "\u212a", True),            # Kelvin sign folds to k, as in Go
    ("\\s", "\v", False),                 # \s is [\t\n\f\r ] in Go and RE2
    ("a.b", "a\ud800b", True),            # a lone surrogate reads as U+FFFD (Go's JSON decoder)
])
def test_matching_follows_go(pattern, value, hit):
    assert Anchored(pattern).matches(value) is hit


@pytest.mark.parametrize("pattern", ["a\\C", "x{99999999999}", "x{1,100000}", "(a)\\1", "a)|(b", "\\Z",
                                     "\\pL{1000}"])
def test_what_go_or_re2_refuses_is_a_regex_error(pattern):
    with pytest.raises(RegexError):
        Anchored(pattern)


def test_searching_finds_the_leftmost_match_in_linear_time():
    s = Searching(r"\bState=\S*(?:DRAIN|DOWN)\S*")
    assert s.search("NodeName=n1 State=IDLE+DRAIN ThreadsPerCore=2") == "State=IDLE+DRAIN"
    assert s.search("State=IDLE " * 10_000) is None
