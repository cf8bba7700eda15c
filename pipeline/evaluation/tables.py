"""The evaluation's tables as rows, rendered for a terminal (rich) or for docs (markdown)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from rich.table import Table

from pipeline.evaluation.goodput import Detection, Job, goodput, references
from pipeline.evaluation.score import Score, compare


@dataclass
class Rows:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    sections: list[int] = field(default_factory=list)  # row indexes after which a rule is drawn
    left: int = 2  # leading columns that are text

    def rich(self) -> Table:
        t = Table(title=self.title)
        for i, col in enumerate(self.columns):
            t.add_column(col, justify="left" if i < self.left else "right")
        for i, row in enumerate(self.rows):
            t.add_row(*row)
            if i in self.sections:
                t.add_section()
        return t

    def markdown(self) -> str:
        out = [
            f"**{self.title}**",
            "",
            "| " + " | ".join(self.columns) + " |",
            "|" + "|".join("---" if i < self.left else "---:" for i in range(len(self.columns))) + "|",
        ]
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(out)


def pct(x: float, digits: int = 0) -> str:
    return "-" if x != x else f"{100 * x:.{digits}f}%"


def sec(x: float) -> str:
    return "-" if x != x else f"{x:.0f} s"


def family_rows(scores: list[Score], title: str) -> Rows:
    """Per family and detector: injected, recall, precision, F1, latency, localisation, alerts."""
    r = Rows(
        title,
        [
            "family",
            "detector",
            "injected",
            "found",
            "recall",
            "precision",
            "F1",
            "latency p50",
            "p95",
            "right GPU",
            "false alerts",
            "knock-on",
        ],
    )
    fams = sorted({f for s in scores for f, fs in s.families.items() if fs.injected})
    for fam in fams:
        for s in scores:
            f = s.family(fam)
            r.rows.append(
                [
                    fam,
                    s.detector,
                    str(f.injected),
                    str(f.detected),
                    pct(f.recall),
                    pct(f.precision),
                    pct(f.f1),
                    sec(f.latency(50)),
                    sec(f.latency(95)),
                    pct(f.localisation),
                    str(f.false_alerts),
                    str(f.knock_on),
                ]
            )
        r.sections.append(len(r.rows) - 1)
    # Alerts of families nothing was injected in are all false or knock-on: show them too.
    extra = sorted({f for s in scores for f, fs in s.families.items() if not fs.injected and fs.alerts})
    for fam in extra:
        for s in scores:
            f = s.family(fam)
            if f.alerts:
                r.rows.append(
                    [
                        fam,
                        s.detector,
                        "0",
                        "0",
                        "-",
                        pct(f.precision),
                        "-",
                        "-",
                        "-",
                        "-",
                        str(f.false_alerts),
                        str(f.knock_on),
                    ]
                )
    return r


def detector_rows(scores: list[Score]) -> Rows:
    """Per detector: faults found, false alerts per 1,000 GPU-hours and what the run can rule out."""
    r = Rows(
        "Per detector",
        [
            "detector",
            "GPU-hours",
            "faults found",
            "firing alerts",
            "false alerts",
            "knock-on",
            "re-fires",
            "false / 1,000 GPU-h",
            "95% upper bound",
        ],
        left=1,
    )
    for s in scores:
        inj = sum(f.injected for f in s.families.values())
        det = sum(f.detected for f in s.families.values())
        alerts = sum(f.alerts for f in s.families.values())
        r.rows.append(
            [
                s.detector,
                f"{s.gpu_hours:,.0f}",
                f"{det}/{inj} ({pct(det / inj if inj else float('nan'))})",
                str(alerts),
                str(s.false_alerts),
                str(s.knock_on_alerts),
                str(s.refires),
                f"{s.false_per_1000_gpu_h:.2f}",
                f"{s.false_per_1000_gpu_h_upper():.2f}",
            ]
        )
    return r


def incident_rows(scores: list[Score]) -> Rows:
    """Per detector: what a fault costs in alerts and in incidents (the incident stage on the same
    alerts), faults in an incident on their host, faults whose family opened one of their own
    there, incidents that match no fault."""
    r = Rows(
        "Incidents per detector",
        [
            "detector",
            "faults",
            "firing alerts",
            "alerts / fault",
            "incidents",
            "incidents / fault",
            "faults in an incident",
            "faults with an incident of their own",
            "incidents matching no fault",
        ],
        left=1,
    )
    for s in scores:
        n = s.incident_faults
        r.rows.append(
            [
                s.detector,
                str(n),
                str(s.firing_alerts),
                f"{s.firing_alerts / n:.2f}" if n else "-",
                str(s.incidents),
                f"{s.incidents / n:.2f}" if n else "-",
                f"{s.faults_in_incident}/{n} ({pct(s.faults_in_incident / n if n else float('nan'))})",
                f"{s.faults_with_own_incident}/{n} ({pct(s.faults_with_own_incident / n if n else float('nan'))})",
                str(s.stray_incidents),
            ]
        )
    return r


def interval_rows(by_interval: dict[float, list[Score]], title: str) -> Rows:
    """Per sampling interval and detector: faults found, false alerts, re-fires, latency p50."""
    r = Rows(
        title,
        ["interval", "detector", "faults found", "firing alerts", "false alerts", "re-fires", "latency p50", "p95"],
    )
    for iv, scores in by_interval.items():
        for s in scores:
            inj = sum(f.injected for f in s.families.values())
            det = sum(f.detected for f in s.families.values())
            lat = [x for f in s.families.values() for x in f.latencies]
            r.rows.append(
                [
                    f"{iv:g} s",
                    s.detector,
                    f"{det}/{inj} ({pct(det / inj if inj else float('nan'))})",
                    str(sum(f.alerts for f in s.families.values())),
                    str(s.false_alerts),
                    str(s.refires),
                    sec(float(np.percentile(lat, 50)) if lat else float("nan")),
                    sec(float(np.percentile(lat, 95)) if lat else float("nan")),
                ]
            )
        r.sections.append(len(r.rows) - 1)
    return r


def verdicts(scores: list[Score]) -> list[str]:
    """One line per baseline: does the first detector beat it, and if not, where not."""
    ours, *others = scores
    out = []
    for o in others:
        c = compare(ours, o)
        if c.beats:
            out.append(
                f"{ours.detector} beats {o.detector}: recall and latency no worse in any family, "
                f"better in {len(c.better)} comparison(s), no more false alerts"
            )
        else:
            out.append(f"{ours.detector} does NOT beat {o.detector}: " + "; ".join(c.reasons or ["better nowhere"]))
    return out


def goodput_rows(scores: list[Score], job: Job) -> Rows:
    """Effective training time of a synchronous job watched by each detector, plus two yardsticks."""
    r = Rows(
        f"Effective training time: {job.gpus:,} GPUs, checkpoint every {job.checkpoint_interval_s:.0f} s, "
        f"restart {job.restart_cost_s:.0f} s, watchdog {job.watchdog_timeout_s:.0f} s",
        [
            "detector",
            "faults / day",
            "false restarts / day",
            "wait / fault",
            "lost: rollback",
            "restarts",
            "detecting",
            "watchdog",
            "useful",
        ],
        left=1,
    )
    dets = [Detection.from_score(s) for s in scores]
    for d in dets + references():
        g = goodput(job, d)
        wait = (g.detecting + g.hung) / g.faults_per_day * 86_400 if g.faults_per_day else 0.0
        r.rows.append(
            [
                d.name + (f" (unmeasured: {', '.join(g.unmeasured)})" if g.unmeasured else ""),
                f"{g.faults_per_day:.2f}",
                f"{g.false_restarts_per_day:.2f}",
                sec(wait),
                pct(g.rollback, 2),
                pct(g.restarts, 2),
                pct(g.detecting, 2),
                pct(g.hung, 2),
                pct(g.useful, 2),
            ]
        )
        if d is dets[-1]:
            r.sections.append(len(r.rows) - 1)
    return r
