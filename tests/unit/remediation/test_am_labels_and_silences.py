"""Alertmanager pieces without a server: the labels and annotations an alert is posted with,
how a silence's matchers match (Alertmanager's semantics), and what the silence cache does."""

from __future__ import annotations

import json
from types import SimpleNamespace

import msgspec
import pytest

from pipeline.remediation.alertmanager import (
    AlertmanagerAction,
    SilenceError,
    Silences,
    am_alert,
    am_labels,
    silence_matches,
)
from tests.unit.remediation.factories import T0, alert


class _Sil(msgspec.Struct):
    matchers: list


class _M(msgspec.Struct):
    name: str
    value: str
    isRegex: bool = False   # noqa: N815
    isEqual: bool = True    # noqa: N815


def sil(*ms: _M) -> _Sil:
    return _Sil(list(ms))


def test_labels_carry_the_routing_keys_and_drop_bad_names():
    a = alert("n1", 2, job="train-1", labels={"team": "ml", "bad-name": "x", "host": "forged", "pod": "p0"})
    lab = am_labels(a)
    assert lab["alertname"] == a.rule and lab["host"] == "n1" and lab["gpu"] == "2" and lab["job"] == "train-1"
    assert lab["team"] == "ml" and lab["pod"] == "p0" and "bad-name" not in lab
    assert am_labels(alert(None, None))["source"] == "gpuwarden" and "host" not in am_labels(alert(None, None))


def test_firing_ends_after_four_resend_intervals_and_resolved_at_its_time():
    a = alert("n1", 0, ts=T0)
    a.evidence = {"b": 2.0, "a": 1.0}
    doc = am_alert(a, now=T0 + 10, resend_interval=60)
    assert doc["startsAt"] == "2025-11-29T07:59:30.000Z" and doc["endsAt"] == "2025-11-29T08:04:10.000Z"
    assert doc["annotations"]["evidence"] == '{"a":1.0,"b":2.0}' and json.loads(doc["annotations"]["evidence"])
    r = alert("n1", 0, state="resolved", ts=T0 + 99)
    assert am_alert(r, now=T0 + 500, resend_interval=60)["endsAt"] == "2025-11-29T08:01:39.000Z"


def test_a_resolve_is_posted_with_the_labels_it_fired_with():
    act = AlertmanagerAction("am", "http://127.0.0.1:9")
    a = alert("n1", 0, id="x", job="old-job")
    act.firing["x"] = (a, am_labels(a))
    r = alert("n1", 0, id="x", job="new-job", state="resolved")
    body = json.loads(act.plan(r).body)
    assert body[0]["labels"]["job"] == "old-job" and "endsAt" in body[0]


@pytest.mark.parametrize("matchers, hit", [
    ([_M("host", "n1")], True),
    ([_M("host", "n2")], False),
    ([_M("host", "n1"), _M("severity", "warning")], False),            # every matcher must match
    ([_M("host", "n[0-9]+", isRegex=True)], True),
    ([_M("host", "n", isRegex=True)], False),                           # anchored, as in Alertmanager
    ([_M("host", "n1", isEqual=False)], False),
    ([_M("host", "n2", isEqual=False)], True),
    ([_M("rack", "")], True),                                           # a missing label is ""
    # Before: patterns re's backtracking could not run safely counted as matching every host.
    ([_M("host", "(a+)+$", isRegex=True)], False),
    ([_M("host", "(rack7-[0-9]+,?)+", isRegex=True)], False),
    ([_M("host", "(n[0-9]+,?)+", isRegex=True)], True),
    ([_M("host", "(unclosed", isRegex=True)], False),                   # Alertmanager refuses it: silences nothing
])
def test_silence_matchers(matchers, hit):
    assert silence_matches(sil(*matchers), am_labels(alert("n1", 0))) is hit


class _FakeSilences(Silences):
    def __init__(self, answers, clock):
        super().__init__("http://127.0.0.1:9", cache=15, clock=clock)
        self.answers, self.fetches = list(answers), 0

    def _fetch(self):
        self.fetches += 1
        ans = self.answers.pop(0)
        if isinstance(ans, Exception):
            raise ans
        return ans


def test_silences_are_cached_and_so_is_a_failure():
    t = [0.0]
    s = _FakeSilences([SilenceError("down"), []], clock=lambda: t[0])
    with pytest.raises(SilenceError):
        s.active()
    t[0] = 10
    with pytest.raises(SilenceError):          # the failure is remembered for the cache period
        s.active()
    assert s.fetches == 1
    t[0] = 16
    assert s.active() == [] and s.fetches == 2


