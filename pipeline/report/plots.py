"""The report's figures (matplotlib), each returned as a ``data:image/png;base64`` URI.

Figures are built with the object API on an explicit Agg canvas, never through pyplot: no
global backend or figure registry is touched, so this works headless, in threads and inside a
process that has its own matplotlib set-up.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, overload

import matplotlib
import numpy as np
from matplotlib import dates as mdates
from matplotlib import ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.catalog import BITMASK, CODE, COUNTER, FIELDS, STATE
from pipeline.recordchecks import MAX_ID_LEN
from pipeline.report.alerts import SEVERITY_RANK, Incident
from pipeline.report.incidents import IncidentSpan
from pipeline.report.signals import DCGM, NCCL, PRESENCE, Signal
from pipeline.report.telemetry import Telemetry

if TYPE_CHECKING:
    from pipeline.evaluation.score import Score

# Plot colours. The page's CSS never paints with these, so a screenshot that shows them shows
# a figure that loaded (tests/integration/test_report_render.py relies on it).
SEVERITY_COLOURS = {"critical": "#c0392b", "error": "#c0392b", "warning": "#e08e0b", "info": "#2e86c1"}
OTHER_SEVERITY = "#7f8c8d"
ALERTED = "#d62728"
PEERS = "#8a99a8"
HOST_LEVEL = "#2c3e50"
ONSET = "#5d6d7e"
FIRED = "#111111"
RESOLVED = "#1e8449"
ESCALATION = "#6a1b9a"  # an incident's action climbing, on the incident timeline
DPI = 100

# Applied per figure (rc_context), never to the process-wide rcParams.
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    # Host names, faults, communicators and evidence keys are drawn as they are: a ``$`` in one
    # is text, not mathtext, which a host named ``n$\foo$`` would make fail the whole report.
    "text.parse_math": False,
}


# Characters of a string from the data drawn in a figure: a figure grows with its labels, and a
# 1.2-million-character host or severity made an image too wide for Agg (the whole report failed).
MAX_DRAWN = MAX_ID_LEN


def as_drawn(text: str, width: int = MAX_DRAWN) -> str:
    """``text`` as a figure shows it: on one line (a control character is drawn as U+FFFD, since a
    label of 100,000 newlines is as tall as one of 100,000 characters is wide), cut to ``width``.

    >>> as_drawn("n0\\nn1"), as_drawn("x" * 10, 5)
    ('n0�n1', 'xxxx…')
    """
    text = text[: width + 1]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\ufffd" for c in text)
    return text if len(text) <= width else text[: width - 1] + "…"


def styled(fn):
    """Run a figure builder under the report's style."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return fn(*args, **kwargs)

    return wrapper


@overload
def _x(ts: float) -> float: ...
@overload
def _x(ts: np.ndarray) -> np.ndarray: ...


def _x(ts: np.ndarray | float) -> np.ndarray | float:
    """Epoch seconds -> matplotlib date numbers (days since 1970-01-01, the default epoch)."""
    return np.asarray(ts, dtype=float) / 86400.0 if not isinstance(ts, float) else ts / 86400.0


def _time_axis(ax) -> None:
    loc = mdates.AutoDateLocator(minticks=4, maxticks=10)
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))


