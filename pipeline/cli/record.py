"""``gpuwarden record``: copy a Kafka topic to a JSONL file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeline.cli.args import kafka_options


def _cmd_record(args: argparse.Namespace) -> int:
    import signal as _signal

    from pipeline.bus import Topics, connection
    from pipeline.bus.kafka import topic_exists
    from pipeline.errors import InputError
    from pipeline.recording import record

    conn = connection.from_args(args)
    # A consumer whose login is refused polls empty batches until the idle timeout: an empty
    # recording that looks like a quiet topic. One login first says what is wrong.
    connection.check(conn)
    stop = {"now": False}
    _signal.signal(_signal.SIGTERM, lambda *_: stop.update(now=True))
    topic = args.topic or Topics(args.prefix).telemetry
    if not topic_exists(conn.bootstrap, topic, security=conn.options()):
        # Not an empty recording: a mistyped prefix or topic, and a consumer would create it.
        raise InputError(f"topic {topic} does not exist on {conn.bootstrap}; nothing recorded")
    res = record(
        conn.bootstrap,
        topic,
        args.out,
        idle_timeout=args.idle_timeout,
        max_messages=args.max_messages,
        security=conn.options(),
        should_stop=lambda: stop["now"],
    )
    print(f"recorded {res.messages} messages ({res.lines} lines) from {topic} to {args.out}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``gpuwarden record`` to the subcommands ``sub``."""
    rec = sub.add_parser("record", help="copy a Kafka topic to a JSONL file")
    kafka_options(rec)
    rec.add_argument("--out", required=True)
    rec.add_argument("--prefix", default="gpuwarden")
    rec.add_argument("--topic", help="default: <prefix>.telemetry")
    rec.add_argument("--idle-timeout", type=float, default=5.0, help="stop after this long without a message")
    rec.add_argument("--max-messages", type=int)
    rec.set_defaults(func=_cmd_record)
