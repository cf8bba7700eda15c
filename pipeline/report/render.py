"""The HTML pages: an incident report (telemetry + alerts) and an evaluation page (scores).

Templates live in ``templates/`` and are rendered with autoescaping on: every string from the
data (host names, summaries, evidence keys, labels) is escaped, so a hostile label cannot
inject markup into the page an operator opens.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jinja2

from pipeline.report.alerts import SEVERITY_RANK, Incident, load_alerts, most_important
from pipeline.report.incidents import load_incidents, most_severe
from pipeline.report.plots import alert_figure, incident_timeline, latency_cdf, timeline
from pipeline.report.signals import DCGM, NCCL, CheckCatalog, CheckInfo, load_checks
from pipeline.report.telemetry import load_telemetry

MAX_TABLE_ROWS = 1000
MAX_MEMBERS_LISTED = 20  # member alerts listed per incident in its row (the count is whole)
MAX_MEMBER_TEXT = 256  # characters of a member alert's rule and host in an incident's row


def _short(text: str, width: int = MAX_MEMBER_TEXT) -> str:
    """``text`` cut to ``width`` characters: a member's rule is written once per incident that
    lists it, so a 100 KB rule named by 1,000 incidents made a 2 GB page of a 0.5 MB input."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _utc(ts: float | None, date: bool = True) -> str:
    if ts is None or ts != ts:
        return "—"
    t = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%SZ" if date else "%H:%M:%S")


def _first(what: str, problems: list[str], count: int) -> list[str]:
    """The note naming the first lines skipped (an item of an array line counts as one)."""
    if not problems:
        return []
    more = f"; {count - len(problems):,} more" if count > len(problems) else ""
    return [f"Skipped {what} lines: {'; '.join(problems)}{more}."]


def _dur(s: float | None) -> str:
    if s is None or s != s:
        return "—"
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


def _pct(x: float) -> str:
    return "—" if x is None or x != x else f"{100 * x:.0f}%"


def _secs(x: float) -> str:
    return "—" if x is None or x != x else (f"{x:.1f}s" if x < 10 else f"{x:.0f}s")


def _fixed(x: float, digits: int = 2) -> str:
    return "—" if x is None or x != x else f"{x:,.{digits}f}"


def _value(v: Any) -> str:
    """An evidence value as an operator reads it: big integers with separators, 4 significant digits."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        f = float(v)
        if not math.isfinite(f):
            return str(f)
        if f == int(f) and abs(f) < 1e15:
            return f"{int(f):,}"
        return f"{f:,.4g}" if abs(f) >= 1e-3 else f"{f:.3g}"
    return str(v)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pipeline.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(utc=_utc, dur=_dur, pct=_pct, secs=_secs, fixed=_fixed, short=_short)
    return env


def _version() -> str:
    try:
        return version("gpuwarden")
    except PackageNotFoundError:
        return "dev"


def _common(title: str) -> dict[str, Any]:
    return {
        "title": title,
        "version": _version(),
        "generated_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
    }


def flatten_evidence(evidence: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Evidence as (key, shown value) rows; nested dicts (a model's drivers) become ``drivers.x``."""
    rows: list[tuple[str, str]] = []
    for k, v in evidence.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            rows.extend(flatten_evidence(v, key + "."))
        elif isinstance(v, list):
            rows.append((key, ", ".join(_value(x) for x in v)))
        else:
            rows.append((key, _value(v)))
    return rows


# -- incident report -----------------------------------------------------------------------------


@dataclass
class Section:
    inc: Incident
    kind: str
    check: CheckInfo | None
    signals: list[str]
    evidence: list[tuple[str, str]]
    uri: str | None


