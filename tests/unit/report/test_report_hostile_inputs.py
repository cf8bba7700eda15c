"""Hostile and messy alert and incident files: each bad line costs only itself, is counted with
where it was, and the page is still written."""

from __future__ import annotations

import json

import pytest

from pipeline.report import incident_page, load_alerts
from pipeline.schema import encode
from tests.factories import T0
from tests.unit.report.factories import alert, write_jsonl


def _line(**kw):
    d = json.loads(encode(alert(65, id="bad", started=60)))
    d.update(kw)
    return json.dumps(d).encode()


def _page(tmp_path, tel, body: bytes, **kw):
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(encode(alert(65, id="good", started=60)) + b"\n" + body + b"\n")
    notes: list[str] = []
    unread: list[str] = []
    html = incident_page([tel], [path], rules=["rules"], notes_out=notes, unread_out=unread, **kw)
    return html, notes, unread


@pytest.mark.parametrize(
    "times",
    [
        {"ts": 1e308, "started_at": 1e308},
        {"ts": -1e20, "started_at": -1e20},
        {"ts": 7258118400.0, "started_at": 7258118400.0},  # year 2200
        {"ts": T0 + 65, "started_at": 1e300},
    ],
)
def test_alert_times_outside_the_recording_range_are_skipped_and_named(tmp_path, incident_files, times):
    tel, _ = incident_files
    html, notes, unread = _page(tmp_path, tel, _line(**times))
    assert unread == []
    assert "1 alert line(s) could not be read and were skipped." in notes
    [where] = [n for n in notes if n.startswith("Skipped alert lines:")]
    assert "hostile.jsonl:2" in where and "outside" in where
    assert "alert id</dt>" not in html or ">bad<" not in html


def test_a_deeply_nested_line_is_counted_not_a_crash(tmp_path, incident_files):
    tel, _ = incident_files
    deep = b'{"kind":"alert","id":"n","evidence":' + b'{"x":' * 5000 + b"1" + b"}" * 5000 + b"}"
    _, notes, unread = _page(tmp_path, tel, deep)
    assert unread == [] and any("hostile.jsonl:2: nested too deep" in n for n in notes)


def test_a_file_with_one_good_alert_among_many_bad_array_items_is_not_called_unread(tmp_path, incident_files):
    tel, _ = incident_files
    _, notes, unread = _page(tmp_path, tel, b"[1, 2, 3, 4]")
    assert unread == []
    assert any(n.startswith("4 alert line(s)") for n in notes)


def test_duplicate_ids_naming_different_alerts_are_counted(tmp_path, incident_files):
    tel, _ = incident_files
    other = encode(alert(70, id="good", started=60, host="n1", gpu=0))
    same = encode(alert(80, id="good", started=60))  # a repeat of the same alert is no conflict
    _, notes, _ = _page(tmp_path, tel, other + b"\n" + same)
    assert any(n.startswith("1 alert id(s) have firing events naming different alerts") for n in notes)


def test_bad_lines_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"{not json\n" + _line(ts="123") + b"\n" + encode(alert(1, id="ok")) + b"\n")
    log = load_alerts([path])
    assert [i.id for i in log.incidents] == ["ok"] and log.bad_lines == 2 and log.read == 1
    assert [p.split(": ", 1)[0] for p in log.problems] == [f"{path}:1", f"{path}:2"]
    assert "$.ts" in log.problems[1]


def test_incident_events_with_impossible_times_are_skipped(tmp_path, incident_files):
    from tests.unit.report.factories import incident_event_files

    tel, alerts, inc_path, _ = incident_event_files(tmp_path)
    lines = inc_path.read_bytes().splitlines()
    d = json.loads(lines[0])
    d.update(incident="inc-far", ts=1e308, opened_at=1e308)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines) + b"\n" + json.dumps(d).encode() + b"\n")
    notes: list[str] = []
    incident_page([tel], [alerts], rules=["rules"], incident_events=[bad], notes_out=notes)
    assert any(n.startswith("Skipped incident event lines:") and "bad.jsonl" in n and "outside" in n for n in notes)


def test_an_empty_alerts_file_gives_a_page(tmp_path, incident_files):
    tel, _ = incident_files
    empty = write_jsonl(tmp_path / "e.jsonl", [])
    unread: list[str] = []
    html = incident_page([tel], [empty], rules=["rules"], unread_out=unread)
    assert "<html" in html and unread == []
