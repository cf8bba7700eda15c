"""The live view of open incidents: a small read-only HTML page, and the same data as JSON, that
``serve`` answers on ``/incidents`` and ``/incidents.json`` beside ``/metrics``
(docs/operations.md, "The incidents page").

The page is one self-contained document: inline CSS, no script, nothing fetched; it reloads
itself with ``<meta http-equiv="refresh">``. Host names, rule names, labels and ids come from
telemetry, so every one of them is escaped (Jinja2 with autoescaping).
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from typing import Callable, Sequence

import jinja2
import msgspec

from pipeline.incidents.events import ESCALATED, IncidentEvent
from pipeline.incidents.stage import SEVERITY_RANK

REFRESH_S = 15  # seconds between the page's own reloads
MAX_SHOWN = 500  # incidents on one page (the page says how many more are open)
MAX_MEMBERS_SHOWN = 50  # alert ids listed per incident (the count is always whole)
HTML = "text/html; charset=utf-8"
JSON = "application/json"

# What a source gives: the open incidents, or None when no incident stage runs.
Source = Callable[[], Sequence[IncidentEvent] | None]
Page = tuple[str, bytes]  # content type, body


def reading_order(incidents: Sequence[IncidentEvent]) -> list[IncidentEvent]:
    """Most severe first, then the longest open, then by id: the order a reader triages in.

    >>> from pipeline.incidents.events import IncidentRoot
    >>> root = IncidentRoot(alert="a", rule="r", fault="f")
    >>> evs = [IncidentEvent(incident=i, state="opened", ts=t, opened_at=t, host="n1", root=root,
    ...                      severity=s, action="watch") for i, t, s in
    ...        [("inc-a", 5.0, "warning"), ("inc-b", 9.0, "critical"), ("inc-c", 1.0, "critical")]]
    >>> [e.incident for e in reading_order(evs)]
    ['inc-c', 'inc-b', 'inc-a']
    """
    return sorted(incidents, key=lambda e: (-SEVERITY_RANK.get(e.severity, -1), e.opened_at, e.incident))


def escalated(e: IncidentEvent) -> bool:
    """Whether the incident's action climbed by a policy (its ``reason``) or its latest event says so."""
    return bool(e.reason) or ESCALATED in e.changes


