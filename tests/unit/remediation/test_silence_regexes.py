"""Hostile Alertmanager silences, read from a loopback silences API: each alert is decided in well
under a second, and a silence matches exactly the alerts Alertmanager would silence (Go's RE2 on
``^(?:pattern)$``; tests/integration/test_alertmanager.py checks the same silences against a
real Alertmanager)."""

from __future__ import annotations

import logging
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.remediation.alertmanager import Silences, silence_matches
from tests.unit.remediation.factories import HOSTILE_SILENCES as HOSTILE
from tests.unit.remediation.factories import SilencesApi, alert, silence

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300"))



@pytest.fixture
def api():
    made: list[SilencesApi] = []

    def make(silences):
        s = SilencesApi(silences)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("pattern, host, hit", HOSTILE)
def test_hostile_silences_are_decided_fast_and_as_alertmanager_decides(api, pattern, host, hit):
    srv = api([silence("s-1", ("host", pattern, True, True))])
    s = Silences(srv.url, timeout=5, cache=60)
    t0 = time.monotonic()
    got = s.matching(alert(host))
    assert time.monotonic() - t0 < 1.0  # RE2: microseconds per match; the fetch is loopback
    assert (got is not None) is hit


def test_one_narrow_silence_does_not_stop_remediation_fleet_wide(api):
    srv = api([silence("narrow", ("host", "(rack7-[0-9]+,?)+", True, True))])
    s = Silences(srv.url, timeout=5, cache=60)
    assert [h for h in ("gpu-node-1", "rack7-3", "rack8-1") if s.matching(alert(h))] == ["rack7-3"]


def test_a_silence_re2_does_not_accept_is_ignored_counted_and_logged_once(api, caplog):
    bad = silence("bad", ("host", "(a)\\1", True, True))  # a backreference: Alertmanager refuses it too
    good = silence("good", ("host", "n[0-9]+", True, True))
    srv = api([bad, good])
    s = Silences(srv.url, timeout=5, cache=0)
    with caplog.at_level(logging.WARNING, logger="gpuwarden.remediation.alertmanager"):
        assert s.matching(alert("aa")) is None  # the bad one silences nothing
        assert s.matching(alert("n7")).id == "good"
        assert s.matching(alert("zz")) is None
    assert s.ignored_total == 1 and list(s.ignored) == ["bad"] and "invalid escape" in s.ignored["bad"]
    assert sum("silence bad" in r.getMessage() for r in caplog.records) == 1
    assert srv.gets == 3


def test_go_syntax_is_kept_where_re2_differs(api):
    # Go refuses \C and a repeat count it cannot read; RE2 would take \C as "any byte" and
    # x{99999999999} as literal text. Alertmanager has no such silence: here they silence nothing.
    srv = api([silence("c", ("host", "n\\C", True, True)), silence("big", ("host", "x{99999999999}", True, True))])
    s = Silences(srv.url, timeout=5, cache=60)
    assert s.matching(alert("n1")) is None and s.matching(alert("x{99999999999}")) is None
    assert sorted(s.ignored) == ["big", "c"]


def test_negative_and_missing_label_matchers_follow_alertmanager(api):
    srv = api([silence("ne", ("host", "gpu-.*", True, False), ("rack", "", False, True))])
    s = Silences(srv.url, timeout=5, cache=60)
    assert s.matching(alert("cpu-1")) is not None          # host !~ gpu-.*, rack missing = ""
    assert s.matching(alert("gpu-1")) is None


def test_many_silences_with_hostile_patterns_still_decide_each_alert_fast(api):
    pats = [p for p, _, _ in HOSTILE] * 50
    srv = api([silence(f"s{i}", ("host", p + f"|z{i}", True, True)) for i, p in enumerate(pats)])
    s = Silences(srv.url, timeout=5, cache=60)
    s.matching(alert("warm-up"))
    t0 = time.monotonic()
    for h in ("gpu-node-0001.cluster", "a" * 60 + "-1", "gpu-node-7"):
        assert s.matching(alert(h)) is None
    assert time.monotonic() - t0 < 3.0  # 400 silences x 3 alerts


_ATOMS = st.sampled_from(["a", "b", ".", "[ab]", "[^a]", "a?", "a*", "b+", "(a|ab)", "(a+)+", "a{0,3}", "\\d", "-"])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ATOMS, min_size=1, max_size=12), st.text(alphabet="ab-1", max_size=40))
def test_full_match_agrees_with_alertmanagers_anchoring(atoms, value):
    # Alertmanager runs ^(?:p)$ as a search; here p runs as a full match: the same answer for
    # every pattern that compiles on its own.
    import re2

    pattern = "".join(atoms)
    sil = type("S", (), {"matchers": [type("M", (), {"name": "host", "value": pattern, "isRegex": True,
                                                      "isEqual": True})()]})()
    got = silence_matches(sil, {"host": value})
    assert got == (re2.compile("^(?:" + pattern + ")$").search(value) is not None)
