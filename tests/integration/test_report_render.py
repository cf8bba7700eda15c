"""A report for a simulated incident renders in a real browser: headless Chromium takes a
screenshot and the test looks at the pixels, and at the DOM for the incidents' timeline and table.

Chromium is a system package (``make browser`` installs it; ``make test`` depends on it). Without
it the test is skipped locally and fails under CI, so CI cannot pass without rendering.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.resources import rules_dir
from pipeline.detection import build_engine
from pipeline.incidents import IncidentStage, default_config
from pipeline.replay import replay
from pipeline.report import incident_page, load_alerts, load_incidents, write_page
from pipeline.report.plots import SEVERITY_COLOURS
from pipeline.schema import encode
from producers.sim import Simulator
from tests.systools import chromium, headless

WIDTH, HEIGHT = 1280, 2000


def screenshot(browser: str, page: Path, png: Path, profile: Path) -> Image.Image:
    headless(browser, page.resolve().as_uri(), profile, screenshot=png, size=(WIDTH, HEIGHT))
    return Image.open(png).convert("RGB")


def plot_pixels(img: Image.Image, tol: int = 12) -> int:
    """Pixels in the severity colours: only the embedded figures paint with them (not the CSS)."""
    rgb = np.asarray(img).astype(int)
    hit = np.zeros(rgb.shape[:2], dtype=bool)
    for hex_colour in set(SEVERITY_COLOURS.values()):
        target = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
        hit |= np.abs(rgb - target).max(axis=2) <= tol
    return int(hit.sum())


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    """Simulated thermal incident (2 hosts x 8 GPUs, 10 min) -> replay -> alerts and incident
    events -> report page."""
    d = tmp_path_factory.mktemp("incident")
    tel, alerts, incidents = d / "telemetry.jsonl", d / "alerts.jsonl", d / "incidents.jsonl"
    sim = Simulator(hosts=2, duration=600, seed=1, scenario="thermal")
    with tel.open("wb") as fh:
        for batch in sim.batches():
            if batch:
                fh.write(encode(batch) + b"\n")       # one line per tick: an array of records
    engine, diags = build_engine([rules_dir()])
    assert engine is not None, [str(x) for x in diags]
    replay([tel], engine=engine, alerts_out=str(alerts), incidents=IncidentStage(default_config()),
           incidents_out=str(incidents))
    log = load_alerts([alerts])
    assert any(i.event.family == "thermal" for i in log.incidents), "the simulated fault raised no thermal alert"
    page = write_page(incident_page([tel], [alerts], rules=[rules_dir()], title="Thermal incident",
                                    incident_events=[incidents]), d / "report.html")
    return d, page, log, load_incidents([incidents])


def test_report_page_renders_in_headless_chromium(incident):
    browser = chromium()
    d, page, log, _ = incident
    html = page.read_text()
    n_img = len(re.findall(r'<img src="data:image/png;base64,', html))
    assert n_img == 2 + len(log.incidents)            # the two timelines and one figure per alert

    img = screenshot(browser, page, d / "shot.png", d / "profile")
    assert img.size == (WIDTH, HEIGHT)
    rgb = np.asarray(img)
    colours = len(np.unique(rgb.reshape(-1, 3), axis=0))
    non_white = float((rgb.min(axis=2) < 245).mean())
    drawn = plot_pixels(img)
    assert colours > 500, f"only {colours} distinct colours: a blank or unstyled page"
    assert non_white > 0.08, f"{non_white:.1%} of the page is not white"
    assert drawn > 3000, f"{drawn} pixels of alert bars: the timeline did not render"

    # The same page with its images broken must fail the check above: the check sees the figures.
    broken = d / "broken.html"
    broken.write_text(re.sub(r'src="data:image/png;base64,[^"]+"', 'src="data:image/png;base64,AAAA"', html))
    bad = screenshot(browser, broken, d / "broken.png", d / "profile-broken")
    assert plot_pixels(bad) < drawn / 20


def test_the_incident_timeline_renders_in_headless_chromium(incident):
    browser = chromium()
    d, page, log, inc_log = incident
    spans = inc_log.incidents
    assert spans and len(spans) < len(log.incidents), "the thermal alerts grouped into fewer incidents"
    dom = headless(browser, page.resolve().as_uri(), d / "profile-dom", dump_dom=True, size=(WIDTH, HEIGHT))
    assert '<h2 id="incidents">Incidents</h2>' in dom and 'alt="Timeline of incidents"' in dom
    alert_ids = {i.id for i in log.incidents}
    for s in spans:
        assert f'id="incident-{s.id}"' in dom          # one row per incident ...
        assert set(s.members) <= alert_ids             # ... whose members are alerts of the report
    for i in log.incidents:
        if i.number:                                   # a member with a section links to it
            assert f'href="#alert-{i.number}"' in dom

    # The incident timeline's own pixels: the page with only that figure broken loses them.
    html = page.read_text()
    shown = plot_pixels(screenshot(browser, page, d / "inc.png", d / "profile-inc"))
    figure = re.compile(r'(<img src=")data:image/png;base64,[^"]+(" alt="Timeline of incidents")')
    assert len(figure.findall(html)) == 1
    broken = d / "broken-incidents.html"
    broken.write_text(figure.sub(r"\1data:image/png;base64,AAAA\2", html))
    without = plot_pixels(screenshot(browser, broken, d / "inc-broken.png", d / "profile-inc-broken"))
    assert shown - without > 2000, f"{shown - without} pixels of incident bars: the incident timeline did not render"
