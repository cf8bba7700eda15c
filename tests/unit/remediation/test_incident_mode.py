"""Incident mode against a real webhook server on 127.0.0.1: the incident events come from the
incident stage run on real alert events, and each drain, reset or inspection is an HTTP request
the server counts (docs/remediation.md#incident-mode)."""

from __future__ import annotations

import json

import msgspec
import pytest

from pipeline.bus.base import Message
from pipeline.errors import ConfigError
from pipeline.incidents import IncidentStage, default_config
from pipeline.remediation.alertmanager import am_labels
from pipeline.remediation.incidents import incident_alert
from pipeline.schema import encode
from tests.unit.incidents.factories import alert, resolved
from tests.unit.remediation.factories import config, incident_config


def _paths(srv) -> list[str]:
    return [h["path"] for h in srv.hits]


def _one_fault(stage: IncidentStage):
    """An XID 74 and four NVLink alerts on GPU 0 of n1: opened and four alert_joined updates."""
    alerts = [
        alert("nvlink_xid74", 0, "n1", 0, xid=74),
        alert("nvlink_crc_errors", 10),
        alert("nvlink_replays", 20),
        alert("nvlink_recoveries", 30),
        alert("nvlink_error_rate", 40),
    ]
    return alerts, stage.process(alerts)


def test_an_incident_of_five_alerts_drains_once_and_its_escalation_asks_for_inspection(server, harness, tmp_path):
    srv = server([200])
    h = harness(incident_config(tmp_path, srv.url))
    stage = IncidentStage(default_config())
    alerts, events = _one_fault(stage)
    assert [e.state for e in events] == ["opened", "updated", "updated", "updated", "updated"]
    assert all(e.changes == ["alert_joined"] for e in events[1:])
    inc = events[0].incident

    for e in events:
        h.handle_incident(e, origin="test")
    assert _paths(srv) == ["/drain/n1"]
    body = msgspec.json.decode(srv.hits[0]["body"])
    assert body["id"] == inc and body["labels"]["incident"] == inc and body["labels"]["action"] == "drain_node"
    acted = h.decisions("acted")
    assert len(acted) == 1 and acted[0].incident == inc and acted[0].action == "drain"
    assert acted[0].incident_state == "opened" and acted[0].incident_action == "drain_node"
    joins = [r for r in h.all if r.incident_state == "updated"]
    assert len(joins) == 4 and all(r.decision == "skipped" and r.reason.startswith("incident_update:") for r in joins)

    # The link goes through recovery twice more: nvlink_flaps escalates the incident.
    flaps = [alert("nvlink_recoveries", 50, id="rec-2"), alert("nvlink_recoveries", 60, id="rec-3")]
    esc = stage.process(flaps)
    assert [(e.changes, e.policy) for e in esc][-1] == (["action_escalated"], "nvlink_flaps")
    for e in esc:
        h.handle_incident(e)
    assert _paths(srv) == ["/drain/n1", "/inspect/n1"]
    recs = [r for r in h.all if r.policy == "nvlink_flaps"]
    assert {r.action: r.decision for r in recs} == {"drain": "skipped", "inspect": "acted"}
    assert all(r.incident == inc and "nvlink_recoveries alerts 3 times in 1h" in r.escalation for r in recs)
    drain = next(r for r in recs if r.action == "drain")
    assert drain.reason.startswith(f"covered: host n1 was taken out by drain for incident {inc}")

    # The same events delivered again (a restart before the commit) act on nothing.
    h.restart()
    for e in [*events, *esc]:
        h.handle_incident(e)
    assert len(srv.hits) == 2
    assert any(r.reason and r.reason.startswith(f"duplicate: incident {inc}") for r in h.all)

    # The alerts resolve; after `quiet` the incident does, and a resolve acts on nothing.
    done = stage.process([resolved(a, 100) for a in [*alerts, *flaps]] + [alert("pcie_replay_rate", 1000, "n9", 0)])
    assert [e.state for e in done if e.incident == inc] == ["resolved"]
    for e in done:
        h.handle_incident(e)
    assert len(srv.hits) == 2
    assert [r.reason for r in h.all if r.incident_state == "resolved"] == [
        "resolved: no undo configured (on_resolved is empty)"]


def test_a_drained_host_is_not_drained_again_and_its_gpu_resets_are_covered(server, harness, tmp_path):
    srv = server([200])
    h = harness(incident_config(tmp_path, srv.url))
    stage = IncidentStage(default_config())
    _, events = _one_fault(stage)
    more = stage.process([
        alert("nvlink_xid74", 100, "n1", 1, xid=74),   # another fault on the drained host
        alert("hbm_ecc_xid", 110, "n1", 2, xid=48),   # a GPU reset asked on the drained host
        alert("hbm_ecc_xid", 120, "n2", 2, xid=48),   # ... and on a host nobody drained
    ])
    opened = [e for e in more if e.state == "opened"]
    assert [(e.host, e.gpu, e.action) for e in opened] == [
        ("n1", 1, "drain_node"), ("n1", 2, "reset_gpu"), ("n2", 2, "reset_gpu")]
    for e in [*events, *more]:
        h.handle_incident(e)
    assert _paths(srv) == ["/drain/n1", "/reset/n2/2"]
    by_inc = {r.incident: r for r in h.all if r.action in ("drain", "reset") and r.incident_state == "opened"}
    second, reset_n1, reset_n2 = (by_inc[e.incident] for e in opened)
    assert second.decision == "skipped" and second.reason.startswith("covered: host n1 was taken out by drain")
    assert reset_n1.decision == "skipped" and "covers resetting its GPU 2" in reset_n1.reason
    assert reset_n2.decision == "acted"