def _silenced_host(host: str) -> _FakeSilences:
    one = SimpleNamespace(id="sil-1", matchers=[_M("host", host)], createdBy="bob", comment="rack move",
                          endsAt="2026-12-02T00:00:00Z", status=SimpleNamespace(state="active"))
    return _FakeSilences([[one]], clock=lambda: 0.0)


def test_only_node_actions_honour_a_silence(tmp_path, harness, fakes):
    from tests.unit.remediation.factories import config
    cfg = config(tmp_path, actions={"ckpt": {"type": "checkpoint"}, "drain": {"type": "slurm_drain"},
                                    "log": {"type": "log"}},
                 receivers=[{"name": "r", "actions": ["ckpt", "drain", "log"]}], route={"receiver": "r"})
    h = harness(cfg)
    h.rem.silences = _silenced_host("n1")
    recs = h.handle(alert("n1", 0, job="42"))
    assert [(r.action, r.decision) for r in recs] == [("ckpt", "acted"), ("drain", "skipped"), ("log", "acted")]
    assert recs[1].reason.startswith("maintenance: silenced in Alertmanager by silence sil-1 (bob: rack move)")
    assert fakes.calls("scancel") == [["--signal=USR1", "--full", "42"]] and fakes.calls("scontrol") == []


def test_dry_run_does_not_ask_alertmanager(tmp_path, harness):
    from tests.unit.remediation.factories import config
    cfg = config(tmp_path, guardrails={"dry_run": True})
    h = harness(cfg)
    s = _FakeSilences([SilenceError("must not be asked")], clock=lambda: 0.0)
    h.rem.silences = s
    assert [r.decision for r in h.handle(alert("n1", 0))] == ["dry_run"] and s.fetches == 0


def test_a_failed_firing_post_is_re_posted_later_and_a_failed_resolve_is_not_re_fired():
    from pipeline.remediation.actions import Context, Outcome
    act = AlertmanagerAction("am", "http://127.0.0.1:9", resend_interval=1)
    posts: list[list] = []
    ok = [False]

    def post(body, ctx):
        posts.append(json.loads(body))
        return Outcome(ok[0], "x", error=None if ok[0] else "down")

    act._post = post                                            # type: ignore[method-assign]
    a = alert("n1", 0, id="f1")
    assert not act.execute(act.plan(a), Context()).ok           # Alertmanager down
    ok[0] = True
    assert act.tick(T0, Context()).ok and [x["labels"]["host"] for x in posts[-1]] == ["n1"]
    ok[0] = False
    assert not act.execute(act.plan(alert("n1", 0, id="f1", state="resolved")), Context()).ok
    assert act.firing == {} and act.tick(T0 + 5, Context()) is None   # never re-posted as firing


def test_an_alert_id_dropped_past_the_firing_bound_is_logged_on_one_line(monkeypatch, caplog):
    # Found in review: the one alert value logged without printable(): an id from the alerts topic
    # with a line break forged a second log line.
    import logging

    from pipeline.remediation import alertmanager
    from pipeline.remediation.actions import Context, Outcome

    monkeypatch.setattr(alertmanager, "MAX_FIRING", 1)
    act = AlertmanagerAction("am", "http://127.0.0.1:9")
    act._post = lambda body, ctx: Outcome(True, "x")             # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        act.execute(act.plan(alert("n1", 0, id="a\nCRITICAL forged line")), Context())
        act.execute(act.plan(alert("n1", 1, id="b")), Context())
    msgs = [r.getMessage() for r in caplog.records if "no longer re-posting" in r.getMessage()]
    assert msgs == ["alertmanager am: more than 1 alerts or 64 MiB firing; no longer re-posting a\\nCRITICAL forged line"]


