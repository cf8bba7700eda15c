"""Telemetry strings carrying markup, script breakers, URLs and mathtext never become anything
but text: in the page's HTML (text, attributes), in its figures, and in what the service's
HTTP endpoint answers (docs/report.md; docs/operations.md, Security)."""

from __future__ import annotations

from html.parser import HTMLParser


from pipeline.incidents.events import IncidentEvent, IncidentRoot
from pipeline.report import eval_page, incident_page
from tests.factories import T0, sample
from tests.unit.report.factories import alert, images, write_jsonl

# Host names hold no space (the decoder refuses them); every other field may.
HOST_SCRIPT = "</script><script>alert(1)</script>"
HOST_ATTR = '"><svg/onload=alert(1)>'
HOST_MATH = "n$\\foo$"  # mathtext that does not parse: a figure drawn as mathtext fails
PAYLOADS = [
    "<img src=x onerror=alert(1)>",
    "</script><script>alert(1)</script>",
    '"><svg onload=alert(1)>',
    "'><iframe src=javascript:alert(1)>",
    "<!-- ",
    "javascript:alert(1)",
    "$\\frac{a}{$",
]
HOSTILE = " ".join(PAYLOADS)

# What the page itself writes: anything else parsed from it was injected.
TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "main",
    "footer",
    "h1",
    "h2",
    "h3",
    "p",
    "code",
    "ul",
    "li",
    "b",
    "span",
    "figure",
    "img",
    "figcaption",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "a",
    "br",
    "section",
    "div",
    "dl",
    "dt",
    "dd",
}
ATTRS = {"lang", "charset", "name", "content", "http-equiv", "class", "id", "src", "alt", "href", "colspan"}


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.comments: list[str] = []
        self.meta: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        d = dict(attrs)
        if tag == "meta" and d.get("http-equiv"):
            self.meta[(d["http-equiv"] or "").lower()] = d.get("content") or ""

    def handle_comment(self, data):
        self.comments.append(data)


def markup(page: str) -> _Markup:
    p = _Markup()
    p.feed(page)
    p.close()
    return p


def assert_only_own_markup(page: str) -> None:
    m = markup(page)
    assert set(m.tags) <= TAGS, set(m.tags) - TAGS
    assert not m.comments
    for tag, k, v in m.attrs:
        assert k in ATTRS and not k.startswith("on"), (tag, k, v)
        if k == "src":
            assert v.startswith("data:image/png;base64,"), (tag, v[:80])
        if k == "href":
            assert v.startswith("#alert-") and v[len("#alert-") :].isdigit(), v
    for raw in [*PAYLOADS, HOST_SCRIPT, HOST_ATTR]:
        if raw.strip() not in ("javascript:alert(1)", "$\\frac{a}{$"):  # harmless as text
            assert raw.strip() not in page, raw


def _hostile_files(tmp_path):
    hosts = [HOST_SCRIPT, HOST_ATTR, HOST_MATH]
    hot = {"gpu_temp": 90, "sm_clock": 1005}
    tel = write_jsonl(
        tmp_path / "t.jsonl",
        [
            sample(t, h, g, **(hot if g == 1 and t >= 60 else {}))
            for t in range(0, 180, 2)
            for h in hosts
            for g in (0, 1)
        ],
    )
    alerts = [
        alert(
            65 + i,
            id=f"a{i}",
            host=h,
            started=60,
            summary=HOSTILE,
            job=HOSTILE,
            labels={"team": HOSTILE, HOSTILE: HOSTILE, "pod": "javascript:alert(1)"},
            evidence={"gpu_temp": 90.0, HOSTILE: HOSTILE, "drivers": {HOSTILE: [HOSTILE, 1.0]}},
        )
        for i, h in enumerate(hosts)
    ]
    # A rule nobody loaded, with a fault of a family the report does not know: the evidence-key
    # fallback plots what the evidence names.
    alerts.append(
        alert(
            70,
            id="a-odd",
            host=HOST_MATH,
            rule=HOSTILE,
            fault=f"thermal_{HOSTILE}",
            severity=HOSTILE,
            evidence={"increase(gpu_temp, 1m)": 3.0, "comm": HOST_MATH},
        )
    )
    root = IncidentRoot(alert="a0", rule=HOSTILE, fault=HOSTILE)
    events = [
        IncidentEvent(
            incident=inc,
            state=state,
            ts=T0 + ts,
            opened_at=T0 + 61,
            host=host,
            gpu=1,
            root=root,
            members=["a0", "a1", HOSTILE],
            severity="critical",
            action=HOSTILE,
            changes=changes,
            reason=HOSTILE if changes else "",
            policy=HOSTILE,
            job=HOSTILE,
            pod=HOSTILE,
        )
        for inc, host in ((HOSTILE, HOST_SCRIPT), (HOST_MATH, HOST_MATH), ("alert-1", HOST_ATTR))
        for state, ts, changes in (("opened", 61, []), ("updated", 90, ["action_escalated"]))
    ]
    return tel, write_jsonl(tmp_path / "a.jsonl", alerts), write_jsonl(tmp_path / "i.jsonl", events)


def test_hostile_telemetry_strings_are_only_ever_text_in_the_report(tmp_path):
    tel, alerts, incidents = _hostile_files(tmp_path)
    page = incident_page([tel], [alerts], incident_events=[incidents], title=HOSTILE)
    assert_only_own_markup(page)
    # Every alert got its section and figure, and the strings are on the page, escaped.
    assert len(images(page)) == 2 + 4  # two timelines, a figure per alert
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&#34;&gt;&lt;svg/onload=alert(1)&gt;" in page and HOST_MATH in page


def test_a_host_name_with_dollar_signs_is_text_in_the_figures_not_mathtext(tmp_path):
    """``n$\\foo$`` as mathtext is an unknown symbol: before, its ValueError failed the whole report."""
    hot = {"gpu_temp": 90, "sm_clock": 1005}
    tel = write_jsonl(
        tmp_path / "t.jsonl",
        [sample(t, HOST_MATH, g, **(hot if g == 1 and t >= 60 else {})) for t in range(0, 180, 2) for g in (0, 1)],
    )
    alerts = write_jsonl(tmp_path / "a.jsonl", [alert(65, host=HOST_MATH, started=60)])
    page = incident_page([tel], [alerts])
    assert len(images(page)) == 2 and HOST_MATH in page


def test_the_pages_forbid_scripts_and_fetches_in_a_content_security_policy(tmp_path, incident_files):
    tel, alerts = incident_files
    for page in (incident_page([tel], [alerts]), eval_page([], title=HOSTILE)):
        assert_only_own_markup(page)
        csp = markup(page).meta.get("content-security-policy", "")
        directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
        assert directives.get("default-src") == ["'none'"] and directives.get("img-src") == ["data:"]
        assert "script-src" not in directives and directives.get("base-uri") == ["'none'"]
        # The policy comes before anything it governs: first in <head> after the charset.
        assert page.index("Content-Security-Policy") < page.index("<title>") < page.index("<style>")