def to_data_uri(fig: Figure) -> str:
    """PNG bytes of ``fig`` as a data URI (the page stays one self-contained file)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def severity_colour(sev: str) -> str:
    return SEVERITY_COLOURS.get(sev, OTHER_SEVERITY)


def severity_legend(severities: Sequence[str]) -> list[tuple[str, str]]:
    """(colour, label) of each severity in a legend, the unknown ones as one entry (they share
    its colour): a legend entry each made 20,000 invented severities one figure too wide to draw.

    >>> severity_legend(["critical", "x", "y"])
    [('#c0392b', 'critical'), ('#7f8c8d', 'x, y')]
    """
    known = [(severity_colour(s), s) for s in severities if s in SEVERITY_COLOURS]
    other = [s for s in severities if s not in SEVERITY_COLOURS]
    if other:
        known.append((OTHER_SEVERITY, as_drawn(", ".join(other[:4]), 64) + (" …" if len(other) > 4 else "")))
    return known


# -- the timeline --------------------------------------------------------------------------------


@dataclass
class Timeline:
    uri: str
    hosts_shown: int
    hosts_left_out: int


def _label(inc: Incident) -> str:
    gpu = f"GPU {inc.event.gpu} " if inc.event.gpu is not None else ""
    return f"#{inc.number} {gpu}{as_drawn(inc.event.fault, 64)}" if inc.number else ""


def _lanes(spans: list[tuple[float, float]], gap: float, max_lanes: int) -> list[int]:
    """Greedy lane per (start, occupied-until) span so bars and labels of one host never overlap
    while lanes last; past ``max_lanes`` the lane that frees first is shared."""
    ends: list[float] = []
    out = []
    for start, until in spans:
        for i, e in enumerate(ends):
            if start >= e + gap:
                ends[i] = until
                out.append(i)
                break
        else:
            if len(ends) < max_lanes:
                ends.append(until)
                out.append(len(ends) - 1)
            else:
                i = int(np.argmin(ends))
                ends[i] = max(ends[i], until)
                out.append(i)
    return out


def _bars(ax, bars: list[tuple[float, float, float, str]], *, height: float = 0.8, **style: Any) -> None:
    """Horizontal bars (left, width in seconds, bottom, colour) as one collection on ``ax``: what
    ``barh`` draws, without a patch object each."""
    if not bars:
        return
    from matplotlib.collections import PolyCollection

    left = _x(np.array([b[0] for b in bars], dtype=float))
    right = left + _x(np.array([b[1] for b in bars], dtype=float))
    bottom = np.array([b[2] for b in bars], dtype=float)
    verts = np.stack(
        [
            np.column_stack(p)
            for p in ((left, bottom), (left, bottom + height), (right, bottom + height), (right, bottom))
        ],
        axis=1,
    )
    ax.add_collection(PolyCollection(list(verts), facecolors=[b[3] for b in bars], **style))


@styled
def timeline(
    incidents: list[Incident], t_start: float, t_end: float, *, max_hosts: int = 40, max_lanes: int = 16
) -> Timeline:
    """One row per host, one bar per alert from onset to resolution (or the end of the data).

    The pending part (onset to firing, a rule's ``for:``) is drawn pale; numbers label the
    alerts that have a section of their own.
    """
    by_host: dict[str, list[Incident]] = {}
    for inc in incidents:
        by_host.setdefault(inc.event.host or "(no host)", []).append(inc)
    hosts = sorted(by_host)
    left_out = 0
    if len(hosts) > max_hosts:
        ranked = sorted(
            hosts, key=lambda h: (min(SEVERITY_RANK.get(i.severity, 9) for i in by_host[h]), -len(by_host[h]), h)
        )
        hosts = sorted(ranked[:max_hosts])
        left_out = len(by_host) - max_hosts
    t_end = max(t_end, t_start + 60.0)  # a single instant still gets a readable axis
    span = t_end - t_start
    char = 0.0048 * span  # one label character at fontsize 7 across an 11-inch axis, in seconds

    def occupied(i: Incident) -> tuple[float, float]:
        w = char * (len(_label(i)) + 1)
        if i.started_at + w > t_end:  # no room on the right: the label goes left of the bar
            return i.started_at - w, i.end(t_end)
        return i.started_at, max(i.end(t_end), i.started_at + w)

    lanes = {h: _lanes([occupied(i) for i in by_host[h]], 0.01 * span, max_lanes) for h in hosts}
    rows = sum(max(lanes[h], default=0) + 1 for h in hosts) or 1
    fig = Figure(figsize=(11.5, 0.9 + 0.28 * rows + 0.25 * len(hosts)))
    ax = fig.add_subplot()
    ax.grid(axis="y", visible=False)
    y = 0.0
    ticks, labels = [], []
    # (left, width, bottom, colour) of each bar: drawn as two collections, since a patch a bar
    # cost ~2 ms each (100,000 alerts took 46 s to plot).
    pending: list[tuple[float, float, float, str]] = []
    fired: list[tuple[float, float, float, str]] = []
    for k, h in enumerate(hosts):
        n = max(lanes[h], default=0) + 1
        top = y + n + 0.6
        if k % 2 == 0:
            ax.axhspan(y, top, color="#f2f4f6", zorder=0, lw=0)
        for inc, lane in zip(by_host[h], lanes[h]):
            yy = y + 0.3 + lane
            col = severity_colour(inc.severity)
            pend = max(inc.fired_at - inc.started_at, 0.0)
            if pend > 0:
                pending.append((inc.started_at, pend, yy, col))
            fired.append((inc.fired_at, max(inc.end(t_end) - inc.fired_at, span / 400), yy, col))
            if inc.number:
                what = _label(inc)
                inside = inc.end(t_end) - inc.started_at > char * (len(what) + 2)
                left = not inside and inc.started_at + char * (len(what) + 1) > t_end
                ax.text(
                    _x(inc.started_at + (-1 if left else 1) * span / 300),
                    yy + 0.4,
                    what,
                    va="center",
                    ha="right" if left else "left",
                    fontsize=7,
                    color="white" if inside else "black",
                    fontweight="bold" if inside else "normal",
                    clip_on=True,
                )
        ticks.append(y + (n + 0.6) / 2)
        labels.append(as_drawn(h))
        y = top
    _bars(ax, pending, alpha=0.35, lw=0)
    _bars(ax, fired, edgecolor="white", lw=0.6)  # a white edge keeps back-to-back alerts of one severity apart
    ax.set_yticks(ticks, labels)
    ax.set_ylim(y, 0)
    ax.set_xlim(_x(t_start), _x(t_end))
    _time_axis(ax)
    ax.set_xlabel("event time (UTC)")
    sev_seen = sorted({i.severity for h in hosts for i in by_host[h]}, key=lambda s: SEVERITY_RANK.get(s, 9))
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=text) for c, text in severity_legend(sev_seen)]
    handles.append(Patch(color=OTHER_SEVERITY, alpha=0.35, label="pending (onset → fired)"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), frameon=False, fontsize=8)
    return Timeline(to_data_uri(fig), len(hosts), left_out)


# -- the incident timeline -----------------------------------------------------------------------


@dataclass
class IncidentTimeline:
    uri: str
    shown: int
    left_out: int


def _incident_label(s: IncidentSpan, width: int = 46) -> str:
    where = (s.host or "(no host)") + (f" GPU {s.gpu}" if s.gpu is not None else "")
    return as_drawn(f"{where} · {s.root.fault}", width)


@styled
def incident_timeline(
    spans: list[IncidentSpan], t_start: float, t_end: float, *, left_out: int = 0
) -> IncidentTimeline:
    """One row per incident (``spans`` in the order given, top to bottom), a bar from opened to
    resolved (or the end of the data, marked ▸), coloured by its severity at each moment; a
    marker where its action escalated; labelled with its first id characters and alert count."""
    t_end = max(t_end, t_start + 60.0)
    span = t_end - t_start
    n = max(len(spans), 1)
    fig = Figure(figsize=(11.5, 1.0 + 0.32 * n))
    ax = fig.add_subplot()
    ax.grid(axis="y", visible=False)
    # (left, width, bottom, colour) of each severity's stretch: one collection, since a bar and a
    # marker an event cost ~2 ms each (an incident of 100,000 updates took minutes to plot).
    bars: list[tuple[float, float, float, str]] = []
    for row, s in enumerate(spans):
        y = row + 0.5
        if row % 2 == 0:
            ax.axhspan(row, row + 1, color="#f2f4f6", zorder=0, lw=0)
        end = s.end(t_end)
        cuts = [*s.severities[1:], (end, "")]
        for (t0, sev), (t1, _) in zip(s.severities, cuts):
            t0, t1 = max(t0, s.opened_at), max(t1, t0)
            bars.append((t0, max(t1 - t0, span / 600), y - 0.31, severity_colour(sev)))
        if s.escalations:
            ax.plot(
                _x(np.array([e.ts for e in s.escalations], dtype=float)),
                np.full(len(s.escalations), y - 0.42),
                ls="",
                marker="v",
                ms=7,
                color=ESCALATION,
                mec="white",
                mew=0.6,
                zorder=4,
            )
        if s.resolved_at is None:
            ax.plot(_x(end), y, marker=">", ms=6, color=FIRED, zorder=4, clip_on=False)
        what = f"{as_drawn(s.id[:12])} · {s.n_members} alert{'s' if s.n_members != 1 else ''}"
        inside = end - s.opened_at > 0.0048 * span * (len(what) + 2)
        ax.text(
            _x(s.opened_at + span / 300),
            y,
            what,
            va="center",
            ha="left",
            fontsize=7,
            color="white" if inside else "black",
            fontweight="bold" if inside else "normal",
            clip_on=True,
        )
    _bars(ax, bars, height=0.62, lw=0)
    ax.set_yticks([r + 0.5 for r in range(len(spans))], [_incident_label(s) for s in spans], fontsize=8)
    ax.set_ylim(n, 0)
    ax.set_xlim(_x(t_start), _x(t_end))
    _time_axis(ax)
    ax.set_xlabel("event time (UTC)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    sev_seen = sorted({sev for s in spans for _, sev in s.severities}, key=lambda v: SEVERITY_RANK.get(v, 9))
    handles: list = [Patch(color=c, label=text) for c, text in severity_legend(sev_seen)]
    if any(s.escalations for s in spans):
        handles.append(Line2D([], [], ls="", marker="v", color=ESCALATION, label="action escalated"))
    if any(s.resolved_at is None for s in spans):
        handles.append(Line2D([], [], ls="", marker=">", color=FIRED, label="still open at the end"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), frameon=False, fontsize=8)
    return IncidentTimeline(to_data_uri(fig), len(spans), left_out)


# -- one alert's signals -------------------------------------------------------------------------


def _series(sig: Signal, values: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, str, bool]:
    """(ts, y, y-label, step) for one signal: counters become per-second rates."""
    f = FIELDS.by_alias(sig.name) if sig.source == DCGM else None
    if f is not None and f.kind == COUNTER:
        if len(ts) < 2:
            return ts[:0], values[:0], sig.name, False
        dt = np.diff(ts)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.diff(values) / np.where(dt > 0, dt, np.nan)
        rate[rate < 0] = np.nan  # a counter reset (driver reload), not negative errors
        if f.unit == "ns":
            return ts[1:], rate / 1e7, f"{sig.name}\n(% of time)", False
        return ts[1:], rate, f"{sig.name}\n(per s)", False
    step = f is not None and f.kind in (BITMASK, CODE, STATE)
    unit = f" ({f.unit})" if f is not None and f.unit else ""
    return ts, values, f"{sig.name}{unit}", step


def _break_gaps(x: np.ndarray, y: np.ndarray, interval: float) -> tuple[np.ndarray, np.ndarray]:
    """NaN after each silence longer than three sampling intervals: a gap is drawn as a gap,
    not as a straight line across it."""
    if len(x) < 2:
        return x, y
    cut = np.flatnonzero(np.diff(x) > 3 * interval)
    if not len(cut):
        return x, y
    return np.insert(x, cut + 1, x[cut] + interval), np.insert(y.astype(float), cut + 1, np.nan)


def bit_names(value: float) -> str:
    """A clock-event-reasons bitmask as dcgm-exporter's labels: ``104`` -> ``hw_slowdown|sw_thermal|hw_thermal``."""
    if value != value:
        return "?"
    v = int(value)
    names = [b.label for b in sorted(FIELDS.bits.values(), key=lambda b: b.mask) if v & b.mask]
    return "|".join(names) if names else "none"


def _bitmask_ticks(ax, values: np.ndarray) -> None:
    seen = np.unique(values[np.isfinite(values)])
    if 0 < len(seen) <= 5:
        ax.set_yticks(seen, [f"{int(v)} {bit_names(v)}" for v in seen], fontsize=7)


def _presence(ts: np.ndarray, lo: float, hi: float, interval: float) -> tuple[np.ndarray, np.ndarray]:
    width = max(5 * interval, (hi - lo) / 60.0)
    edges = np.arange(lo, hi + width, width)
    counts, _ = np.histogram(ts, bins=edges)
    return edges[:-1], counts.astype(float)


@styled
def alert_figure(inc: Incident, signals: Sequence[Signal], tel: Telemetry, window: float) -> str | None:
    """Each signal around the alert: the alerted GPU in red over its host's other GPUs (grey),
    onset, firing and resolution marked. None when the telemetry has nothing of the host."""
    ev = inc.event
    host, gpu = ev.host, ev.gpu
    lo = inc.started_at - window
    hi = inc.fired_at + window
    if tel.t_max == tel.t_max:
        lo, hi = max(lo, tel.t_min), min(hi, tel.t_max)
        hi = max(hi, lo + 1.0)
    gpus = tel.host_gpus(host) if host else []
    comm = ev.evidence.get("comm") if isinstance(ev.evidence.get("comm"), str) else None
    has_nccl = any(tel.nccl) and any(s.source == NCCL for s in signals)
    if not gpus and not has_nccl:
        return None
    fig = Figure(figsize=(11.5, 0.7 + 1.55 * len(signals)))
    axes = fig.subplots(len(signals), 1, sharex=True, squeeze=False)[:, 0]
    ranks: set[tuple[str, int]] = set()
    for ax, sig in zip(axes, signals):
        drawn = 0
        focus = np.zeros(0)
        if sig.source == NCCL:
            comms = [comm] if comm else tel.host_comms(host or "", gpu)[:1]
            lines = [(key, tel.nccl[key]) for c in comms for key in tel.nccl if key[0] == c]
            label = f"NCCL {sig.name}" + (f"\ncomm {comms[0][:10]}" if comms else "")
            for (c, h, g), s in sorted(lines, key=lambda kv: (kv[0][1], kv[0][2]) == (host, gpu)):
                m = (s.ts >= lo) & (s.ts <= hi)
                me = h == host and g == gpu
                ranks.add((h, g))
                ax.plot(
                    _x(s.ts[m]),
                    s.values[sig.name][m],
                    color=ALERTED if me else PEERS,
                    lw=1.8 if me else 0.8,
                    alpha=1 if me else 0.6,
                    zorder=3 if me else 2,
                )
                drawn += int(m.any())
            ax.set_ylabel(label)
        else:
            order = sorted(gpus, key=lambda g: g == gpu)  # the alerted GPU last: drawn on top
            for i, g in enumerate(order):
                gs = tel.gpus[(host or "", g)]  # gpus is empty unless host is set
                m = (gs.ts >= lo) & (gs.ts <= hi)
                if sig.source == PRESENCE:
                    x, y = _presence(gs.ts[m], lo, hi, tel.interval)
                    ylab, step = f"samples per {max(5 * tel.interval, (hi - lo) / 60):.0f}s", True
                else:
                    x, y, ylab, step = _series(sig, gs.values[sig.name][m], gs.ts[m])
                if not np.isfinite(y).any():
                    continue
                if sig.source != PRESENCE:
                    x, y = _break_gaps(x, y, tel.interval)
                me = g == gpu
                col = ALERTED if me else (HOST_LEVEL if gpu is None else PEERS)
                ax.plot(
                    _x(x),
                    y,
                    color=col,
                    lw=1.8 if me else 0.9,
                    alpha=1 if me else 0.7,
                    drawstyle="steps-post" if step else "default",
                    zorder=3 if me else 2,
                    label=f"GPU {g}" + (" (alerted)" if me else ""),
                )
                drawn += 1
                if me or (gpu is None and drawn == 1):
                    focus = y
            ax.set_ylabel(ylab if gpus else sig.name)
            f = FIELDS.by_alias(sig.name) if sig.source == DCGM else None
            if drawn and f is not None and f.kind == BITMASK:
                _bitmask_ticks(ax, focus)
        if not drawn:
            ax.text(
                0.5,
                0.5,
                f"{sig.name}: not reported in this window",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#666",
            )
        ax.yaxis.label.set_fontsize(8)
        ax.axvspan(
            _x(inc.started_at),
            _x(inc.resolved_at if inc.resolved_at is not None else hi),
            color=severity_colour(inc.severity),
            alpha=0.07,
            lw=0,
        )
        ax.axvline(_x(inc.started_at), color=ONSET, ls="--", lw=1)
        ax.axvline(_x(inc.fired_at), color=FIRED, lw=1.1)
        if inc.resolved_at is not None and inc.resolved_at <= hi:
            ax.axvline(_x(inc.resolved_at), color=RESOLVED, ls=":", lw=1.3)
    ax0 = axes[0]
    ax0.set_xlim(_x(lo), _x(hi))
    _time_axis(axes[-1])
    axes[-1].set_xlabel("event time (UTC)")
    from matplotlib.lines import Line2D

    where = f"GPU {gpu} (alerted)" if gpu is not None else "host-level alert: each GPU of the host"
    handles = [Line2D([], [], color=ALERTED if gpu is not None else HOST_LEVEL, lw=1.8, label=where)]
    if gpu is not None and len(gpus) > 1 and any(s.source != NCCL for s in signals):
        handles.append(
            Line2D([], [], color=PEERS, lw=0.9, label=f"other GPUs of {as_drawn(host or '')} ({len(gpus) - 1})")
        )
    if len(ranks - {(host, gpu)}):
        handles.append(
            Line2D([], [], color=PEERS, lw=0.9, label=f"other ranks of the communicator ({len(ranks - {(host, gpu)})})")
        )
    handles += [Line2D([], [], color=ONSET, ls="--", label="onset"), Line2D([], [], color=FIRED, lw=1.1, label="fired")]
    if inc.resolved_at is not None and inc.resolved_at <= hi:
        handles.append(Line2D([], [], color=RESOLVED, ls=":", lw=1.3, label="resolved"))
    ax0.legend(
        handles=handles, loc="lower left", bbox_to_anchor=(0, 1.02), ncol=len(handles), frameon=False, fontsize=8
    )
    fig.align_ylabels(axes)
    return to_data_uri(fig)


# -- evaluation ----------------------------------------------------------------------------------


@styled
def latency_cdf(scores: Sequence["Score"], max_facets: int = 9) -> str | None:
    """Per fault family (plus all together): the share of injected faults each detector had
    alerted on within t seconds of onset. A curve's plateau is the detector's recall."""
    fams = sorted({f for s in scores for f, fs in s.families.items() if fs.injected})
    if not fams:
        return None
    facets = ["all families", *fams][:max_facets]
    ncols = min(3, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig = Figure(figsize=(11.5, 0.8 + 2.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).ravel()
    palette = matplotlib.colormaps["tab10"]
    tmax = max([max(fs.latencies) for s in scores for fs in s.families.values() if fs.latencies] or [1.0])
    for ax, facet in zip(axes, facets):
        for i, s in enumerate(scores):
            chosen = [fs for f, fs in s.families.items() if facet == "all families" or f == facet]
            injected = sum(fs.injected for fs in chosen)
            lat = np.sort([x for fs in chosen for x in fs.latencies])
            if not injected:
                continue
            x = np.concatenate([[0.0], lat, [tmax * 1.5]])
            y = np.concatenate([[0.0], np.arange(1, len(lat) + 1) / injected, [len(lat) / injected]])
            ax.plot(x, y, drawstyle="steps-post", color=palette(i % 10), lw=1.8, label=s.detector)
        total = (
            max((s.families[facet].injected for s in scores if facet in s.families), default=0)
            if facet != "all families"
            else None
        )
        ax.set_title(facet + (f" ({total} injected)" if total is not None else ""))
        ax.set_xscale("symlog", linthresh=1.0)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlim(0, tmax * 1.5)
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(ticker.PercentFormatter(1.0))
    for ax in axes[len(facets) :]:
        ax.set_visible(False)
    for ax in axes[-ncols:]:
        ax.set_xlabel("seconds from onset to first alert")
    for ax in axes[::ncols]:
        ax.set_ylabel("faults detected")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper left", ncol=len(scores), frameon=False)
    return to_data_uri(fig)
