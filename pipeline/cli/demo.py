"""``gpuwarden demo``: a simulated fleet through the in-process bus and the engine
(the driver: ``pipeline/demo.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.args import models_file, positive_float, positive_int, scenario
from pipeline.demo import DEFAULT_DURATION, DEFAULT_HOSTS, DEFAULT_SCENARIO, DEFAULT_SEED


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
    d.add_argument(
        "--hosts", type=positive_int, default=DEFAULT_HOSTS, help=f"hosts to simulate (default {DEFAULT_HOSTS})"
    )
    d.add_argument(
        "--duration",
        type=positive_float,
        default=DEFAULT_DURATION,
        help=f"seconds of event time (default {DEFAULT_DURATION:.0f})",
    )
    d.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"simulator seed (default {DEFAULT_SEED})")
    d.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help=f"built-in scenario name or a YAML file (default {DEFAULT_SCENARIO})",
    )
    d.add_argument("--rules", default=None, help="rule directory (default: the shipped packs)")
    d.add_argument("--models", default="auto", help="models.yaml, 'auto' (beside the rules) or 'none'")
    d.set_defaults(func=_cmd_demo)