def test_the_firing_set_is_bounded_in_bytes_and_the_oldest_forgotten(monkeypatch):
    # Found in review: the firing set was bounded in count only, so 10,000 alerts of a megabyte
    # each (a forged flood on the alerts topic) were 10 GB held and re-posted every minute.
    from pipeline.remediation import alertmanager
    from pipeline.remediation.actions import Context, Outcome

    act = AlertmanagerAction("am", "http://127.0.0.1:9")
    act._post = lambda body, ctx: Outcome(True, "x")             # type: ignore[method-assign]
    big = [_said(alert("n1", g, id=f"a{g}"), "x" * 10_000) for g in range(5)]
    one = len(alertmanager.encode(alertmanager._Firing(alert=big[0], labels=am_labels(big[0]))))
    monkeypatch.setattr(alertmanager, "MAX_FIRING_BYTES", 3 * one + one // 2)
    for a in big:
        act.execute(act.plan(a), Context())
    assert list(act.firing) == ["a2", "a3", "a4"]
    act.execute(act.plan(alert("n1", 3, id="a3", state="resolved")), Context())
    act.execute(act.plan(alert("n1", 7, id="small")), Context())   # room again: nothing forgotten
    assert list(act.firing) == ["a2", "a4", "small"]


def test_a_large_firing_set_is_re_posted_in_bounded_requests(monkeypatch):
    from pipeline.remediation import alertmanager
    from pipeline.remediation.actions import Context, Outcome

    posts: list[bytes] = []
    act = AlertmanagerAction("am", "http://127.0.0.1:9")
    act._post = lambda body, ctx: (posts.append(body), Outcome(True, "x"))[1]  # type: ignore[method-assign]
    for g in range(40):
        act.execute(act.plan(_said(alert("n1", g % 8, id=f"a{g}"), "y" * (50 * g))), Context())
    posts.clear()
    monkeypatch.setattr(alertmanager, "MAX_POST_BYTES", 8_000)
    assert act.tick(T0 + 1e6, Context()).ok
    assert len(posts) > 3 and all(len(p) <= 8_000 for p in posts)
    sent = [x["annotations"]["alert_id"] for p in posts for x in json.loads(p)]
    assert sent == [f"a{g}" for g in range(40)]                    # each once, oldest first
    # One alert larger than a request goes alone; Alertmanager down stops the round.
    act.execute(act.plan(_said(alert("n1", 0, id="huge"), "z" * 20_000)), Context())
    posts.clear()
    assert act.tick(T0 + 2e6, Context()).ok and len(json.loads(posts[-1])) == 1
    act._post = lambda body, ctx: (posts.append(body), Outcome(False, "down"))[1]  # type: ignore[method-assign]
    posts.clear()
    assert not act.tick(T0 + 3e6, Context()).ok and len(posts) == 1


def _said(a, summary: str):
    return msgspec.structs.replace(a, summary=summary)


def test_a_refused_request_does_not_keep_the_others_from_alertmanager(monkeypatch):
    # Found in review: the round stopped at any failed request, so one alert Alertmanager refuses
    # (or a proxy's smaller body limit) kept every later request's alerts from being re-posted,
    # and Alertmanager resolved them although it was up.
    from pipeline.remediation import alertmanager
    from pipeline.remediation.actions import Context, Outcome

    posts: list[list[str]] = []

    def post(body, ctx):
        ids = [x["annotations"]["alert_id"] for x in json.loads(body)]
        posts.append(ids)
        return Outcome("a3" not in ids, "x", error=None if "a3" not in ids else "400 Bad Request")

    act = AlertmanagerAction("am", "http://127.0.0.1:9")
    act._post = lambda body, ctx: Outcome(True, "x")             # type: ignore[method-assign]
    for g in range(8):
        act.execute(act.plan(_said(alert("n1", g, id=f"a{g}"), "s" * 2000)), Context())
    act._post = post                                              # type: ignore[method-assign]
    monkeypatch.setattr(alertmanager, "MAX_POST_BYTES", 6_000)
    out = act.tick(T0 + 1e6, Context())
    assert not out.ok and "400" in out.error
    assert sorted(i for p in posts for i in p) == [f"a{g}" for g in range(8)]   # every request went


def test_after_a_restart_the_oldest_firing_alert_is_still_the_first_forgotten(tmp_path, monkeypatch):
    # Found in review: the kept set came back in the store's order (by alert id, a hash), so the
    # bound forgot alerts at random after a restart, not the oldest.
    from pipeline.remediation import alertmanager
    from pipeline.remediation.actions import Context, Outcome
    from pipeline.remediation.guardrails import StateStore

    store = StateStore(tmp_path / "s.sqlite")
    act = AlertmanagerAction("am", "http://127.0.0.1:9")
    act.bind_store(store)
    act._post = lambda body, ctx: Outcome(True, "x")             # type: ignore[method-assign]
    for k, name in enumerate(["z-old", "m-mid", "a-new"]):       # ids against their age order
        act.execute(act.plan(alert("n1", k, id=name, ts=T0 + 100 * k)), Context())
    monkeypatch.setattr(alertmanager, "MAX_FIRING", 2)
    again = AlertmanagerAction("am", "http://127.0.0.1:9")
    again.bind_store(store)
    assert list(again.firing) == ["m-mid", "a-new"]
    assert sorted(k for k, _ in store.kv_all("am:am")) == ["a-new", "m-mid"]
    store.close()
