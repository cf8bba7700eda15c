"""A hostile review of remediation: alert values an attacker on the alerts topic (or a buggy
detector) could write, each refused with an audit record saying why, nothing run, nothing
counted by the breaker, and nothing raised out of the loop."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.bus.base import Message
from pipeline.remediation.actions import Context
from pipeline.remediation.alertmanager import AlertmanagerAction
from pipeline.remediation.payloads import iso8601
from pipeline.remediation.safety import UnsafeValue, check_value
from pipeline.remediation.targets import refused
from pipeline.schema import encode
from tests.unit.remediation.factories import ScriptedServer, alert, config

NODE_ACTIONS = {"drain": {"type": "slurm_drain"}, "cordon": {"type": "k8s_cordon"}}
BOTH = [{"name": "drain", "actions": ["drain", "cordon"], "stop_on_failure": False}]


@pytest.mark.parametrize("host", ["ALL", "all", "All"])
def test_a_host_named_all_is_refused_and_never_reaches_scontrol(tmp_path, fakes, harness, host):
    # Before: `scontrol update nodename=ALL state=drain` ran; Slurm's nodespec_to_hostlist reads
    # ALL (any case) as every node, and the breaker counted it as one node.
    h = harness(config(tmp_path, actions=NODE_ACTIONS, receivers=BOTH))
    out = h.handle(alert(host))
    assert [(r.action, r.decision) for r in out] == [("drain", "skipped"), ("cordon", "skipped")]
    assert all(r.reason.startswith("unsafe_value:") and "every node" in r.reason for r in out)
    assert fakes.calls() == []
    assert h.store.breaker(3600, h.clock()).hosts_in_window == []
    with pytest.raises(UnsafeValue):
        check_value("host", host)


@pytest.mark.parametrize("host", ["-n", "--all", "node1 node2", "a,b", "node[1-100]", "node[1-3],x", "*", "n1\x00",
                                  "n1\n", "gpu\u2010node", "\uff4e1", "a" * 254, "n1.", "n1/../n2", "n1:22"])
def test_option_list_and_lookalike_hosts_are_refused_with_nothing_run_or_counted(tmp_path, fakes, harness, host):
    h = harness(config(tmp_path, actions=NODE_ACTIONS, receivers=BOTH))
    out = h.handle(alert(host))
    assert [r.decision for r in out] == ["skipped", "skipped"]
    assert all(r.reason.startswith("unsafe_value:") for r in out)
    assert fakes.calls() == []
    assert h.store.breaker(3600, h.clock()).hosts_in_window == []


@pytest.mark.parametrize("job", ["123;456", "123 456", "--signal", "123,456", "123_[1-5]", "$(id)", "42\n"])
def test_hostile_job_ids_are_refused_by_the_checkpoint(tmp_path, fakes, harness, job):
    h = harness(config(tmp_path, actions={"ckpt": {"type": "checkpoint"}},
                       receivers=[{"name": "drain", "actions": ["ckpt"]}]))
    out = h.handle(alert("n1", job=job))
    assert out[0].decision == "skipped" and out[0].reason.startswith("unsafe_value:")
    assert fakes.calls() == []


@pytest.mark.parametrize("gpu", [-1, 1024, 10**20])
def test_gpu_indices_out_of_range_are_refused(tmp_path, fakes, harness, gpu):
    h = harness(config(tmp_path, actions={"reset": {"type": "gpu_reset"}},
                       receivers=[{"name": "drain", "actions": ["reset"]}]))
    out = h.handle(alert("n1", gpu))
    assert out[0].decision == "skipped" and out[0].reason.startswith("unsafe_value:")
    assert fakes.calls() == []


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("where", ["evidence", "unknown_field"])
def test_deeply_nested_alert_json_is_a_malformed_record_not_an_exception(tmp_path, fakes, harness, where):
    # Before: msgspec raised RecursionError out of handle_message; the service stopped on that
    # message, and on it again after every restart (its offset is never committed).
    h = harness(config(tmp_path))
    doc = json.loads(encode(alert("n1")))
    doc.pop("evidence", None)
    head = json.dumps(doc)[:-1].encode()
    key = b"evidence" if where == "evidence" else b"zzz"
    value = head + b', "' + key + b'": {"x": ' + _deep(5000) + b"}}"
    n = len(h.audit.records)
    h.rem.handle_message(Message(topic="p.alerts", partition=0, offset=7, key=None, value=value))
    new = h.audit.records[n:]
    assert [r.decision for r in new] == ["skipped"] and new[0].reason.startswith("malformed_alert:")
    assert fakes.calls() == []


def test_deeply_nested_incident_json_is_a_malformed_record_not_an_exception(tmp_path, harness):
    h = harness(config(tmp_path, source="incidents"))
    value = b'{"zzz": ' + _deep(5000) + b', "incident": "i1"}'
    n = len(h.audit.records)
    h.rem.handle_incident_message(Message(topic="p.incidents", partition=0, offset=1, key=None, value=value))
    new = h.audit.records[n:]
    assert [r.decision for r in new] == ["skipped"] and new[0].reason.startswith("malformed_incident:")


RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _times(server: ScriptedServer) -> list[str]:
    return [a[k] for hit in server.hits for a in json.loads(hit["body"]) for k in ("startsAt", "endsAt")]


@pytest.mark.parametrize("started_at", [1e12, -6e10])
def test_an_alert_time_outside_four_digit_years_never_reaches_alertmanager(tmp_path, harness, started_at):
    # Before: started_at 1e12 was posted as startsAt "33658-09-27T...", which Alertmanager cannot
    # parse: the post failed and, kept as firing, failed every re-post of every firing alert.
    srv = ScriptedServer([200])
    try:
        h = harness(config(tmp_path, actions={"am": {"type": "alertmanager", "url": srv.url}},
                           receivers=[{"name": "drain", "actions": ["am"]}]))
        bad = alert("n1", id="bad")
        bad.started_at = started_at
        out = h.handle(bad)
        assert out[0].decision == "skipped" and out[0].reason.startswith("unsafe_value:")
        h.handle(alert("n2", id="good"))
        h.rem.tick(h.clock() + 3600)
        assert len(srv.hits) == 2
        assert all(RFC3339.fullmatch(t) for t in _times(srv)), _times(srv)
    finally:
        srv.close()


def test_a_stored_firing_alert_with_a_bad_time_is_not_re_posted_after_a_restart(tmp_path, harness):
    srv = ScriptedServer([200])
    try:
        cfg = config(tmp_path, actions={"am": {"type": "alertmanager", "url": srv.url}},
                     receivers=[{"name": "drain", "actions": ["am"]}])
        h = harness(cfg)
        bad = alert("n1", id="bad")
        bad.started_at = 1e12
        h.store.kv_put("am:am", "bad", encode({"alert": bad, "labels": {"alertname": "x"}}))
        h.handle(alert("n2", id="good"))
        h.restart()
        h.rem.tick(h.clock() + 3600)
        assert srv.hits and all(RFC3339.fullmatch(t) for t in _times(srv)), _times(srv)
    finally:
        srv.close()


def test_iso8601_refuses_what_it_cannot_write_in_four_digits():
    assert iso8601(0.0) == "1970-01-01T00:00:00.000Z"
    for ts in (-1.0, 253402300800.0, 1e12):
        with pytest.raises(UnsafeValue):
            iso8601(ts)
    with pytest.raises(UnsafeValue):
        AlertmanagerAction("am", "http://am:9093").plan(alert("n1", ts=1e12))


@pytest.mark.parametrize("answer, why", [
    (["127.0.0.1"], "loopback"),
    (["10.0.0.5", "169.254.169.254"], "link-local"),      # one bad answer among good ones
    (["::ffff:127.0.0.1"], "loopback"),
    (["fd00:ec2::254"], "metadata"),                        # the metadata service over IPv6
])
def test_templated_hosts_resolving_to_this_machine_or_metadata_are_not_sent(tmp_path, harness, answer, why):
    seen: list[str] = []

    def resolve(host: str, p: int) -> list[str]:
        seen.append(host)
        return answer

    cfg = config(tmp_path, actions={"page": {"type": "webhook", "url": "http://{host}:8471/hook", "retries": 0,
                                             "allow_hosts": ["gpu-*", "10.0.0.0/8", "fd00::/8"]}},
                 receivers=[{"name": "drain", "actions": ["page"]}])
    out = harness(cfg, ctx=Context(resolve=resolve)).handle(alert("gpu-node-1"))
    # Refused before any connection: "not sent" (a connection attempt would be a transport error).
    assert out[0].decision == "failed" and why in out[0].error and out[0].error.startswith("not sent:")
    assert out[0].attempts == 0 and seen == ["gpu-node-1"]


def test_refused_names_the_metadata_address():
    import ipaddress

    assert "metadata" in (refused(ipaddress.ip_address("fd00:ec2::254")) or "")
    assert refused(ipaddress.ip_address("fd00:ec2::253")) is None
