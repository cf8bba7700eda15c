"""``gpuwarden eval``: score the detectors and the baselines on labelled scenarios."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any, Callable

from pipeline import progress
from pipeline.cli.args import positive_float, positive_int, scenario
from pipeline.errors import UsageError


def _eval_progress(update: Callable[[str], None], scenario: str, interval: float, status: str) -> None:
    update(f"evaluating {scenario} at {interval:g} s: {status}")


def _cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pipeline.evaluation.goodput import Job
    from pipeline.evaluation.run import evaluate
    from pipeline.evaluation.tables import (
        detector_rows,
        family_rows,
        goodput_rows,
        incident_rows,
        interval_rows,
        verdicts,
    )

    console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    if any(i <= 0 for i in args.interval):
        raise UsageError("--interval must be positive")
    by_interval = {}
    with progress.status("evaluating") as update:
        for iv in args.interval:
            by_interval[iv] = evaluate(
                scenario(args.scenario),
                seeds=args.seeds,
                hosts=args.hosts,
                duration=args.duration,
                interval=iv,
                progress=functools.partial(_eval_progress, update, args.scenario, iv),
            )
    job = Job(
        gpus=args.job_gpus,
        checkpoint_interval_s=args.checkpoint_interval,
        restart_cost_s=args.restart_cost,
        watchdog_timeout_s=args.watchdog_timeout,
    )
    md: list[str] = []
    for iv, scores in by_interval.items():
        title = f"{args.scenario}: {args.seeds} seed(s) x {args.hosts * 8} GPUs x {args.duration:.0f} s, sampled every {iv:g} s"
        tables = [family_rows(scores, title), detector_rows(scores), goodput_rows(scores, job), incident_rows(scores)]
        lines = verdicts(scores)
        if args.html:
            from pipeline.report import eval_page, write_page

            html = args.html if len(by_interval) == 1 else str(args.html).replace(".html", "") + f"-{iv:g}s.html"
            out = write_page(eval_page(scores, title, subtitle="; ".join(lines)), html)
            err.print(f"gpuwarden eval: wrote {out} (latency CDF and per-family table)")
        if args.markdown:
            md.append(
                "\n\n".join(t.markdown() for t in tables[:2])
                + "\n\n"
                + "\n".join(f"- {v}" for v in lines)
                + "\n\n"
                + tables[2].markdown()
                + "\n\n"
                + tables[3].markdown()
            )
            continue
        console.print(tables[0].rich())
        console.print(tables[1].rich())
        for v in lines:
            console.print(v, markup=False, highlight=False)
        console.print(tables[2].rich())
        console.print(tables[3].rich())
    if len(by_interval) > 1:
        summary = interval_rows(by_interval, f"{args.scenario}: per sampling interval")
        if args.markdown:
            md.append(summary.markdown())
        else:
            console.print(summary.rich())
    if args.markdown:
        console.print("\n\n".join(md), markup=False, highlight=False, soft_wrap=True)
    return 0


def register(sub: Any) -> None:
    """Add ``gpuwarden eval`` to the subcommands ``sub``."""
    ev = sub.add_parser("eval", help="score detectors (ours and two baselines) on labelled scenarios")
    ev.add_argument("--scenario", default="llama3", help="built-in scenario name or a YAML file")
    ev.add_argument("--seeds", type=positive_int, default=5, help="runs with seeds 1..N (default: %(default)s)")
    ev.add_argument("--hosts", type=positive_int, default=8)
    ev.add_argument("--duration", type=positive_float, default=3600.0)
    ev.add_argument(
        "--interval",
        type=positive_float,
        nargs="+",
        default=[1.0],
        metavar="S",
        help="sampling interval(s) in seconds; several: one set of tables each plus a summary "
        "per interval (default: %(default)s)",
    )
    ev.add_argument(
        "--job-gpus", type=int, default=16_384, help="training job size for the effective-training-time table"
    )
    ev.add_argument("--checkpoint-interval", type=float, default=1800.0, help="seconds between the job's checkpoints")
    ev.add_argument(
        "--restart-cost", type=float, default=600.0, help="seconds to restart the job after an interruption"
    )
    ev.add_argument(
        "--watchdog-timeout",
        type=float,
        default=600.0,
        help="seconds a missed fault hangs the job (PyTorch's NCCL default: 600)",
    )
    ev.add_argument("--markdown", action="store_true", help="print markdown tables (for docs/evaluation.md)")
    ev.add_argument("--html", metavar="FILE", help="also write an HTML page: latency CDF per family, per-family table")
    ev.set_defaults(func=_cmd_eval)
