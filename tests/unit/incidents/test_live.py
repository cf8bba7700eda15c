"""The live page of open incidents (pipeline/incidents/live.py): what it shows, in which order,
with everything from telemetry escaped; and its JSON twin."""

from __future__ import annotations

import json
import random
from html.parser import HTMLParser

from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents.events import IncidentEvent, IncidentRoot
from pipeline.incidents.live import live_json, live_pages, reading_order, render_live
from tests.unit.incidents.factories import T0, run, two_open_incidents

HOSTILE = "<script>alert(1)</script>"
NOW = T0 + 17 * 3600


class Tags(HTMLParser):
    """Every start tag of a page, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)

    def handle_data(self, data) -> None:
        self.text.append(data)


def parse(page: bytes) -> Tags:
    p = Tags()
    p.feed(page.decode("utf-8"))
    return p


def event(incident: str, severity: str, opened: float, **kw) -> IncidentEvent:
    return IncidentEvent(incident=incident, state="opened", ts=opened, opened_at=opened, host=kw.pop("host", "n1"),
                         root=kw.pop("root", IncidentRoot(alert="a-" + incident, rule="r", fault="f")), severity=severity,
                         action="watch", members=kw.pop("members", ["a-" + incident]), **kw)


def open_now(host: str = "n1") -> list[IncidentEvent]:
    st = IncidentStage(default_config())
    run(two_open_incidents(host=host), stage=st)
    return st.open_incidents()


def test_the_page_shows_each_incident_its_alerts_and_why_it_escalated() -> None:
    incidents = open_now()
    page = render_live(incidents, now=NOW)
    text = " ".join(" ".join(parse(page).text).split())
    esc, quiet = incidents
    for e in incidents:
        assert e.incident in text and e.root.rule in text and e.root.fault in text and e.action in text
        for m in e.members:
            assert m in text
    assert "1 alert" in text and "2 alerts" in text
    assert "job train-7" in text and "pod llm-0" in text and "MIG 2 (1g.18gb)" in text
    assert esc.reason and esc.reason in text and page.count(b'<span class="esc">escalated</span>') == 1
    assert "1h 00m" in text and "59m 00s" in text                   # ages at NOW
    assert "2 open incidents: 1 critical, 1 warning" in text
    assert b'<meta http-equiv="refresh" content="15">' in page


def test_everything_from_telemetry_is_escaped() -> None:
    nasty = event("inc-x", "critical", T0, host=HOSTILE, job='"><img src=x onerror=alert(2)>', pod="<b>p</b>",
                  namespace="<i>", mig_instance="<u>1</u>", members=["<svg/onload=alert(3)>"],
                  reason="<iframe>", policy="<p>", changes=["<em>"],
                  root=IncidentRoot(alert="<a>", rule="<style>body{display:none}</style>", fault="<table>"))
    page = render_live([nasty, *open_now(HOSTILE)], now=NOW)
    tags = set(parse(page).tags)
    assert tags <= {"html", "head", "meta", "title", "style", "body", "main", "h1", "p", "a", "b", "table",
                    "thead", "tbody", "tr", "th", "td", "span", "br", "code", "details", "summary", "footer"}
    assert b"<script" not in page and b"<img" not in page and b"<svg" not in page and b"<iframe" not in page
    assert page.count(b"<style>") == 1                        # the page's own, none from a rule name
    assert page.count(b"&lt;script&gt;alert(1)&lt;/script&gt;") == 2
    assert b"&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in page


def test_the_empty_state_and_the_incident_stage_off_say_so() -> None:
    empty, off = render_live([], now=NOW), render_live(None, now=NOW)
    assert b"No incident is open." in empty and b"<table" not in empty and b"Incidents are off" not in empty
    assert b"Incidents are off" in off and b"<table" not in off and b"No incident is open" not in off
    assert json.loads(live_json([], now=NOW)) == {"enabled": True, "now": NOW, "open": 0, "incidents": []}
    assert json.loads(live_json(None, now=NOW))["enabled"] is False


def test_most_severe_first_then_longest_open_whatever_the_input_order() -> None:
    want = [event("inc-c1", "critical", T0 + 5), event("inc-c2", "critical", T0 + 9), event("inc-w1", "warning", T0),
            event("inc-w2", "warning", T0 + 1), event("inc-i1", "info", T0 - 50), event("inc-z", "loud", T0 - 99)]
    for seed in range(5):
        shuffled = random.Random(seed).sample(want, len(want))
        page = render_live(shuffled, now=NOW).decode()
        positions = [page.index(f'id="{e.incident}"') for e in want]
        assert positions == sorted(positions)
        assert [e.incident for e in reading_order(shuffled)] == [e.incident for e in want]
        assert [e["incident"] for e in json.loads(live_json(shuffled, now=NOW))["incidents"]] == \
            [e.incident for e in want]


def test_long_lists_are_capped_and_say_how_many_more() -> None:
    many = [event(f"inc-{i:03d}", "warning", T0 + i) for i in range(30)]
    page = render_live(many, now=NOW, max_shown=10).decode()
    assert page.count('<tr class="warning"') == 10 and "20 more open incident(s)" in page
    assert 'id="inc-009"' in page and 'id="inc-010"' not in page
    big = event("inc-big", "critical", T0, members=[f"m{i}" for i in range(256)], more_members=44)
    page = render_live([big], now=NOW, max_members=50).decode()
    assert "300 alerts" in page and "and 250 more" in page and "m49" in page and "m50<" not in page
    data = json.loads(live_json(many, now=NOW, max_shown=10))
    assert data["open"] == 30 and len(data["incidents"]) == 10


def test_the_json_holds_the_incident_events() -> None:
    incidents = open_now()
    data = json.loads(live_json(incidents, now=NOW))
    assert data["enabled"] and data["open"] == 2
    got = data["incidents"][0]
    assert got["incident"] == incidents[0].incident and got["members"] == incidents[0].members
    assert got["policy"] == "xid79_repeat" and got["kind"] == "incident"


def test_the_pages_ask_the_source_at_each_request() -> None:
    held: list[IncidentEvent] | None = None
    pages = live_pages(lambda: held, clock=lambda: NOW)
    ctype, body = pages["/incidents"]()
    assert ctype.startswith("text/html") and b"Incidents are off" in body
    held = [event("inc-late", "critical", T0)]
    ctype, body = pages["/incidents.json"]()
    assert ctype == "application/json" and json.loads(body)["open"] == 1
    assert b"inc-late" in pages["/incidents"]()[1]
