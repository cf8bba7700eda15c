"""``gpuwarden topics``: create the project's Kafka topics."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.args import kafka_options


def _cmd_topics(args: argparse.Namespace) -> int:
    from pipeline.bus import Topics, connection
    from pipeline.bus.kafka import ensure_topics

    conn = connection.from_args(args)
    connection.check(conn)
    created = ensure_topics(
        conn.bootstrap,
        Topics(args.prefix),
        partitions=args.partitions,
        security=conn.options(),
        timeout_s=15.0,
        fleet_partitions=args.fleet_partitions,
    )
    print("created: " + (", ".join(created) or "nothing (all exist)"))
    return 0


def register(sub: Any) -> None:
    """Add ``gpuwarden topics`` to the subcommands ``sub``."""
    t = sub.add_parser("topics", help="create the project's Kafka topics")
    kafka_options(t)
    t.add_argument("--prefix", default="gpuwarden")
    t.add_argument("--partitions", type=int, default=8, help="partitions of each topic (default 8)")
    t.add_argument(
        "--fleet-partitions",
        type=int,
        help="partitions of <prefix>.fleet, the fleet stage's input (default: --partitions)",
    )
    t.set_defaults(func=_cmd_topics)
