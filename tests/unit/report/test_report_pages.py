import base64
import io
import math
import re

import numpy as np
from markupsafe import escape
from PIL import Image

from pipeline.cli import main
from pipeline.evaluation.score import Score
from pipeline.report import eval_page, flatten_evidence, incident_page
from pipeline.report.alerts import group_events
from pipeline.report.plots import ALERTED, SEVERITY_COLOURS, alert_figure, bit_names, timeline
from pipeline.report.signals import Signal
from pipeline.report.telemetry import load_telemetry
from tests.factories import T0
from tests.unit.report.factories import alert, colour_pixels, images, write_jsonl


def test_the_page_is_self_contained_with_a_timeline_and_a_figure_per_alert(incident_files):
    tel, alerts = incident_files
    page = incident_page([tel], [alerts])
    imgs = images(page)
    assert len(imgs) == 2 and all(i.size[0] > 600 for i in imgs)     # timeline + the one alert
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<script" not in page and "<link" not in page
    assert 'id="alert-1"' in page and "gpu_thermal_throttling" in page and "rules/thermal.yaml" in page
    assert "2025-11-29 08:01:00Z" in page and "(after 1m 30s)" in page        # onset and resolution


def test_the_alerted_gpu_is_drawn_in_its_own_colour(incident_files):
    tel_path, alerts = incident_files
    tel = load_telemetry([tel_path], hosts={"n0"}, fields=["gpu_temp", "sm_clock"])
    inc = group_events([alert(65, started=60)])[0][0]
    sigs = [Signal("gpu_temp"), Signal("sm_clock")]
    img = Image.open(io.BytesIO(base64.b64decode(alert_figure(inc, sigs, tel, 60).split(",", 1)[1])))
    assert colour_pixels(img, ALERTED) > 500
    # The same alert on a GPU the recording does not have: nothing is highlighted.
    inc.event.gpu = 7
    img = Image.open(io.BytesIO(base64.b64decode(alert_figure(inc, sigs, tel, 60).split(",", 1)[1])))
    assert colour_pixels(img, ALERTED) < 50


def test_text_from_the_data_is_escaped(tmp_path, incident_files):
    tel, _ = incident_files
    evil = '<script>alert("x")</script>'
    alerts = write_jsonl(tmp_path / "evil.jsonl", [alert(65, host="n0", summary=evil, evidence={evil: evil},
                                                         labels={"team": evil})])
    page = incident_page([tel], [alerts])
    assert evil not in page and "<script" not in page
    assert page.count(str(escape(evil))) >= 4        # summary (table, section), evidence key and value


def test_sections_are_capped_and_the_rest_are_still_listed(tmp_path, incident_files):
    tel, _ = incident_files
    alerts = write_jsonl(tmp_path / "many.jsonl", [
        alert(10 + i, id=f"a{i}", severity="critical" if i == 3 else "warning") for i in range(5)])
    page = incident_page([tel], [alerts], max_alerts=2)
    assert len(images(page)) == 3                                  # timeline + 2 sections
    assert "3 of 5 alerts are not shown in detail" in page
    sections = re.findall(r'<section class="alert" id="alert-(\d+)">\s*<h3>#\d+ <span class="sev sev-(\w+)"', page)
    assert sections == [("1", "critical"), ("2", "warning")]
    assert page.count('<a href="#alert-') == 2 and page.count("<tr>") >= 5


def test_alerts_without_telemetry_and_broken_inputs_still_make_a_page(tmp_path):
    tel = tmp_path / "t.jsonl"
    tel.write_text("garbage\n")
    alerts = write_jsonl(tmp_path / "a.jsonl", [alert(5)])
    with alerts.open("a") as fh:
        fh.write("{not json\n")
    page = incident_page([tel], [alerts])
    assert "1 telemetry record(s) or line(s) could not be decoded" in page
    assert "1 alert line(s) could not be read" in page and "no readable records" in page
    assert len(images(page)) == 1                                  # the timeline only


def test_evidence_is_flattened_and_formatted():
    rows = dict(flatten_evidence({"a": 6000000000.0, "b": 0.08334, "c": None, "drivers": {"gap": 0.3}}))
    assert rows == {"a": "6,000,000,000", "b": "0.08334", "c": "—", "drivers.gap": "0.3"}


def test_bitmask_values_are_named():
    assert bit_names(0x40 | 0x20 | 0x8) == "hw_slowdown|sw_thermal|hw_thermal" and bit_names(0) == "none"


def _score(name: str, latencies: list[float], injected: int = 4, false_alerts: int = 0) -> Score:
    s = Score(name, gpu_hours=100.0)
    f = s.family("thermal")
    f.injected, f.detected, f.right_gpu = injected, len(latencies), len(latencies)
    f.alerts, f.false_alerts, f.latencies = len(latencies) + false_alerts, false_alerts, list(latencies)
    return s


