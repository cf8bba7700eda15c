"""Incidents in the HTML report (docs/report.md, "Incidents"): incident events folded into one
span per incident, drawn as a timeline coloured by severity with escalations marked, and listed
with their member alerts."""

from __future__ import annotations

import gzip
import re

from pipeline.cli import main
from pipeline.report import incident_page
from pipeline.report.incidents import load_incidents
from pipeline.report.plots import ESCALATION, SEVERITY_COLOURS
from tests.unit.report.factories import colour_pixels, images, incident_event_files, write_jsonl

HOSTILE = "<script>alert(1)</script>"


def test_each_incident_is_one_span_from_opened_to_resolved(tmp_path):
    _, _, inc_path, events = incident_event_files(tmp_path)
    log = load_incidents([inc_path])
    assert log.bad_lines == 0 and log.orphans == 0
    ids = list(dict.fromkeys(e.incident for e in events))
    assert [s.id for s in log.incidents] == ids                  # by opening
    resolved = {e.incident: e.ts for e in events if e.state == "resolved"}
    for s in log.incidents:
        assert s.resolved_at == resolved.get(s.id)
        last = [e for e in events if e.incident == s.id][-1]
        assert s.members == last.members and s.action == last.action and s.severity == last.severity
    assert sum(s.resolved_at is None for s in log.incidents) == 2
    escalated = [s for s in log.incidents if s.escalations]
    # The fifth XID 79 incident escalates twice (lemon_host, then xid79_repeat), with their reasons.
    assert len(escalated) == 1 and [e.policy for e in escalated[0].escalations] == ["lemon_host", "xid79_repeat"]
    assert all(e.reason and e.action == "drain_and_inspect" for e in escalated[0].escalations)


def test_gzip_arrays_are_read_and_bad_lines_and_orphan_events_counted(tmp_path):
    _, _, inc_path, events = incident_event_files(tmp_path)
    lines = inc_path.read_bytes().splitlines()
    # gzip, an array on one line, junk, an alert line, and the events of an incident never opened
    mixed = tmp_path / "mixed.jsonl.gz"
    orphan = [e for e in events if e.state != "opened"][:1]
    body = b"[" + b",".join(lines[:3]) + b"]\n" + b"\n".join(lines[3:]) + b"\nnot json\n{\"id\": \"a\"}\n"
    mixed.write_bytes(gzip.compress(body))
    solo = write_jsonl(tmp_path / "orphan.jsonl", orphan)
    solo.write_bytes(solo.read_bytes().replace(orphan[0].incident.encode(), b"inc-never-opened"))
    log = load_incidents([mixed, solo])
    assert log.bad_lines == 2 and log.orphans == 1
    assert [s.id for s in log.incidents] == [s.id for s in load_incidents([inc_path]).incidents]


def test_the_page_draws_and_lists_the_incidents_with_their_alerts(tmp_path):
    tel, alerts, inc_path, events = incident_event_files(tmp_path, host=HOSTILE)
    page = incident_page([tel], [alerts], incident_events=[inc_path])
    assert HOSTILE not in page and "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    figures = images(page)
    assert len(figures) == 2                                     # the alert timeline, the incident timeline
    assert 'alt="Timeline of incidents"' in page and '<h2 id="incidents">' in page
    for s in load_incidents([inc_path]).incidents:
        assert f'id="incident-{s.id}"' in page
    assert "<b>6</b><span>incidents</span>" in page
    # Member alerts by their rule; the escalation with its time, action and reason.
    assert "pcie_replay_rate" in page and "hbm_sbe_burst" in page
    assert "→ drain_and_inspect: policy xid79_repeat: XID 79 5 times in 24h" in page
    fig = figures[1]
    assert colour_pixels(fig, SEVERITY_COLOURS["critical"]) > 500 and colour_pixels(fig, SEVERITY_COLOURS["warning"]) > 100
    assert colour_pixels(fig, ESCALATION) > 20


def test_no_escalation_no_marker_and_an_empty_file_says_so(tmp_path):
    tel, alerts, inc_path, events = incident_event_files(tmp_path)
    quiet = write_jsonl(tmp_path / "quiet.jsonl",
                        [e for e in events if not e.reason and "action_escalated" not in e.changes])
    page = incident_page([tel], [alerts], incident_events=[quiet])
    assert colour_pixels(images(page)[1], ESCALATION) == 0
    empty = write_jsonl(tmp_path / "none.jsonl", [])
    page = incident_page([tel], [alerts], incident_events=[empty])
    assert "No incident in" in page and len(images(page)) == 1
    assert '<h2 id="incidents">' not in incident_page([tel], [alerts])     # no file given: no section


def test_the_timeline_draws_the_most_severe_and_lists_every_one(tmp_path):
    tel, alerts, inc_path, _ = incident_event_files(tmp_path)
    page = incident_page([tel], [alerts], incident_events=[inc_path], max_incidents=2)
    assert "4 less severe incident(s) are not drawn" in page
    assert page.count('<td class="mono id">') == 6


def test_cli_takes_incident_files(tmp_path, capsys):
    tel, alerts, inc_path, events = incident_event_files(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", "--telemetry", str(tel), "--alerts", str(alerts), "--incidents", str(inc_path),
                 "--out", str(out)]) == 0
    assert events[-1].incident in out.read_text()
    capsys.readouterr()
    assert main(["report", "--telemetry", str(tel), "--alerts", str(alerts), "--incidents", str(tmp_path / "nope"),
                 "--out", str(out)]) == 3
    assert "--incidents " in capsys.readouterr().err
    assert main(["report", "--telemetry", str(tel), "--alerts", str(alerts), "--max-incidents", "-1",
                 "--out", str(out)]) == 2
    assert "--max-incidents must not be negative" in capsys.readouterr().err


def test_an_incident_named_like_a_section_does_not_take_its_anchor(tmp_path):
    # An incident's row is its own anchor (incident-<id>): an incident id "alert-1" or
    # "timeline" used to be a second element with the id the alert links and the contents
    # jump to, so "#1" went to the incident's row instead of the alert's section.
    tel, alerts, inc_path, events = incident_event_files(tmp_path)
    first, second = list(dict.fromkeys(e.incident for e in events))[:2]
    inc_path.write_bytes(inc_path.read_bytes().replace(first.encode(), b"alert-1").replace(second.encode(), b"timeline"))
    page = incident_page([tel], [alerts], incident_events=[inc_path])
    ids = re.findall(r'\sid="([^"]*)"', page)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert 'id="incident-alert-1"' in page and 'id="incident-timeline"' in page
    assert re.search(r'<section class="alert" id="alert-1">', page)