def _utc(ts: float) -> str:
    if not math.isfinite(ts) or not -1e11 < ts < 1e11:
        return "—"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _age(seconds: float) -> str:
    """``3725`` -> ``1h 02m``; a negative age (a clock ahead of ours) reads 0s."""
    s = max(0.0, seconds) if math.isfinite(seconds) else 0.0
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d {int(s % 86400 // 3600):02d}h"


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{ refresh }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
  body { margin: 0; font: 14px/1.45 system-ui, "DejaVu Sans", sans-serif; color: #1f2933; background: #fff; }
  main { max-width: 1400px; margin: 0 auto; padding: 20px 24px 40px; }
  h1 { font-size: 22px; margin: 0 0 4px; }
  .sub { color: #5f6b76; margin: 0 0 14px; }
  .empty { font-size: 16px; padding: 18px; background: #eef7ee; border-left: 5px solid #2e7d32; }
  .off { font-size: 16px; padding: 18px; background: #f4f4f4; border-left: 5px solid #78909c; }
  .note { background: #fff8e6; border-left: 4px solid #f0c36d; padding: 8px 12px; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; }
  th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid #d9dee3; vertical-align: top; }
  th { background: #f5f7f9; white-space: nowrap; }
  tr.critical td:first-child { border-left: 6px solid #c0392b; }
  tr.warning td:first-child { border-left: 6px solid #e08e0b; }
  tr.info td:first-child { border-left: 6px solid #2e86c1; }
  tr.other td:first-child { border-left: 6px solid #7f8c8d; }
  .sev { display: inline-block; padding: 0 7px; border-radius: 10px; font-weight: 600; font-size: 12px; }
  .sev.critical { background: #fbe3e1; color: #8b1a10; }
  .sev.warning { background: #fdf0d5; color: #7a4b00; }
  .sev.info { background: #e1effa; color: #154a72; }
  .sev.other { background: #eceff1; color: #37474f; }
  .esc { display: inline-block; padding: 0 6px; border-radius: 4px; background: #6a1b9a; color: #fff;
         font-size: 11px; font-weight: 700; }
  code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; overflow-wrap: anywhere; }
  td.wrap { overflow-wrap: anywhere; max-width: 28ch; }
  td.id { white-space: nowrap; }
  details summary { cursor: pointer; }
  footer { color: #5f6b76; font-size: 12px; margin-top: 24px; }
</style>
</head>
<body>
<main>
<h1>{{ title }}</h1>
<p class="sub">as of {{ now_utc }} · this page reloads every {{ refresh }} s ·
  <a href="/incidents.json">JSON</a> · <a href="/metrics">metrics</a></p>
{% if incidents is none %}
<p class="off" id="off">Incidents are off: this service runs no incident stage.</p>
{% elif not incidents %}
<p class="empty" id="empty">No incident is open.</p>
{% else %}
<p><b id="open-count">{{ total }}</b> open incident{{ "s" if total != 1 }}{% if by_severity %}:
  {% for s, n in by_severity %}{{ n }} {{ s }}{{ ", " if not loop.last }}{% endfor %}{% endif %}.</p>
{% if left_out %}<p class="note">{{ left_out }} more open incident(s), the least severe and newest, are not
  listed here; <a href="/incidents.json">the JSON</a> holds the same {{ shown | length }}.</p>{% endif %}
<table>
<thead><tr><th>severity</th><th>incident</th><th>host / GPU</th><th>root: rule (fault)</th><th>action</th>
  <th>opened (UTC)</th><th>age</th><th>alerts</th><th>job / pod / MIG</th><th>escalation</th></tr></thead>
<tbody>
{% for e in shown %}
{% set sevc = e.severity if e.severity in ("critical", "warning", "info") else "other" %}
<tr class="{{ sevc }}" id="{{ e.incident }}">
  <td><span class="sev {{ sevc }}">{{ e.severity }}</span></td>
  <td class="mono id">{{ e.incident }}<br><span class="sub">{{ e.state }}{% if e.changes %}: {{ e.changes | join(", ") }}{% endif %}</span></td>
  <td class="wrap">{{ e.host if e.host is not none else "(no host)" }}{% if e.gpu is not none %} · GPU {{ e.gpu }}{% endif %}</td>
  <td class="wrap"><code>{{ e.root.rule }}</code> ({{ e.root.fault }})</td>
  <td><b>{{ e.action }}</b></td>
  <td class="mono">{{ utc(e.opened_at) }}</td>
  <td>{{ age(now - e.opened_at) }}</td>
  {% set n = e.members | length + e.more_members %}
  {% set listed = [e.members | length, max_members] | min %}
  <td><details{{ " open" if n <= 5 }}><summary>{{ n }} alert{{ "s" if n != 1 }}</summary>
    {% for m in e.members[:max_members] %}<code>{{ m }}</code>{{ "<br>" | safe if not loop.last }}{% endfor %}
    {% if n > listed %}<br><span class="sub">and {{ n - listed }} more</span>{% endif %}
  </details></td>
  <td class="wrap">{% for k, v in placement(e) %}{{ k }} <code>{{ v }}</code>{{ "<br>" | safe if not loop.last }}{% else %}—{% endfor %}</td>
  <td class="wrap">{% if escalated(e) %}<span class="esc">escalated</span>{% if e.policy %} <code>{{ e.policy }}</code>{% endif %}
    {% if e.reason %}<br>{{ e.reason }}{% endif %}{% else %}—{% endif %}</td>
</tr>
{% endfor %}
</tbody>
</table>
{% endif %}
<footer>gpuwarden · read-only · the alerts behind each incident are on the alerts topic under their ids.</footer>
</main>
</body>
</html>
"""

_env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_page = _env.from_string(_TEMPLATE)


def _placement(e: IncidentEvent) -> list[tuple[str, str]]:
    """Where the incident's alerts ran: job, pod (with its namespace) and MIG instance."""
    out: list[tuple[str, str]] = []
    if e.job:
        out.append(("job", e.job))
    if e.pod:
        out.append(("pod", f"{e.namespace}/{e.pod}" if e.namespace else e.pod))
    if e.mig_instance is not None:
        out.append(("MIG", f"{e.mig_instance}" + (f" ({e.mig_profile})" if e.mig_profile else "")))
    return out


def render_live(
    incidents: Sequence[IncidentEvent] | None,
    *,
    now: float,
    refresh: int = REFRESH_S,
    max_shown: int = MAX_SHOWN,
    max_members: int = MAX_MEMBERS_SHOWN,
    title: str = "Open incidents",
) -> bytes:
    """The HTML page of ``incidents`` (each open incident's latest event), most severe first;
    ``None``: the incident stage is off. ``now`` (epoch seconds) dates the page and ages them.

    >>> page = render_live([], now=0.0)
    >>> b"No incident is open." in page and b'http-equiv="refresh"' in page
    True
    >>> b"Incidents are off" in render_live(None, now=0.0)
    True
    """
    ordered = reading_order(incidents) if incidents is not None else None
    shown = ordered[: max(0, max_shown)] if ordered is not None else []
    counts: dict[str, int] = {}
    for e in ordered or ():
        counts[e.severity] = counts.get(e.severity, 0) + 1
    html = _page.render(
        title=title,
        refresh=max(1, int(refresh)),
        now=now,
        now_utc=_utc(now),
        incidents=ordered,
        shown=shown,
        total=len(ordered or ()),
        left_out=len(ordered or ()) - len(shown),
        by_severity=sorted(counts.items(), key=lambda kv: (-SEVERITY_RANK.get(kv[0], -1), kv[0])),
        max_members=max(0, max_members),
        utc=_utc,
        age=_age,
        placement=_placement,
        escalated=escalated,
    )
    return html.encode("utf-8")


class _LiveJson(msgspec.Struct):
    enabled: bool
    now: float
    open: int
    incidents: list[IncidentEvent]


def live_json(incidents: Sequence[IncidentEvent] | None, *, now: float, max_shown: int = MAX_SHOWN) -> bytes:
    """The page's data as JSON: ``enabled`` (false: no incident stage), ``now``, ``open`` (how many
    are open) and ``incidents`` (the first ``max_shown`` in reading order, as incident events).

    >>> live_json(None, now=5.0)
    b'{"enabled":false,"now":5.0,"open":0,"incidents":[]}'
    """
    ordered = reading_order(incidents) if incidents is not None else []
    return msgspec.json.encode(_LiveJson(incidents is not None, now, len(ordered), ordered[: max(0, max_shown)]))


def live_pages(source: Source, *, clock: Callable[[], float] = time.time) -> dict[str, Callable[[], Page]]:
    """The routes of the live view for ``pipeline.httpendpoint.HttpEndpoint(pages=...)``: each
    asks ``source`` for the open incidents when it is requested.

    >>> pages = live_pages(lambda: [], clock=lambda: 0.0)
    >>> sorted(pages), pages["/incidents.json"]()
    (['/incidents', '/incidents.json'], ('application/json', b'{"enabled":true,"now":0.0,"open":0,"incidents":[]}'))
    """

    def html() -> Page:
        return HTML, render_live(source(), now=clock())

    def data() -> Page:
        return JSON, live_json(source(), now=clock())

    return {"/incidents": html, "/incidents.json": data}