def test_eval_page_has_a_latency_cdf_and_marks_each_familys_best():
    page = eval_page([_score("ours", [1.0, 2.0, 3.0]), _score("baseline", [60.0, 90.0], false_alerts=2)],
                     title="eval <x>")
    assert "eval &lt;x&gt;" in page and len(images(page)) == 1
    families = page.split('id="families"', 1)[1]
    row = re.search(r"<code>ours</code>.*?</tr>", families, re.S).group(0)
    assert '<td class="num best">75%</td>' in row and '<td class="num best">2.0s</td>' in row
    base = re.search(r"<code>baseline</code>.*?</tr>", families, re.S).group(0)
    assert "best" not in base and "50%" in base
    assert "20.00" in page                                         # 2 false alerts in 100 GPU-hours, per 1,000


def test_eval_page_without_detections_has_no_plot_and_shows_dashes():
    page = eval_page([_score("ours", [], injected=0)], title="empty")
    assert len(images(page)) == 0 and "—" in page and math.isnan(_score("x", [], 0).family("thermal").recall)


def test_cli_writes_the_report_and_refuses_missing_inputs(tmp_path, incident_files, capsys):
    tel, alerts = incident_files
    out = tmp_path / "sub" / "r.html"
    assert main(["report", "--telemetry", str(tel), "--alerts", str(alerts), "--out", str(out),
                 "--window", "60", "--max-alerts", "1"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and "wrote" in capsys.readouterr().err
    assert main(["report", "--telemetry", str(tmp_path / "nope"), "--alerts", str(alerts), "--out", str(out)]) == 3
    assert "no such file" in capsys.readouterr().err


def test_the_cli_says_what_it_skipped_and_a_page_of_swapped_files_is_no_success(incident_files, tmp_path, capsys):
    # Before: "wrote r.html" and exit 0 for the two files swapped; the skipped lines were told
    # only inside the page ("No alert fired", 1970-01-01).
    tel, alerts = incident_files
    assert main(["report", "--telemetry", str(tel), "--alerts", str(alerts), "--out", str(tmp_path / "ok.html")]) == 0
    assert "skipped" not in capsys.readouterr().err
    rc = main(["report", "--telemetry", str(alerts), "--alerts", str(tel), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err.splitlines()
    assert rc == 3 and (tmp_path / "r.html").exists()
    assert "gpuwarden report: 720 alert line(s) could not be read and were skipped." in err
    assert f"gpuwarden report: --alerts {tel}: not one line could be read" in err
    assert f"gpuwarden report: --telemetry {alerts}: not one line could be read" in err


def _columns(img: Image.Image, hex_colour: str, tol: int = 10) -> np.ndarray:
    """The x of every pixel column holding ``hex_colour`` below the legend (the top fifth)."""
    rgb = np.asarray(img.convert("RGB")).astype(int)
    rgb = rgb[rgb.shape[0] // 5:]
    target = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return np.flatnonzero((np.abs(rgb - target).max(axis=2) <= tol).any(axis=0))


def test_the_timeline_draws_each_alert_from_firing_to_resolution_and_its_pending_part_pale():
    """Bars where the alerts are: a critical alert firing 100-200 s, a warning one 400-600 s on
    the same host (their lengths 1:2, in that order), the critical one pending from 0 s, pale."""
    events = [alert(100, id="c", started=0), alert(200, id="c", state="resolved"),
              alert(400, id="w", severity="warning", rule="gpu_x", host="n0"),
              alert(600, id="w", severity="warning", state="resolved", rule="gpu_x", host="n0")]
    incidents = group_events(events)[0]
    tl = timeline(incidents, T0, T0 + 600)
    img = Image.open(io.BytesIO(base64.b64decode(tl.uri.split(",", 1)[1])))
    crit, warn = _columns(img, SEVERITY_COLOURS["critical"]), _columns(img, SEVERITY_COLOURS["warning"])
    pale = np.array([int(SEVERITY_COLOURS["critical"][i:i + 2], 16) * 0.35 + 255 * 0.65 for i in (1, 3, 5)])
    pending = _columns(img, "#%02x%02x%02x" % tuple(int(round(v)) for v in pale), tol=12)
    assert len(crit) and len(warn) and len(pending)
    assert pending.max() <= crit.min() + 2 and crit.max() < warn.min()
    assert 1.8 < (warn.max() - warn.min()) / (crit.max() - crit.min()) < 2.2
    assert 0.8 < (pending.max() - pending.min()) / (crit.max() - crit.min()) < 1.2