def incident_page(
    telemetry: Sequence[str | Path],
    alerts: Sequence[str | Path],
    *,
    rules: Sequence[str | Path] = ("rules",),
    models: str | None = "auto",
    window: float = 300.0,
    max_alerts: int = 50,
    title: str = "Incident report",
    checks: CheckCatalog | None = None,
    progress: Callable[[str], None] | None = None,
    incident_events: Sequence[str | Path] = (),
    max_incidents: int = 60,
    notes_out: list[str] | None = None,
    unread_out: list[str] | None = None,
) -> str:
    """One self-contained HTML page about the alerts in ``alerts`` and the telemetry around them.

    ``rules``/``models`` are the checks the alerts came from (as ``replay`` takes them): they say
    which fields each alert's detector reads. ``window``: seconds of telemetry shown either side
    of an alert. ``max_alerts``: alerts given a section of their own (the rest are listed only).
    ``incident_events``: incident-event files (``replay --incidents-out``), shown as a timeline of
    incidents (``max_incidents`` rows, the most severe) and a table with their member alerts.
    ``progress(text)``: told what it is doing (the CLI's spinner). ``notes_out``: given the
    page's notes on its inputs (lines skipped, events not shown); ``unread_out``: given the inputs
    (``alerts``, ``telemetry``, ``incidents``) of which not one line could be read, a page made of
    the wrong file (the CLI's exit status).
    """
    step = progress or (lambda _: None)
    step("reading alerts")
    log = load_alerts(alerts)
    incidents = log.incidents
    inc_log = load_incidents(incident_events) if incident_events else None
    spans = inc_log.incidents if inc_log is not None else []
    shown = most_important(incidents, max_alerts)
    for n, inc in enumerate(shown, 1):
        inc.number = n
    cat = checks if checks is not None else load_checks(list(rules), models)
    plans = [(inc, *cat.signals_for(inc.event)) for inc in shown]
    dcgm_fields = {s.name for _, sigs, _ in plans for s in sigs if s.source == DCGM}
    nccl_fields = {s.name for _, sigs, _ in plans for s in sigs if s.source == NCCL}
    hosts = {inc.event.host for inc in shown if inc.event.host}
    nccl_hosts = {inc.event.host for inc, sigs, _ in plans if inc.event.host and any(s.source == NCCL for s in sigs)}
    step("reading telemetry")
    tel = load_telemetry(
        telemetry, hosts=hosts, fields=sorted(dcgm_fields), nccl_fields=sorted(nccl_fields), nccl_hosts=nccl_hosts
    )

    alert_ts = [t for i in incidents for t in (i.started_at, i.fired_at, i.resolved_at) if t is not None]
    alert_ts += [t for sp in spans for t in (sp.opened_at, sp.last_ts) if math.isfinite(t)]
    if tel.records:
        t_start, t_end = tel.t_min, tel.t_max
        if alert_ts:
            t_start, t_end = min(t_start, min(alert_ts)), max(t_end, max(alert_ts))
    elif alert_ts:
        t_start, t_end = min(alert_ts), max(alert_ts)
    else:
        t_start = t_end = 0.0

    notes = list(cat.problems)
    if not tel.records:
        notes.append("The telemetry files hold no readable records: the alerts are listed without their signals.")
    if tel.dead:
        notes.append(f"{tel.dead:,} telemetry record(s) or line(s) could not be decoded and were skipped.")
    if log.bad_lines:
        notes.append(f"{log.bad_lines} alert line(s) could not be read and were skipped.")
        notes.extend(_first("alert", log.problems, log.bad_lines))
    if log.orphan_resolutions:
        notes.append(f"{log.orphan_resolutions} alert(s) resolved without their firing event in the file: not shown.")
    if log.conflicts:
        notes.append(
            f"{log.conflicts:,} alert id(s) have firing events naming different alerts (rule, fault, host or GPU):"
            " only the earliest of each is shown."
        )
    if inc_log is not None and inc_log.bad_lines:
        notes.append(f"{inc_log.bad_lines} incident event line(s) could not be read and were skipped.")
        notes.extend(_first("incident event", inc_log.problems, inc_log.bad_lines))
    if inc_log is not None and inc_log.orphans:
        notes.append(f"{inc_log.orphans} incident event(s) of incidents not opened in the file: not shown.")
    if notes_out is not None:
        notes_out.extend(notes)
    if unread_out is not None:
        unread_out.extend(
            what
            for what, lines, read in (
                ("alerts", log.lines, log.read),
                ("incidents", inc_log.lines if inc_log else 0, inc_log.read if inc_log else 0),
                ("telemetry", tel.lines, tel.records or not tel.dead),
            )
            if lines and not read
        )

    sections = []
    for n, (inc, sigs, info) in enumerate(plans, 1):
        step(f"plotting alert {n}/{len(plans)}")
        kind = (
            info.kind
            if info
            else ("model" if inc.is_model else "builtin" if inc.event.rule.startswith("builtin_") else "rule")
        )
        uri = alert_figure(inc, sigs, tel, window) if tel.records else None
        sections.append(Section(inc, kind, info, [s.name for s in sigs], flatten_evidence(inc.event.evidence), uri))

    drawn = most_severe(spans, max_incidents)
    by_alert = {a.id: a for a in incidents}
    sev_counts: dict[str, int] = {}
    for inc in incidents:
        sev_counts[inc.severity] = sev_counts.get(inc.severity, 0) + 1
    ctx = {
        **_common(title),
        "telemetry_paths": [str(p) for p in telemetry],
        "alert_paths": [str(p) for p in alerts],
        "t_start": t_start,
        "t_end": t_end,
        "incidents": incidents,
        "by_severity": sorted(sev_counts.items(), key=lambda kv: SEVERITY_RANK.get(kv[0], 9)),
        "n_hosts": len({i.event.host for i in incidents if i.event.host}),
        "n_gpus": len({(i.event.host, i.event.gpu) for i in incidents if i.event.gpu is not None}),
        "records": tel.records,
        "notes": notes,
        "timeline": timeline(incidents, t_start, t_end) if incidents else None,
        "table_rows": incidents[:MAX_TABLE_ROWS],
        "table_left_out": max(0, len(incidents) - MAX_TABLE_ROWS),
        "sections": sections,
        "left_out": len(incidents) - len(shown),
        "window": window,
        "incident_paths": [str(p) for p in incident_events],
        "spans": spans[:MAX_TABLE_ROWS],
        "n_spans": len(spans),
        "spans_left_out": max(0, len(spans) - MAX_TABLE_ROWS),
        "incident_timeline": incident_timeline(drawn, t_start, t_end, left_out=len(spans) - len(drawn))
        if drawn
        else None,
        "by_alert": by_alert,
        "max_members": MAX_MEMBERS_LISTED,
    }
    return _env().get_template("incident.html.j2").render(ctx)


