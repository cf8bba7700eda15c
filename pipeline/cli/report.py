"""``gpuwarden report``: a self-contained HTML incident report."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pipeline import progress
from pipeline.cli.args import existing, models_file
from pipeline.errors import EXIT_INPUT, UsageError
from pipeline.resources import rules_dir


def _cmd_report(args: argparse.Namespace) -> int:
    from pipeline.report import incident_page, write_page

    existing(args.telemetry, "--telemetry ")
    existing(args.alerts, "--alerts ")
    existing(args.incidents or [], "--incidents ")
    models_file(args.models)
    if args.window <= 0 or args.max_alerts < 0 or args.max_incidents < 0:
        raise UsageError(
            "--window must be positive"
            if args.window <= 0
            else f"--max-{'alerts' if args.max_alerts < 0 else 'incidents'} must not be negative"
        )
    t0 = time.monotonic()
    notes: list[str] = []
    unread: list[str] = []
    with progress.status("report") as update:
        html = incident_page(
            args.telemetry,
            args.alerts,
            rules=[args.rules or rules_dir()],
            models=args.models,
            window=args.window,
            max_alerts=args.max_alerts,
            title=args.title,
            progress=lambda s: update(f"report: {s}"),
            incident_events=args.incidents or (),
            max_incidents=args.max_incidents,
            notes_out=notes,
            unread_out=unread,
        )
    out = write_page(html, args.out)
    print(f"gpuwarden report: wrote {out} ({len(html) / 1e6:.1f} MB) in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    for note in notes:  # what the page says of its inputs, where the user looks
        print(f"gpuwarden report: {note}", file=sys.stderr)
    if unread:
        # A page made of the wrong file (two swapped) is written, but is no success.
        names = {"alerts": args.alerts, "telemetry": args.telemetry, "incidents": args.incidents or []}
        for what in unread:
            print(f"gpuwarden report: --{what} {' '.join(names[what])}: not one line could be read", file=sys.stderr)
        return EXIT_INPUT
    return 0


def register(sub: Any) -> None:
    """Add ``gpuwarden report`` to the subcommands ``sub``."""
    rp = sub.add_parser("report", help="write a self-contained HTML incident report (timeline + signals per alert)")
    rp.add_argument("--telemetry", nargs="+", required=True, metavar="FILE", help="telemetry JSONL (.gz) recordings")
    rp.add_argument("--alerts", nargs="+", required=True, metavar="FILE", help="alert events (replay --alerts-out)")
    rp.add_argument(
        "--incidents",
        nargs="+",
        metavar="FILE",
        help="incident events (replay --incidents-out): a timeline of incidents and their member alerts",
    )
    rp.add_argument("--out", required=True, help="HTML file to write")
    rp.add_argument(
        "--window",
        type=float,
        default=300.0,
        help="seconds of telemetry shown before an alert's onset and after it fired (default: %(default)s)",
    )
    rp.add_argument(
        "--max-alerts",
        type=int,
        default=50,
        help="alerts given a section with plots, most severe then earliest first (default: %(default)s)",
    )
    rp.add_argument(
        "--max-incidents",
        type=int,
        default=60,
        help="incidents drawn on the incident timeline, the most severe (all are listed; default: %(default)s)",
    )
    rp.add_argument(
        "--rules",
        default=None,
        help="the rules the alerts came from: which fields each reads (default: the shipped packs)",
    )
    rp.add_argument("--models", default="auto", help="models.yaml; 'auto': the one beside the rules; 'none'")
    rp.add_argument("--title", default="Incident report")
    rp.set_defaults(func=_cmd_report)
