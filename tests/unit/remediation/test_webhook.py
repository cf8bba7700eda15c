"""Webhooks against a real HTTP server on 127.0.0.1: retry on 5xx and connection errors, with
exponential backoff and jitter; never on 4xx; the alert JSON as the body; secrets not audited."""

from __future__ import annotations

import random
import socket
import time

import msgspec
import pytest

from pipeline.remediation.actions import Context, WebhookAction, redact_url
from pipeline.schema import AlertEvent
from tests.unit.remediation.factories import alert, config


def _run(action: WebhookAction, a: AlertEvent, sleeps: list[float] | None = None):
    def sleep(d: float) -> None:
        if sleeps is not None:
            sleeps.append(d)
        time.sleep(d)

    plan = action.plan(a)
    return action.execute(plan, Context(sleep=sleep, rng=random.Random(1)))


def test_5xx_is_retried_with_growing_backoff_then_succeeds(server):
    s = server([503, 502, 500, 200])
    act = WebhookAction("hook", s.url + "/hook/{host}", retries=4, backoff=0.1, max_backoff=5)
    sleeps: list[float] = []
    a = alert("gpu-node-3", 2)
    out = _run(act, a, sleeps)
    assert out.ok and out.attempts == 4 and out.detail == "HTTP 200"
    assert len(s.hits) == 4 and s.hits[0]["path"] == "/hook/gpu-node-3"
    assert msgspec.json.decode(s.hits[0]["body"], type=AlertEvent) == a
    assert s.hits[0]["headers"]["Content-Type"] == "application/json"
    # exponential: attempt i waits in [d/2, d] with d = 0.1 * 2^i
    for i, d in enumerate(sleeps):
        assert 0.1 * 2 ** i / 2 <= d <= 0.1 * 2 ** i
    gaps = [b["t"] - a_["t"] for a_, b in zip(s.hits, s.hits[1:])]
    assert all(g >= d for g, d in zip(gaps, sleeps))
    assert gaps[2] > gaps[0]


def test_jitter_spreads_the_delays_and_max_backoff_caps_them():
    act = WebhookAction("h", "http://127.0.0.1:9/x", backoff=1.0, max_backoff=4.0)
    rng = random.Random(7)
    first = [act.delay(0, rng) for _ in range(200)]
    assert min(first) >= 0.5 and max(first) <= 1.0 and len(set(first)) > 150
    assert all(2.0 <= act.delay(10, rng) <= 4.0 for _ in range(50))


@pytest.mark.parametrize("code", [400, 401, 404, 422, 302])
def test_4xx_and_redirects_are_not_retried(server, code):
    s = server([code, 200])
    out = _run(WebhookAction("hook", s.url + "/h", retries=5, backoff=0.01), alert())
    assert not out.ok and out.attempts == 1 and len(s.hits) == 1
    assert f"HTTP {code}" in out.error and "not retried" in out.error


def test_5xx_until_retries_run_out_fails(server):
    s = server([503])
    out = _run(WebhookAction("hook", s.url, retries=2, backoff=0.01), alert())
    assert not out.ok and out.attempts == 3 and len(s.hits) == 3 and "after 3 attempt(s)" in out.error


def test_connection_errors_are_retried():
    with socket.socket() as sock:                       # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps: list[float] = []
    out = _run(WebhookAction("hook", f"http://127.0.0.1:{port}/h", retries=3, backoff=0.01, timeout=2), alert(),
               sleeps)
    assert not out.ok and out.attempts == 4 and len(sleeps) == 3 and "ConnectError" in out.error


def test_timeout_counts_as_a_connection_error(server):
    # a server that accepts but never answers
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    try:
        t0 = time.monotonic()
        out = _run(WebhookAction("hook", f"http://127.0.0.1:{lsock.getsockname()[1]}/h", retries=1, backoff=0.01,
                                 timeout=0.3), alert())
        assert not out.ok and out.attempts == 2 and "Timeout" in out.error
        assert time.monotonic() - t0 < 5
    finally:
        lsock.close()


def test_secret_headers_are_sent_but_never_audited(server, tmp_path, harness, monkeypatch, caplog):
    s = server([200])
    monkeypatch.setenv("GW_TEST_TOKEN", "s3cr3t-token")
    cfg = config(tmp_path, actions={"page": {"type": "webhook", "url": s.url + "/p?token=abc",
                                             "headers_env": {"Authorization": "GW_TEST_TOKEN"}}},
                 receivers=[{"name": "r", "actions": ["page"]}], route={"receiver": "r"})
    h = harness(cfg)
    caplog.set_level("DEBUG")
    out = h.handle(alert())
    assert out[0].decision == "acted" and s.hits[0]["headers"]["Authorization"] == "s3cr3t-token"
    assert out[0].url == s.url + "/p?token=***"
    assert "s3cr3t" not in caplog.text and "abc" not in msgspec.json.encode(out[0]).decode()


def test_redact_url():
    assert redact_url("https://u:pw@h.example:8443/x?a=1&b") == "https://u:***@h.example:8443/x?a=***&b"
    assert redact_url("http://h/x") == "http://h/x"


def test_webhook_is_not_disruptive_so_it_runs_in_dry_run_too(server, tmp_path, harness):
    s = server([200])
    cfg = config(tmp_path, guardrails={"dry_run": True},
                 actions={"page": {"type": "webhook", "url": s.url}, "drain": {"type": "slurm_drain"}},
                 receivers=[{"name": "r", "actions": ["page", "drain"]}], route={"receiver": "r"})
    h = harness(cfg)
    assert [r.decision for r in h.handle(alert())] == ["acted", "dry_run"]
    assert len(s.hits) == 1


def test_checkpoint_over_http_is_disruptive_and_retried(server, tmp_path, harness):
    s = server([503, 200])
    cfg = config(tmp_path, actions={"ckpt": {"type": "checkpoint", "mode": "http", "url": s.url + "/ckpt/{job}",
                                             "backoff": 0.01}},
                 receivers=[{"name": "r", "actions": ["ckpt"]}], route={"receiver": "r"})
    h = harness(cfg)
    out = h.handle(alert(job="train-7"))
    assert out[0].decision == "acted" and out[0].attempts == 2 and s.hits[-1]["path"] == "/ckpt/train-7"


def test_a_webhook_marked_dry_run_calls_nothing(server, tmp_path, harness):
    s = server([200])
    cfg = config(tmp_path, guardrails={"dry_run": True},
                 actions={"page": {"type": "webhook", "url": s.url + "/p/{host}", "dry_run": True}},
                 receivers=[{"name": "r", "actions": ["page"]}], route={"receiver": "r"})
    out = harness(cfg).handle(alert("n4"))
    assert [r.decision for r in out] == ["dry_run"] and out[0].url == s.url + "/p/n4"
    assert s.hits == []