def test_a_reset_in_a_chain_that_then_drains_is_covered_by_the_drain(server, harness, tmp_path):
    srv = server([200])
    cfg = incident_config(tmp_path, srv.url)
    cfg.receivers["reset"].actions = ["reset", "drain"]
    h = harness(cfg)
    ev = IncidentStage(default_config()).process([alert("hbm_ecc_xid", 0, "n2", 1, xid=48)])
    recs = h.handle_incident(ev[0])
    assert [(r.action, r.decision) for r in recs] == [("reset", "skipped"), ("drain", "acted")]
    assert recs[0].reason == "covered: drain takes host n2 out after it, which covers resetting its GPU 1"
    assert _paths(srv) == ["/drain/n2"]


def test_guardrails_still_apply_dry_run_and_the_breaker(server, harness, tmp_path):
    srv = server([200])
    h = harness(incident_config(tmp_path / "dry", srv.url, guardrails={"dry_run": True}))
    ev = IncidentStage(default_config()).process([alert("nvlink_xid74", 0, "n1", 0, xid=74)])
    assert [r.decision for r in h.handle_incident(ev[0])] == ["dry_run"] and srv.hits == []

    h2 = harness(incident_config(tmp_path / "brk", srv.url, guardrails={"breaker": {"max_nodes": 1}}))
    st = IncidentStage(default_config())
    evs = st.process([alert("nvlink_xid74", 0, "n1", 0, xid=74), alert("nvlink_xid74", 1, "n2", 0, xid=74)])
    got = [h2.handle_incident(e)[0].decision for e in evs]
    assert got == ["acted", "blocked"] and _paths(srv) == ["/drain/n1"]


def test_hostile_incident_messages_are_audited_not_raised(server, harness, tmp_path):
    srv = server([200])
    h = harness(incident_config(tmp_path, srv.url))
    ev = IncidentStage(default_config()).process([alert("nvlink_xid74", 0, "n1", 0, xid=74)])[0]
    forged = msgspec.structs.replace(ev, incident="inc-forged", host="n1;reboot")
    for value in (b'{"kind":"incident"', encode(forged), b'{"kind":"alert","id":"x"}'):
        h.rem.handle_incident_message(Message(topic="p.incidents", partition=0, offset=1, key=None, value=value))
    recs = h.audit.records
    assert [r.decision for r in recs] == ["skipped", "skipped", "skipped"]
    assert recs[0].reason.startswith("malformed_incident") and recs[2].reason.startswith("malformed_incident")
    assert recs[1].reason.startswith("unsafe_value") and recs[1].incident == "inc-forged"
    assert srv.hits == []


def test_an_incident_in_alertmanager_keeps_its_identity_as_it_escalates():
    stage = IncidentStage(default_config())
    _, events = _one_fault(stage)
    first = am_labels(incident_alert(events[0]))
    esc = stage.process([alert("nvlink_recoveries", 50, id="r2"), alert("nvlink_recoveries", 60, id="r3")])[-1]
    assert esc.action == "drain_and_inspect"
    assert am_labels(incident_alert(esc)) == first
    assert first["incident"] == events[0].incident and "action" not in first
    assert {k: first[k] for k in ("host", "gpu", "family", "alertname")} == {
        "host": "n1", "gpu": "0", "family": "nvlink", "alertname": "nvlink_xid74"}
    assert json.loads(json.dumps(first)) == first


def test_source_and_webhook_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="'source'"):
        config(tmp_path, source="telemetry")
    with pytest.raises(ConfigError, match="incidents.covered_for"):
        config(tmp_path, incidents={"covered_for": "forever"})
    with pytest.raises(ConfigError, match="actions.w.entity"):
        config(tmp_path, actions={"w": {"type": "webhook", "url": "http://127.0.0.1:9/x", "entity": "rack"}},
               receivers=[{"name": "w", "actions": ["w"]}], route={"receiver": "w"})


