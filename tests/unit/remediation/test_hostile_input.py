"""Hostile alert values: a trailing newline is not a valid value, an action that raises is an
audited failure and the chain goes on, and control characters never forge log lines."""

from __future__ import annotations

import logging

import httpx
import pytest

from pipeline.remediation.safety import UnsafeValue, check_value
from tests.unit.remediation.factories import ScriptedServer as Server
from tests.unit.remediation.factories import alert, config


@pytest.mark.parametrize("name, value", [("host", "gpu-node-007\n"), ("job", "42\n"), ("signal", "USR1\n"),
                                         ("labels.team", "ml\n"), ("fault", "xid_79\n"), ("host", "n1\r\n")])
def test_a_trailing_newline_is_not_a_valid_value(name, value):
    with pytest.raises(UnsafeValue):
        check_value(name, value)


@pytest.fixture
def srv():
    s = Server([200])
    yield s
    s.close()


def test_a_newline_host_refuses_the_webhook_and_the_drain_and_audits_both(tmp_path, fakes, harness, srv):
    # Before: `nodename=gpu-node-007\n` passed validation, httpx raised InvalidURL out of the chain
    # and the drain after the webhook got no audit record at all.
    cfg = config(tmp_path, actions={"page": {"type": "webhook", "url": srv.url + "/hooks/{host}", "retries": 0},
                                    "drain": {"type": "slurm_drain"}},
                 receivers=[{"name": "drain", "actions": ["page", "drain"], "stop_on_failure": False}])
    out = harness(cfg).handle(alert("gpu-node-007\n"))
    assert [(r.action, r.decision) for r in out] == [("page", "skipped"), ("drain", "skipped")]
    assert all(r.reason.startswith("unsafe_value:") for r in out)
    assert srv.hits == [] and fakes.calls() == []


class Boom:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def post(self, *a, **kw):
        raise self.exc

    def stream(self, *a, **kw):
        raise self.exc

    def close(self) -> None:
        pass


@pytest.mark.parametrize("stop", [False, True])
def test_an_http_client_error_is_a_failed_record_and_the_next_action_gets_its_own(tmp_path, fakes, harness, srv,
                                                                                   stop):
    cfg = config(tmp_path, actions={"page": {"type": "webhook", "url": srv.url + "/hooks/{host}", "retries": 2},
                                    "drain": {"type": "slurm_drain"}},
                 receivers=[{"name": "drain", "actions": ["page", "drain"], "stop_on_failure": stop}])
    h = harness(cfg)
    h.rem.actions["page"]._client = Boom(httpx.InvalidURL("Invalid non-printable ASCII character in URL"))
    out = h.handle(alert("gpu-node-7"))
    assert [(r.action, r.decision) for r in out] == [("page", "failed"), ("drain", "skipped" if stop else "acted")]
    assert "InvalidURL" in out[0].error and out[0].attempts == 1, "not retried: it cannot work next time"


@pytest.mark.parametrize("where", ["plan", "query", "execute"])
def test_whatever_an_action_raises_is_audited_and_the_chain_goes_on(tmp_path, fakes, harness, where):
    cfg = config(tmp_path, actions={"drain": {"type": "slurm_drain"}, "log": {"type": "log"}},
                 receivers=[{"name": "drain", "actions": ["drain", "log"], "stop_on_failure": False}])
    h = harness(cfg)

    def broken(*a, **kw):
        raise RuntimeError(f"bug in {where}")

    setattr(h.rem.actions["drain"], where, broken)
    out = h.handle(alert("n1"))
    assert [(r.action, r.decision) for r in out] == [("drain", "failed"), ("log", "acted")]
    assert f"RuntimeError: bug in {where}" in out[0].error


def test_control_characters_never_forge_log_lines(tmp_path, fakes, harness, caplog):
    forged = "n1\n2026-01-01 INFO acted drain alert=x host=n2 ['scontrol']\x1b[2K"
    cfg = config(tmp_path, actions={"drain": {"type": "slurm_drain"}, "log": {"type": "log", "message": "{host}: {summary}"}},
                 receivers=[{"name": "drain", "actions": ["log", "drain"], "stop_on_failure": False}])
    with caplog.at_level(logging.INFO, logger="gpuwarden"):
        out = harness(cfg).handle(alert(forged, id="id\nforged"))
    assert [r.decision for r in out] == ["acted", "skipped"]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) >= 3
    assert all("\n" not in m and "\x1b" not in m for m in msgs), msgs
    assert any("n1\\n2026-01-01 INFO acted" in m for m in msgs)
