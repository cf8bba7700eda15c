"""Hostile strings and counts against the report's figures and tables and the live incidents
page: a figure's size, a page's size and the work of drawing stay bounded by what is shown, not by
how long a string or how many events an attacker wrote; the live page and its JSON stay markup-free
and valid whatever the numbers."""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser

import matplotlib.axes
import pytest
from PIL import Image

from pipeline.incidents.events import IncidentEvent, IncidentRoot
from pipeline.incidents.live import live_json, render_live
from pipeline.report import incident_page
from pipeline.report.plots import severity_legend
from tests.factories import T0
from tests.unit.report.factories import alert, write_jsonl

MAX_SIDE = 4000  # pixels: a figure of the report is ~1,000 wide; a label's worth more is a bug


def sizes(page: str) -> list[tuple[int, int]]:
    """The size of each embedded figure, read from its header (a 100,000-pixel PNG is not decoded)."""
    import base64
    import re

    return [
        Image.open(io.BytesIO(base64.b64decode(b))).size
        for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    ]


@pytest.mark.parametrize(
    "field",
    [
        {"host": "n" * 20_000},  # a y tick label: 8 px a character
        {"host": "n\n" * 3_000},  # a label of 3,000 lines
        {"severity": "s" * 20_000},  # a legend entry
        {"fault": "thermal_" + "x\n" * 3_000},  # the bar's label
    ],
    ids=["long-host", "tall-host", "long-severity", "tall-fault"],
)
def test_a_huge_string_is_cut_in_the_figures_not_drawn_whole(tmp_path, field):
    """Before, a figure grew with the string: a 1.2-million-character host or severity made an
    image wider than Agg draws and the whole report failed (300,000: 71 s and 2 GB)."""
    tel = write_jsonl(tmp_path / "t.jsonl", [])
    alerts = write_jsonl(tmp_path / "a.jsonl", [alert(65, started=60, **field)])
    page = incident_page([tel], [alerts])
    [timeline] = sizes(page)
    assert max(timeline) <= MAX_SIDE, timeline
    value = next(iter(field.values()))
    assert value in page  # the page's text is whole


def test_invented_severities_share_one_legend_entry(tmp_path):
    """300 invented severities were 300 legend entries side by side: a figure ~40,000 px wide
    (20,000 of them: too wide to draw)."""
    tel = write_jsonl(tmp_path / "t.jsonl", [])
    alerts = write_jsonl(
        tmp_path / "a.jsonl", [alert(65, id=f"a{i}", started=60, severity=f"sev-{i:04d}-" + "x" * 12) for i in range(300)]
    )
    [timeline] = sizes(incident_page([tel], [alerts], max_alerts=0))
    assert max(timeline) <= MAX_SIDE, timeline
    assert severity_legend(["warning", "b", "a", "c", "d", "e"]) == [
        ("#e08e0b", "warning"),
        ("#7f8c8d", "b, a, c, d …"),
    ]


def _incident(n: int, members: list[str], **kw) -> IncidentEvent:
    return IncidentEvent(
        incident=f"inc-{n}",
        state=kw.pop("state", "opened"),
        ts=kw.pop("ts", T0 + 61),
        opened_at=T0 + 61,
        host="n1",
        gpu=0,
        root=IncidentRoot(alert="a", rule="r", fault="f"),
        members=members,
        severity=kw.pop("severity", "warning"),
        action="watch",
        **kw,
    )


def test_a_long_rule_listed_by_many_incidents_is_written_cut(tmp_path):
    """A member alert's rule and host were written whole in each incident row that lists it:
    a 100 KB rule named 20 times by 1,000 incidents made a 2 GB page of a 0.5 MB input."""
    tel = write_jsonl(tmp_path / "t.jsonl", [])
    rule, host = "r" * 20_000, "h" * 20_000
    alerts = write_jsonl(tmp_path / "a.jsonl", [alert(65, id="a", started=60, rule=rule, host=host)])
    inc = write_jsonl(tmp_path / "i.jsonl", [_incident(k, ["a"] * 20) for k in range(100)])
    page = incident_page([tel], [alerts], incident_events=[inc], max_incidents=1)
    given = alerts.stat().st_size + inc.stat().st_size
    assert len(page) < 4 * given + 2_000_000, (len(page), given)
    assert "r" * 255 + "…" in page and "h" * 255 + "…" in page  # cut, and says so
    assert page.count(rule) >= 1  # the alert's own row still shows it whole