def test_an_undo_of_gpuwardens_drain_ends_the_cover(fakes, harness, tmp_path):
    cfg = config(tmp_path, source="incidents",
                 actions={"drain": {"type": "slurm_drain"}, "resume": {"type": "slurm_resume"}},
                 receivers=[{"name": "drain", "actions": ["drain"], "on_resolved": ["resume"]}],
                 guardrails={"cooldown": "0s"})     # the cooldown would hold a second drain within the hour
    h = harness(cfg)
    stage = IncidentStage(default_config())
    link = alert("nvlink_xid74", 0, "n1", 0, xid=74)
    opened = stage.process([link])
    assert [r.decision for r in h.handle_incident(opened[0])] == ["acted"]
    assert [c[1] for c in fakes.updates()] == ["nodename=n1"]
    # A fault on another GPU while the node is out of service: covered, scontrol not even asked.
    other = stage.process([alert("nvlink_xid74", 10, "n1", 1, xid=74)])
    assert [r.reason.split(" was ")[0] for r in h.handle_incident(other[0])] == ["covered: host n1"]
    assert len(fakes.calls("scontrol")) == 2                     # the first drain's query and update
    # The first incident resolves while the covered one is still open: the node stays out (it
    # was resumed with GPU 1's fault open).
    done = stage.process([resolved(link, 20), alert("pcie_replay_rate", 1000, "n9", 0)])
    gone = [e for e in done if e.state == "resolved" and e.incident == opened[0].incident]
    (kept,) = h.handle_incident(gone[0])
    assert kept.decision == "skipped" and kept.reason.startswith(f"undo: n1 stays out while alert(s) {other[0].incident}")
    assert [c[1:] for c in fakes.updates()] == [["nodename=n1", "state=drain", fakes.updates()[0][3]]]
    # The covered incident resolves: the last that held the node, its on_resolved resumes it.
    done = stage.process([resolved(alert("nvlink_xid74", 10, "n1", 1, xid=74), 1050),
                          alert("pcie_replay_rate", 2050, "n9", 1)])
    gone = [e for e in done if e.state == "resolved" and e.incident == other[0].incident]
    assert [r.decision for r in h.handle_incident(gone[0])] == ["acted"]
    assert fakes.updates()[-1][1:] == ["nodename=n1", "state=resume"]
    (fakes.dir / "drained").unlink()                              # Slurm: the node is back in service
    # The next fault on n1 drains it again: the cover ended with the resume.
    again = stage.process([alert("nvlink_xid74", 2100, "n1", 3, xid=74)])
    assert [r.decision for r in h.handle_incident(again[0])] == ["acted"]
    assert [c[1] for c in fakes.updates()].count("nodename=n1") == 3


def test_act_cli_decides_one_incident_event(server, tmp_path, capsys):
    from pipeline.cli import main

    srv = server([200])
    cfg = tmp_path / "r.yaml"
    cfg.write_text(json.dumps({
        "state_file": "s.sqlite", "audit": {"kafka": False, "file": "audit.jsonl"}, "source": "incidents",
        "guardrails": {"dry_run": False}, "inventory": {"source": "list", "hosts": ["n1"]},
        "actions": {"drain": {"type": "webhook", "url": srv.url + "/drain/{host}", "disruptive": True}},
        "receivers": [{"name": "d", "actions": ["drain"]}], "route": {"receiver": "d"}}))
    ev = IncidentStage(default_config()).process([alert("nvlink_xid74", 0, "n1", 0, xid=74)])[0]
    f = tmp_path / "incident.json"
    f.write_bytes(encode(ev))
    assert main(["remediate", "act", "--config", str(cfg), "--incident", str(f)]) == 0
    [rec] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (rec["decision"], rec["incident"], rec["origin"]) == ("acted", ev.incident, f"cli:{f}")
    assert _paths(srv) == ["/drain/n1"]
    # Again, forced: past the once-only claim, but the host it took out is covered.
    assert main(["remediate", "act", "--config", str(cfg), "--incident", str(f), "--force"]) == 0
    [rec] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rec["decision"] == "skipped" and rec["reason"].startswith("covered: host n1") and len(srv.hits) == 1
    f.write_text('{"kind": "alert"}')
    assert main(["remediate", "act", "--config", str(cfg), "--incident", str(f)]) == 3
    assert "not an incident event" in capsys.readouterr().err


def test_a_cover_ends_after_covered_for(server, harness, tmp_path):
    from tests.unit.remediation.factories import Clock

    srv = server([200])
    clock = Clock()
    h = harness(incident_config(tmp_path, srv.url, incidents={"covered_for": "2h"},
                                guardrails={"cooldown": "0s"}), clock=clock)
    st = IncidentStage(default_config())
    first = st.process([alert("nvlink_xid74", 0, "n1", 0, xid=74)])[0]
    later = st.process([alert("nvlink_xid74", 10, "n1", 1, xid=74)])[0]
    last = st.process([alert("nvlink_xid74", 20, "n1", 2, xid=74)])[0]
    assert h.handle_incident(first)[0].decision == "acted"
    clock.t += 7199
    assert h.handle_incident(later)[0].reason.startswith("covered: host n1")
    clock.t += 2
    h.rem.tick()                                   # the hourly prune forgets the ended cover
    assert h.store.kv_all("cover:host") == []
    assert h.handle_incident(last)[0].decision == "acted" and _paths(srv) == ["/drain/n1", "/drain/n1"]
