"""``gpuwarden demo``: a simulated fleet through the in-process bus and the engine."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.args import models_file, positive_float, positive_int, scenario


def _cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.demo import run_demo

    return run_demo(
        hosts=args.hosts,
        duration=args.duration,
        seed=args.seed,
        scenario=scenario(args.scenario),
        rules=args.rules,
        models=models_file(args.models),
    )


def register(sub: Any) -> None:
    """Add ``gpuwarden demo`` to the subcommands ``sub``."""
    d = sub.add_parser("demo", help="simulated fleet -> in-process bus -> engine -> alerts -> incidents")
    d.add_argument("--hosts", type=positive_int, default=8)
    d.add_argument("--duration", type=positive_float, default=1500.0)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--scenario", default="mixed")
    d.add_argument("--rules", default=None, help="rule directory (default: the shipped packs)")
    d.add_argument("--models", default="auto", help="models.yaml, 'auto' (beside the rules) or 'none'")
    d.set_defaults(func=_cmd_demo)
