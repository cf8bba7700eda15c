"""``gpuwarden replay``: recorded telemetry through the detectors, or into Kafka."""

from __future__ import annotations

import argparse
import os
import stat
import time
from typing import Any

from pipeline import progress
from pipeline.bus.files import merge_group_size
from pipeline.cli.args import models_file, positive_int
from pipeline.errors import EXIT_INPUT, InputError, UsageError
from pipeline.resources import rules_dir


def readable(paths: list[str]) -> list[str]:
    """``paths`` when each is ``-`` (stdin) or something to read lines from: a file, a FIFO or a
    process substitution (``<(zcat a.gz)``), a device; else an input error naming the first that
    is not, said before anything is replayed.

    >>> readable(["-"])
    ['-']
    """
    for p in paths:
        if p == "-":
            continue
        try:
            mode = os.stat(p).st_mode
        except FileNotFoundError:
            raise InputError(f"{p}: no such file") from None
        except OSError as e:
            raise InputError(f"{p}: {e.strerror or e}") from None
        if stat.S_ISDIR(mode):
            raise InputError(f"{p}: a directory, not a recording (name its files)")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise InputError(f"{p}: not a file")
        if not os.access(p, os.R_OK):
            raise InputError(f"{p}: permission denied")
    return paths


def _cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pipeline.detection import build_detector
    from pipeline.engine.engine import MOVED
    from pipeline.replay import replay
    from pipeline.rules.loader import describe_loaded, no_rules_warnings, without_rule_files
    from pipeline.rules.ruleset import RuleSet

    # soft_wrap: a line is never cut at rich's 80 columns in a pipe (a file:line:col error, a
    # summary someone greps); a terminal wraps what is too long for it by itself.
    console = Console(stderr=True, soft_wrap=True)
    _options_apply(args)
    readable(args.files)
    if args.to_kafka:
        from pipeline.bus import Topics, connection
        from pipeline.bus.kafka import ensure_topics
        from pipeline.recording import publish

        speed = None if args.speed in (None, "max") else float(args.speed)
        conn = connection.resolve(bootstrap=args.to_kafka, config_file=args.kafka_config)
        connection.check(conn)
        ensure_topics(conn.bootstrap, Topics(args.prefix), security=conn.options(), timeout_s=15.0)
        t0 = time.monotonic()
        unread: list[str] = []
        n = publish(
            args.files,
            conn.bootstrap,
            Topics(args.prefix).telemetry,
            speed=speed,
            security=conn.options(),
            problems=unread,
        )
        console.print(
            f"published {n} messages to {Topics(args.prefix).telemetry} on {conn.bootstrap} "
            f"in {time.monotonic() - t0:.1f}s"
        )
        return _name_unread(args, console, unread)
    rules = args.rules or str(rules_dir())
    if without_rule_files([rules]):  # a wrong --rules would replay through the built-in checks alone
        raise InputError(f"--rules {rules}: no rule files (*.yaml, *.yml) in this directory; nothing replayed")
    engine, diags = build_detector([rules], models_file(args.models), shards=args.fleet_shards)
    if engine is not None and isinstance(engine.rules, RuleSet):  # an empty rule file, as `rules check` warns
        diags = [*diags, *no_rules_warnings(engine.rules)]
    for d in diags:
        console.print(str(d), highlight=False, markup=False)
    if engine is None:
        raise InputError(f"rules in {rules} do not load; nothing replayed")
    console.print("loaded " + describe_loaded(engine.rules, engine.models, rules), highlight=False, markup=False)
    stage = None
    if args.incidents_out:
        from pipeline.incidents import IncidentStage, default_config
        from pipeline.incidents.config import IncidentConfigError, require_config

        try:
            cfg = require_config(args.incidents_config) if args.incidents_config else default_config(rules)
            stage = IncidentStage(cfg)
        except IncidentConfigError as e:
            for problem in e.diagnostics:
                console.print(str(problem), highlight=False, markup=False)
            raise InputError("the incidents config does not load; nothing replayed") from None
    with progress.bar("replaying") as advance:
        res = replay(
            args.files,
            engine=engine,
            alerts_out=args.alerts_out,
            dlq_out=args.dlq_out,
            batch_size=args.batch,
            on_batch=lambda n, out: advance(n),
            incidents=stage,
            incidents_out=args.incidents_out,
        )
    t = res.totals
    console.print(f"replayed {t.records:,} records in {res.seconds:.2f}s ({res.records_per_s:,.0f} records/s)")
    console.print("firing alerts by family: " + (", ".join(f"{k}: {v}" for k, v in sorted(t.alerts.items())) or "none"))
    if stage is not None:
        console.print(
            f"incidents: {res.incidents} opened, {stage.open_count} still open at the end "
            f"({res.incident_events} incident events)"
            + "".join(
                f", {k.removeprefix('incidents.')}: {v}"
                for k, v in sorted(stage.stats.items())
                if not k.endswith((".opened", ".updated", ".resolved"))
            )
        )
    console.print("dead letters by reason: " + (", ".join(f"{k}: {v}" for k, v in sorted(t.dead.items())) or "none"))
    if moved := engine.stats[MOVED]:
        # Only when some were: a sampler jittering around a tick's start (architecture.md §4).
        console.print(
            f"DCGM samples moved to the next tick (each the second of its host's samples in one tick): {moved:,}"
        )
    if held := {k: n for k, n in sorted(engine.held_dropped.items()) if n}:
        # Only when some went: these records were never judged, and no dead letter names them.
        console.print(
            "records dropped waiting for the watermark (hold full), by stage: "
            + ", ".join(f"{k}: {n:,}" for k, n in held.items())
        )
    shares = getattr(getattr(engine, "fleet", None), "shard_records", None)
    if shares is not None:
        counts = shares()
        total = sum(counts.values()) or 1
        console.print(
            "model work by engine (records scored): "
            + ", ".join(f"{k}: {v:,} ({100 * v / total:.0f}%)" for k, v in sorted(counts.items()))
        )
    later = {f: n for f, n in res.late_by_file.items() if f in args.files}
    if later:
        # The files are merged by their records' times (bus.files.read_merged), so what is late
        # went back in time within its own file (docs/architecture.md, "Time"), or, past the
        # files merged at once, its group came after one it overlaps.
        group = merge_group_size()
        why = (
            f"the files are merged by their records' times in groups of {group}, one group after "
            "another, so these overlap an earlier group or go back in time within their own file"
            if len(args.files) > group
            else "the files are merged by their records' times, so these go back in time within their own file"
            if len(args.files) > 1
            else "these go back in time within the file (files concatenated out of order, say)"
        )
        console.print(
            "note: records of "
            + ", ".join(f"{f} ({n:,})" for f, n in sorted(later.items()))
            + f" were late (older than the time the engine had reached); {why}",
            highlight=False,
            markup=False,
        )
    return _name_unread(args, console, res.problems)