def test_an_incident_of_many_events_is_drawn_with_a_bounded_number_of_artists(tmp_path, monkeypatch):
    """Each severity change was a bar and each escalation a line of its own (~2 ms each): an
    incident of 100,000 updates took minutes to plot. The artists now follow the rows shown."""
    added: list[str] = []
    for name in ("add_patch", "add_line", "add_collection"):
        orig = getattr(matplotlib.axes.Axes, name)

        def spy(self, artist, *a, _orig=orig, _name=name, **kw):
            added.append(_name)
            return _orig(self, artist, *a, **kw)

        monkeypatch.setattr(matplotlib.axes.Axes, name, spy)
    tel = write_jsonl(tmp_path / "t.jsonl", [])
    alerts = write_jsonl(tmp_path / "a.jsonl", [alert(65, id="a", started=60)])
    events = [_incident(0, ["a"])] + [
        _incident(0, ["a"], state="updated", ts=T0 + 61 + k * 0.05, severity=("critical", "warning")[k % 2],
                  changes=["action_escalated"])
        for k in range(1_500)
    ]
    inc = write_jsonl(tmp_path / "i.jsonl", events)
    page = incident_page([tel], [alerts], incident_events=[inc], max_alerts=0)
    assert len(sizes(page)) == 2  # the alert timeline and the incident timeline
    assert len(added) < 60, len(added)


HOSTILE = (
    "<img src=x onerror=alert(1)>\"'</style></script>]]><!-- \u2028\u2029\\ "
    "javascript:alert(1) $\\frac{a}{b}$ $ \x00\x0c"
)


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.hrefs: set[str] = set()
        self.comments: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs |= {k for k, _ in attrs}
        self.hrefs |= {v or "" for k, v in attrs if k == "href"}

    def handle_comment(self, data):
        self.comments.append(data)


@pytest.mark.parametrize("now", [T0, float("nan"), float("inf"), -float("inf"), 1e300])
def test_the_live_page_and_json_stay_markup_free_and_valid_whatever_the_strings_and_numbers(now):
    def ev(i: int, **kw) -> IncidentEvent:
        fields = dict(
            incident=HOSTILE + str(i), state="opened", ts=T0, opened_at=T0, host=HOSTILE, gpu=3,
            root=IncidentRoot(alert=HOSTILE, rule=HOSTILE, fault=HOSTILE), severity=HOSTILE, action=HOSTILE,
            members=[HOSTILE] * 3, changes=["action_escalated", HOSTILE], reason=HOSTILE, policy=HOSTILE,
            job=HOSTILE, pod=HOSTILE, namespace=HOSTILE, mig_instance=HOSTILE, mig_profile=HOSTILE,
        )  # fmt: skip
        fields.update(kw)
        return IncidentEvent(**fields)  # type: ignore[arg-type]

    events = [ev(1), ev(2, opened_at=float("nan"), ts=float("inf")), ev(3, opened_at=-1e300)]
    page = render_live(events, now=now).decode("utf-8")
    m = _Markup()
    m.feed(page)
    m.close()
    assert m.tags <= {"html", "head", "meta", "title", "style", "body", "main", "h1", "p", "a", "b", "table",
                      "thead", "tbody", "tr", "th", "td", "span", "code", "br", "details", "summary", "footer"}
    assert m.attrs <= {"lang", "charset", "http-equiv", "content", "name", "class", "id", "href", "open"}
    assert m.hrefs == {"/incidents.json", "/metrics"} and not m.comments
    assert "<img" not in page and "</script>" not in page and "\u2028" in page  # text, escaped
    data = json.loads(live_json(events, now=now), parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert data["open"] == 3 and data["incidents"][0]["host"] == HOSTILE
