"""The live page of open incidents renders in a real browser: a real ``HttpEndpoint`` on
127.0.0.1 serves what a real ``IncidentStage`` made of real alert events, headless Chromium
loads it over HTTP, and the test looks at the screenshot's pixels and at the DOM."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from pipeline.httpendpoint import HttpEndpoint
from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents.live import live_pages
from pipeline.service.metrics import Metrics
from tests.systools import chromium, headless
from tests.unit.incidents.factories import run, two_open_incidents

HOSTILE = "<script>alert(1)</script>"
WIDTH, HEIGHT = 1280, 800
# The severity marks of the page's rows (pipeline/incidents/live.py's CSS): critical, warning.
CRITICAL, WARNING = (0xC0, 0x39, 0x2B), (0xE0, 0x8E, 0x0B)


def pixels(img: Image.Image, rgb: tuple[int, int, int], tol: int = 6) -> int:
    a = np.asarray(img).astype(int)
    return int((np.abs(a - np.array(rgb)).max(axis=2) <= tol).sum())


class Dom(HTMLParser):
    """The elements and the text of a serialized DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)

    def handle_data(self, data) -> None:
        self.text.append(data)


def dom(html: str) -> Dom:
    d = Dom()
    d.feed(html)
    return d


@pytest.fixture
def served():
    """Two open incidents, one escalated by a policy, one on a host named like a script."""
    stage = IncidentStage(default_config())
    run(two_open_incidents(host=HOSTILE, other="n2"), stage=stage)
    held = {"stage": stage}
    ep = HttpEndpoint("127.0.0.1", 0, Metrics().registry, lambda: (True, {}),
                      pages=live_pages(lambda: held["stage"].open_incidents() if held["stage"] else None)).start()
    yield ep, stage, held
    ep.stop()


def test_the_open_incidents_page_renders_in_headless_chromium(served, tmp_path):
    browser = chromium()
    ep, stage, _ = served
    url = f"http://127.0.0.1:{ep.port}/incidents"
    incidents = stage.open_incidents()
    assert len(incidents) == 2 and sum(bool(e.reason) for e in incidents) == 1

    html = headless(browser, url, tmp_path / "profile-dom", dump_dom=True)
    d = dom(html)
    text = " ".join(" ".join(d.text).split())
    for e in incidents:
        assert e.incident in text and all(m in text for m in e.members)
    assert HOSTILE in text                               # shown as text ...
    assert "script" not in d.tags and "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # ... never run
    assert re.search(r"2 open incidents: 1 critical, 1 warning", text)
    assert "XID 79 5 times in 24h on this GPU" in text and text.count("escalated") >= 1
    assert d.tags.count("tr") == 3                       # the header and one row per incident

    png = tmp_path / "live.png"
    headless(browser, url, tmp_path / "profile-shot", screenshot=png, size=(WIDTH, HEIGHT))
    img = Image.open(png).convert("RGB")
    assert img.size == (WIDTH, HEIGHT)
    rgb = np.asarray(img)
    colours = len(np.unique(rgb.reshape(-1, 3), axis=0))
    non_white = float((rgb.min(axis=2) < 245).mean())
    assert colours > 100, f"only {colours} distinct colours: a blank or unstyled page"
    assert non_white > 0.02, f"{non_white:.1%} of the page is not white"
    # Each row's severity mark (6 px wide, a row high): painted only when the styles applied.
    assert pixels(img, CRITICAL) > 300 and pixels(img, WARNING) > 300


def test_the_empty_and_the_off_pages_say_so_in_chromium(served, tmp_path):
    browser = chromium()
    ep, _, held = served
    url = f"http://127.0.0.1:{ep.port}/incidents"
    held["stage"] = IncidentStage(default_config())
    text = " ".join(dom(headless(browser, url, tmp_path / "p1", dump_dom=True)).text)
    assert "No incident is open." in text and "inc-" not in text
    held["stage"] = None
    text = " ".join(dom(headless(browser, url, tmp_path / "p2", dump_dom=True)).text)
    assert "Incidents are off" in text