def write_page(html: str, out: str | Path) -> Path:
    """Write a page atomically: a reader never opens half a report."""
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, p)
    return p


# -- evaluation page -----------------------------------------------------------------------------


def _best(values: list[float], higher: bool) -> set[int]:
    ok = [(v, i) for i, v in enumerate(values) if v == v]
    if len(ok) < 2:
        return set()
    target = max(v for v, _ in ok) if higher else min(v for v, _ in ok)
    return {i for v, i in ok if v == target}


def eval_page(scores: Iterable[Any], title: str = "Detector evaluation", subtitle: str = "") -> str:
    """An HTML page of ``pipeline.evaluation.score.Score`` objects: a per-detector summary, a
    detection-latency CDF per fault family, and a per-family table with each family's best in bold."""
    scores = list(scores)
    detectors = []
    for s in scores:
        fams = [f for f in s.families.values()]
        injected = sum(f.injected for f in fams)
        detected = sum(f.detected for f in fams)
        detectors.append(
            {
                "name": s.detector,
                "injected": injected,
                "detected": detected,
                "recall": detected / injected if injected else math.nan,
                "alerts": sum(f.alerts for f in fams),
                "false_alerts": sum(f.false_alerts for f in fams),
                "false_rate": s.false_per_1000_gpu_h,
                "gpu_hours": s.gpu_hours,
            }
        )
    fam_names = sorted({f for s in scores for f, fs in s.families.items() if fs.injected or fs.alerts})
    rows = []
    for fam in fam_names:
        fs = [s.families.get(fam) for s in scores]
        present = [(s, f) for s, f in zip(scores, fs) if f is not None]
        cols = {
            "recall": ([f.recall for _, f in present], True),
            "precision": ([f.precision for _, f in present], True),
            "f1": ([f.f1 for _, f in present], True),
            "p50": ([f.latency(50) for _, f in present], False),
            "p95": ([f.latency(95) for _, f in present], False),
        }
        best = {k: _best(v, hi) for k, (v, hi) in cols.items()}
        for i, (s, f) in enumerate(present):
            rows.append(
                {
                    "family": fam,
                    "detector": s.detector,
                    "f": f,
                    "first": i == 0,
                    "p50": f.latency(50),
                    "p95": f.latency(95),
                    "best": {k for k, idx in best.items() if i in idx},
                }
            )
    ctx = {
        **_common(title),
        "subtitle": subtitle,
        "detectors": detectors,
        "families": rows,
        "cdf": latency_cdf(scores) if scores else None,
    }
    return _env().get_template("eval.html.j2").render(ctx)
