"""``gpuwarden sim``: the simulated fleet to a file or to Kafka."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pipeline.cli.args import kafka_options, positive_float, positive_int, scenario
from pipeline.errors import UsageError


def _cmd_sim(args: argparse.Namespace) -> int:
    from producers.sim import SimSource, Simulator

    from pipeline.bus import FileSink, Topics, connection
    from pipeline.schema import encode

    if bool(args.out) == connection.wanted(args):
        raise UsageError("give exactly one of --out FILE or --kafka BOOTSTRAP / --kafka-config FILE")
    conn = connection.from_args(args) if not args.out else None
    sim = Simulator(
        hosts=args.hosts,
        duration=args.duration,
        interval=args.interval,
        seed=args.seed,
        scenario=scenario(args.scenario),
    )
    topic = Topics(args.prefix).telemetry
    if conn is not None:
        from pipeline.bus.kafka import ensure_topics

        connection.check(conn)
        ensure_topics(conn.bootstrap, Topics(args.prefix), security=conn.options(), timeout_s=15.0)
    source = SimSource(sim, speed=1.0 if args.realtime else None)
    if conn is not None:
        n = _sim_to_kafka(source, conn, topic, args.encoding)
    else:
        with FileSink(args.out, atomic=True) as sink:
            while not source.done:
                sink.write_many(encode(r) for r in source.poll())
        n = source.records
    if args.labels_out:
        doc = {
            "scenario": args.scenario,
            "seed": args.seed,
            "hosts": sim.hosts,
            "interval": args.interval,
            "start_ts": sim.start_ts,
            "duration": args.duration,
            "faults": sim.labels(),
        }
        Path(args.labels_out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    dest = args.out if conn is None else f"{topic} on {conn.bootstrap}"
    print(f"gpuwarden sim: {n} records from {args.hosts} hosts over {args.duration:.0f}s -> {dest}", file=sys.stderr)
    return 0


def _sim_to_kafka(source: Any, conn: Any, topic: str, encoding: str = "columnar") -> int:
    """Publish the simulator through the producers' bounded sender and Kafka sink (one message
    per host per step); the number of records delivered, or an error if any were not."""
    from producers.common import BoundedSender, KafkaSink, run

    from pipeline.errors import BrokerUnavailableError

    # A whole step per delivery, so each host's step is one message; kafka-python's own limits
    # (60 s) as the send timeout, as the simulator had before it shared the producers' sender.
    step = max(20_000, 4 * source.sim.n_gpus)
    sink = KafkaSink(
        conn.bootstrap, topic, send_timeout_s=60.0, security=conn.options(), ensure=False, encoding=encoding
    )
    sender = BoundedSender(sink, max_records=max(200_000, 10 * step), max_batch=step)
    res = run(source, sender, interval_s=0.0, drain_s=15.0)
    lost = res.records - res.sender.sent
    if lost:
        raise BrokerUnavailableError(f"{lost} of {res.records} records not delivered to {topic} on {conn.bootstrap}")
    return res.sender.sent


def register(sub: Any) -> None:
    """Add ``gpuwarden sim`` to the subcommands ``sub``."""
    s = sub.add_parser("sim", help="simulate a GPU fleet (with labelled fault injection)")
    s.add_argument("--hosts", type=positive_int, default=4)
    s.add_argument("--duration", type=positive_float, default=600.0, help="seconds of event time")
    s.add_argument("--interval", type=positive_float, default=1.0, help="seconds between samples")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scenario", default="healthy", help="built-in scenario name or a YAML file")
    s.add_argument("--out", help="JSONL file to write (.gz to compress)")
    kafka_options(s, "publish to <prefix>.telemetry on this broker")
    s.add_argument("--prefix", default="gpuwarden", help="topic prefix")
    s.add_argument("--labels-out", help="write the injected-fault labels (JSON) here")
    s.add_argument("--realtime", action="store_true", help="pace output to event time")
    s.add_argument(
        "--encoding",
        choices=("columnar", "json"),
        default="columnar",
        help="with --kafka: message encoding, columnar (docs/architecture.md §7) or json (default %(default)s)",
    )
    s.set_defaults(func=_cmd_sim)