def _name_unread(args: argparse.Namespace, console: Any, problems: list[str]) -> int:
    """Files that could not be read whole: each its own line, after the summary of what was read,
    and the input status (README, "Exit status") so a script sees it."""
    for unread in problems:
        console.print(f"{getattr(args, '_prog', 'gpuwarden replay')}: {unread}", highlight=False, markup=False)
    return EXIT_INPUT if problems else 0


# Options that mean something only with --to-kafka (publishing), and only without it (detecting).
_KAFKA_ONLY = ("speed", "kafka_config")
_LOCAL_ONLY = ("alerts_out", "dlq_out", "incidents_out", "incidents_config", "rules")


def _options_apply(args: argparse.Namespace) -> None:
    """A usage error (exit 2) for an option the run would ignore: ``--speed 10`` without
    ``--to-kafka`` replays at full speed and writes nothing to Kafka, ``--alerts-out`` with it
    writes nothing, ``--incidents-config`` without ``--incidents-out`` groups nothing."""
    mode, unused = (
        ("with --to-kafka", [n for n in _LOCAL_ONLY if getattr(args, n) is not None])
        if args.to_kafka
        else ("without --to-kafka", [n for n in _KAFKA_ONLY if getattr(args, n) is not None])
    )
    if unused:
        raise UsageError(f"{', '.join('--' + n.replace('_', '-') for n in unused)}: not used {mode}")
    if args.incidents_config is not None and args.incidents_out is None:
        raise UsageError("--incidents-config: not used without --incidents-out")
    if args.speed not in (None, "max"):
        try:
            ok = float(args.speed) > 0
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"--speed: 'max' or a positive factor of event time, got {args.speed!r}")


def register(sub: Any) -> None:
    """Add ``gpuwarden replay`` to the subcommands ``sub``."""
    r = sub.add_parser("replay", help="run recorded telemetry through the engine")
    r.add_argument("files", nargs="+", help="JSONL (.gz) recordings; - reads standard input")
    r.add_argument("--alerts-out", help="write alert events (JSONL); - writes standard output")
    r.add_argument("--dlq-out", help="write dead letters (JSONL)")
    r.add_argument(
        "--incidents-out",
        metavar="FILE",
        help="group the alerts into incidents and write their events (JSONL; - writes standard output)",
    )
    r.add_argument(
        "--incidents-config",
        metavar="FILE",
        help="with --incidents-out: the incidents YAML (default: incidents.yaml beside the rules, else the shipped one)",
    )
    r.add_argument("--rules", default=None, help="rule directory or file (default: the shipped packs)")
    r.add_argument(
        "--models",
        default="auto",
        help="models.yaml for the online models; 'auto': the one beside the rules; 'none': rules only",
    )
    r.add_argument("--batch", type=positive_int, default=2000, help="lines per engine batch")
    r.add_argument(
        "--fleet-shards",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the models' work in N shards by host, each with a scorer of NCCL lanes, as a partitioned "
        "fleet stage would (same alerts; prints each engine's share)",
    )
    r.add_argument("--to-kafka", metavar="BOOTSTRAP", help="publish the recording to <prefix>.telemetry instead")
    r.add_argument(
        "--speed", default=None, help="with --to-kafka: 'max' (the default) or a factor of event time (1 = real time)"
    )
    r.add_argument("--prefix", default="gpuwarden", help="topic prefix for --to-kafka")
    r.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="with --to-kafka: the Kafka connection file (TLS, SASL; docs/operations.md, Secured Kafka)",
    )
    r.set_defaults(func=_cmd_replay)
