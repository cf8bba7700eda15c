"""``gpuwarden``: the command line. Each subcommand is a thin driver around the library."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from pipeline import progress
from pipeline.errors import (
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    GpuwardenError,
    InputError,
    UsageError,
)
from pipeline.resources import rules_dir, version


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
        scenario=_scenario(args.scenario),
    )
    topic = Topics(args.prefix).telemetry
    if conn is not None:
        from pipeline.bus.kafka import ensure_topics

        connection.check(conn)
        ensure_topics(conn.bootstrap, Topics(args.prefix), security=conn.options(), timeout_s=15.0)
    source = SimSource(sim, speed=1.0 if args.realtime else None)
    if conn is not None:
        n = _sim_to_kafka(source, conn, topic)
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


def _sim_to_kafka(source: Any, conn: Any, topic: str) -> int:
    """Publish the simulator through the producers' bounded sender and Kafka sink (one message
    per host per step); the number of records delivered, or an error if any were not."""
    from producers.common import BoundedSender, KafkaSink, run

    from pipeline.errors import BrokerUnavailableError

    # A whole step per delivery, so each host's step is one message; kafka-python's own limits
    # (60 s) as the send timeout, as the simulator had before it shared the producers' sender.
    step = max(20_000, 4 * source.sim.n_gpus)
    sink = KafkaSink(conn.bootstrap, topic, send_timeout_s=60.0, security=conn.options(), ensure=False)
    sender = BoundedSender(sink, max_records=max(200_000, 10 * step), max_batch=step)
    res = run(source, sender, interval_s=0.0, drain_s=15.0)
    lost = res.records - res.sender.sent
    if lost:
        raise BrokerUnavailableError(f"{lost} of {res.records} records not delivered to {topic} on {conn.bootstrap}")
    return res.sender.sent


def _scenario(name: str) -> str:
    """``name`` when it is a built-in scenario or a readable scenario file; else a usage error."""
    from producers.sim.scenarios import load_scenario

    try:
        load_scenario(name)
    except ValueError as e:
        raise UsageError(f"--scenario: {e}") from None
    return name


def _existing(paths: list[str], option: str) -> list[str]:
    """``paths`` when each is ``-`` (stdin) or a file; else an input error naming the first that is not."""
    for p in paths:
        if p != "-" and not Path(p).is_file():
            raise InputError(f"{option}{p}: " + ("not a file" if Path(p).exists() else "no such file"))
    return paths


def _cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.demo import run_demo

    return run_demo(
        hosts=args.hosts,
        duration=args.duration,
        seed=args.seed,
        scenario=_scenario(args.scenario),
        rules=args.rules,
        models=args.models,
    )


def _cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pipeline.detection import build_detector
    from pipeline.replay import replay

    console = Console(stderr=True)
    _existing(args.files, "")
    if args.to_kafka:
        from pipeline.bus import Topics, connection
        from pipeline.bus.kafka import ensure_topics
        from pipeline.recording import publish

        speed = None if args.speed == "max" else float(args.speed)
        conn = connection.resolve(bootstrap=args.to_kafka, config_file=args.kafka_config)
        connection.check(conn)
        ensure_topics(conn.bootstrap, Topics(args.prefix), security=conn.options(), timeout_s=15.0)
        t0 = time.monotonic()
        n = publish(args.files, conn.bootstrap, Topics(args.prefix).telemetry, speed=speed, security=conn.options())
        console.print(
            f"published {n} messages to {Topics(args.prefix).telemetry} on {conn.bootstrap} "
            f"in {time.monotonic() - t0:.1f}s"
        )
        return 0
    rules = args.rules or str(rules_dir())
    engine, diags = build_detector([rules], args.models)
    for d in diags:
        console.print(str(d), highlight=False, markup=False)
    if engine is None:
        raise InputError(f"rules in {rules} do not load; nothing replayed")
    with progress.bar("replaying") as advance:
        res = replay(
            args.files,
            engine=engine,
            alerts_out=args.alerts_out,
            dlq_out=args.dlq_out,
            batch_size=args.batch,
            on_batch=lambda n, out: advance(n),
        )
    t = res.totals
    console.print(f"replayed {t.records:,} records in {res.seconds:.2f}s ({res.records_per_s:,.0f} records/s)")
    console.print("alerts by family: " + (", ".join(f"{k}: {v}" for k, v in sorted(t.alerts.items())) or "none"))
    console.print("dead letters by reason: " + (", ".join(f"{k}: {v}" for k, v in sorted(t.dead.items())) or "none"))
    return 0


def _existing_paths(paths: list[str]) -> list[str]:
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"{p}: no such file or directory")
    return paths


def _cmd_rules_check(args: argparse.Namespace) -> int:
    from pipeline.rules import diagnostics as D
    from pipeline.rules.diagnostics import Diagnostic
    from pipeline.rules.loader import load_rules, rule_files
    from pipeline.rules.testing import tested_rules

    args.paths = args.paths or [str(rules_dir())]
    ruleset, diags = load_rules(_existing_paths(args.paths))
    if ruleset is not None:
        # Sigma's rule: no stable rule without a test.
        tests = [Path(p) / "tests" for p in args.paths if (Path(p) / "tests").is_dir()]
        if tests:
            covered = tested_rules(tests)
            for r in ruleset.rules:
                if r.meta.name not in covered:
                    f, _, line = r.spec.source.rpartition(":")
                    diags.append(
                        Diagnostic(
                            f, int(line), 5, r.meta.name, "no test exercises this rule", D.LINT_NO_TEST, "warning"
                        )
                    )
    for d in sorted(diags):
        print(d)
    errors = sum(d.is_error for d in diags)
    warnings = len(diags) - errors
    n_files = len(rule_files(args.paths))
    if errors or (args.strict and warnings):
        print(f"{errors} error(s), {warnings} warning(s) in {n_files} file(s)", file=sys.stderr)
        return 1
    assert ruleset is not None  # no errors: the rules loaded
    print(
        f"ok: {len(ruleset)} rules in {n_files} file(s)" + (f", {warnings} warning(s)" if warnings else ""),
        file=sys.stderr,
    )
    return 0


def _cmd_rules_test(args: argparse.Namespace) -> int:
    from pipeline.rules.testing import run_tests

    args.paths = args.paths or [str(rules_dir() / "tests")]
    with progress.status("rule tests") as update:
        results = run_tests(_existing_paths(args.paths), on_test=lambda i, n: update(f"rule tests: {i + 1}/{n}"))
    failed = [r for r in results if not r.ok]
    for r in results:
        mark = "ok  " if r.ok else "FAIL"
        print(f"{mark} {r.file}: {r.name}")
        for f in r.failures:
            print(f"     {f}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not results else 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.bus import connection
    from pipeline.service.app import Service, setup_logging
    from pipeline.service.config import load_config

    cfg = load_config(args.config)
    conn = connection.from_args(args, base=connection.KafkaConnection(cfg.kafka.bootstrap, cfg.kafka.security))
    cfg.kafka.bootstrap, cfg.kafka.security = conn.bootstrap, conn.security
    if (conn.security.security_protocol or "PLAINTEXT") != "PLAINTEXT":
        # A refused login or certificate: one line and exit 4 now, not kafka-python's retries in the
        # log until a timeout (docs/operations.md, Secured Kafka). Plain brokers are left to the
        # service, which first refuses to start without its state key.
        connection.check(conn)
    if args.prefix:
        cfg.kafka.prefix = args.prefix
    if args.group:
        cfg.kafka.group = args.group
    if args.http_port is not None:
        cfg.http.port = args.http_port
    if args.rules:
        cfg.service.rules = [args.rules]
    if args.insecure_state:
        cfg.service.insecure_state = True
    if args.stage:
        cfg.service.stage = args.stage
    setup_logging(cfg.service.log_level)
    # `kill -USR1 <pid>`: every thread's stack to stderr, for a service that seems stuck
    # (docs/operations.md, Troubleshooting); the service goes on afterwards.
    import faulthandler
    import io
    import signal as _signal

    try:
        faulthandler.register(_signal.SIGUSR1, all_threads=True)
    except (io.UnsupportedOperation, ValueError, AttributeError):
        pass  # stderr is not a file (embedded, captured): nothing to write the stacks to
    stage = cfg.service.stage
    if stage == "fleet":
        from pipeline.errors import ConfigError
        from pipeline.service.app import models_on

        if not models_on(cfg):
            raise ConfigError("service.stage", "the fleet stage runs the models, and service.models finds none")
        return Service(cfg, stage="fleet").run()
    host = Service(cfg)
    if stage == "all" and host.forwards:
        return host.run(Service(cfg, stage="fleet", metrics=host.metrics))
    return host.run()


def _cmd_record(args: argparse.Namespace) -> int:
    import signal as _signal

    from pipeline.bus import Topics, connection
    from pipeline.recording import record

    conn = connection.from_args(args)
    # A consumer whose login is refused polls empty batches until the idle timeout: an empty
    # recording that looks like a quiet topic. One login first says what is wrong.
    connection.check(conn)
    stop = {"now": False}
    _signal.signal(_signal.SIGTERM, lambda *_: stop.update(now=True))
    topic = args.topic or Topics(args.prefix).telemetry
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


def _eval_progress(update: Callable[[str], None], scenario: str, interval: float, status: str) -> None:
    update(f"evaluating {scenario} at {interval:g} s: {status}")


def _cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pipeline.evaluation.goodput import Job
    from pipeline.evaluation.run import evaluate
    from pipeline.evaluation.tables import detector_rows, family_rows, goodput_rows, interval_rows, verdicts

    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    if any(i <= 0 for i in args.interval):
        raise UsageError("--interval must be positive")
    by_interval = {}
    with progress.status("evaluating") as update:
        for iv in args.interval:
            by_interval[iv] = evaluate(
                _scenario(args.scenario),
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
        tables = [family_rows(scores, title), detector_rows(scores), goodput_rows(scores, job)]
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
            )
            continue
        console.print(tables[0].rich())
        console.print(tables[1].rich())
        for v in lines:
            console.print(v, markup=False, highlight=False)
        console.print(tables[2].rich())
    if len(by_interval) > 1:
        summary = interval_rows(by_interval, f"{args.scenario}: per sampling interval")
        if args.markdown:
            md.append(summary.markdown())
        else:
            console.print(summary.rich())
    if args.markdown:
        console.print("\n\n".join(md), markup=False, highlight=False, soft_wrap=True)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from pipeline.report import incident_page, write_page

    _existing(args.telemetry, "--telemetry ")
    _existing(args.alerts, "--alerts ")
    if args.window <= 0 or args.max_alerts < 0:
        raise UsageError("--window must be positive" if args.window <= 0 else "--max-alerts must not be negative")
    t0 = time.monotonic()
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
        )
    out = write_page(html, args.out)
    print(f"gpuwarden report: wrote {out} ({len(html) / 1e6:.1f} MB) in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


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


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake told in one line (the usage is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _global_options(p: argparse.ArgumentParser, top: bool) -> None:
    # Under a subcommand the default is SUPPRESS, so an option not given there keeps the value
    # given (or defaulted) before the subcommand: `gpuwarden -v replay` = `gpuwarden replay -v`.
    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    for flags, help_ in (
        (("-v", "--verbose"), "debug logging; a bug shows its traceback"),
        (("-q", "--quiet"), "no progress bars, even on a terminal"),
    ):
        if not any(f in p._option_string_actions for f in flags):
            p.add_argument(*flags, action="store_true", help=help_, **kw)


def _everywhere(p: argparse.ArgumentParser, seen: set[int]) -> None:
    """Global options on every subcommand, nested ones and those other modules register included."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                if id(sp) not in seen:
                    seen.add(id(sp))
                    _global_options(sp, top=False)
                    sp.set_defaults(_prog=sp.prog)
                    _everywhere(sp, seen)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpuwarden",
        description="GPU-fleet fault detection on streaming telemetry.",
        epilog="Exit status: 0 ok, 1 findings (rule errors, failed tests or actions), 2 usage, "
        "3 unreadable or invalid input or config, 4 broker or service unavailable, "
        "70 internal error (see -v), 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"gpuwarden {version()}")
    _global_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sim", help="simulate a GPU fleet (with labelled fault injection)")
    s.add_argument("--hosts", type=int, default=4)
    s.add_argument("--duration", type=float, default=600.0, help="seconds of event time")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scenario", default="healthy", help="built-in scenario name or a YAML file")
    s.add_argument("--out", help="JSONL file to write (.gz to compress)")
    _kafka_options(s, "publish to <prefix>.telemetry on this broker")
    s.add_argument("--prefix", default="gpuwarden", help="topic prefix")
    s.add_argument("--labels-out", help="write the injected-fault labels (JSON) here")
    s.add_argument("--realtime", action="store_true", help="pace output to event time")
    s.set_defaults(func=_cmd_sim)

    d = sub.add_parser("demo", help="simulated fleet -> in-process bus -> engine -> alerts")
    d.add_argument("--hosts", type=int, default=8)
    d.add_argument("--duration", type=float, default=1500.0)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--scenario", default="mixed")
    d.add_argument("--rules", default=None, help="rule directory (default: the shipped packs)")
    d.add_argument("--models", default="auto", help="models.yaml, 'auto' (beside the rules) or 'none'")
    d.set_defaults(func=_cmd_demo)

    r = sub.add_parser("replay", help="run recorded telemetry through the engine")
    r.add_argument("files", nargs="+", help="JSONL (.gz) recordings; - reads standard input")
    r.add_argument("--alerts-out", help="write alert events (JSONL); - writes standard output")
    r.add_argument("--dlq-out", help="write dead letters (JSONL)")
    r.add_argument("--rules", default=None, help="rule directory or file (default: the shipped packs)")
    r.add_argument(
        "--models",
        default="auto",
        help="models.yaml for the online models; 'auto': the one beside the rules; 'none': rules only",
    )
    r.add_argument("--batch", type=int, default=2000, help="lines per engine batch")
    r.add_argument("--to-kafka", metavar="BOOTSTRAP", help="publish the recording to <prefix>.telemetry instead")
    r.add_argument("--speed", default="max", help="with --to-kafka: 'max' or a factor of event time (1 = real time)")
    r.add_argument("--prefix", default="gpuwarden", help="topic prefix for --to-kafka")
    r.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="with --to-kafka: the Kafka connection file (TLS, SASL; docs/operations.md, Secured Kafka)",
    )
    r.set_defaults(func=_cmd_replay)

    ru = sub.add_parser("rules", help="check and unit-test detection rules")
    rsub = ru.add_subparsers(dest="rules_command", required=True)
    rc = rsub.add_parser("check", help="load rule files and report every problem as file:line:col")
    rc.add_argument("paths", nargs="*", help="rule files or directories (default: the shipped packs)")
    rc.add_argument("--strict", action="store_true", help="lint warnings are errors too")
    rc.set_defaults(func=_cmd_rules_check)
    rt = rsub.add_parser("test", help="run rule unit tests (rules/tests/*.yaml)")
    rt.add_argument("paths", nargs="*", help="rule test files or directories (default: the shipped packs' tests)")
    rt.set_defaults(func=_cmd_rules_test)

    ev = sub.add_parser("eval", help="score detectors (ours and two baselines) on labelled scenarios")
    ev.add_argument("--scenario", default="llama3", help="built-in scenario name or a YAML file")
    ev.add_argument("--seeds", type=int, default=5, help="runs with seeds 1..N (default: %(default)s)")
    ev.add_argument("--hosts", type=int, default=8)
    ev.add_argument("--duration", type=float, default=3600.0)
    ev.add_argument(
        "--interval",
        type=float,
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

    rp = sub.add_parser("report", help="write a self-contained HTML incident report (timeline + signals per alert)")
    rp.add_argument("--telemetry", nargs="+", required=True, metavar="FILE", help="telemetry JSONL (.gz) recordings")
    rp.add_argument("--alerts", nargs="+", required=True, metavar="FILE", help="alert events (replay --alerts-out)")
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
        "--rules",
        default=None,
        help="the rules the alerts came from: which fields each reads (default: the shipped packs)",
    )
    rp.add_argument("--models", default="auto", help="models.yaml; 'auto': the one beside the rules; 'none'")
    rp.add_argument("--title", default="Incident report")
    rp.set_defaults(func=_cmd_report)

    sv = sub.add_parser("serve", help="run the Kafka consumer-group detection service")
    sv.add_argument("--config", help="YAML config (see docs/operations.md)")
    _kafka_options(sv, "override kafka.bootstrap")
    sv.add_argument("--prefix", help="override kafka.prefix")
    sv.add_argument("--group", help="override kafka.group")
    sv.add_argument("--http-port", type=int, help="override http.port (0: any free port)")
    sv.add_argument("--rules", help="override service.rules with one directory")
    sv.add_argument(
        "--insecure-state",
        action="store_true",
        help="run without GPUWARDEN_STATE_KEY: checkpoints unsigned, the state topic trusted (service.insecure_state)",
    )
    sv.add_argument(
        "--stage",
        choices=["all", "host", "fleet"],
        help="run only this stage (service.stage; default all: the host stage and, with models, the fleet stage)",
    )
    sv.set_defaults(func=_cmd_serve)

    rec = sub.add_parser("record", help="copy a Kafka topic to a JSONL file")
    _kafka_options(rec)
    rec.add_argument("--out", required=True)
    rec.add_argument("--prefix", default="gpuwarden")
    rec.add_argument("--topic", help="default: <prefix>.telemetry")
    rec.add_argument("--idle-timeout", type=float, default=5.0, help="stop after this long without a message")
    rec.add_argument("--max-messages", type=int)
    rec.set_defaults(func=_cmd_record)

    from producers.cli import register as register_produce

    register_produce(sub)
    from pipeline.remediation.cli import register as register_remediation

    register_remediation(sub)
    t = sub.add_parser("topics", help="create the project's Kafka topics")
    _kafka_options(t)
    t.add_argument("--prefix", default="gpuwarden")
    t.add_argument("--partitions", type=int, default=8, help="partitions of each topic (default 8)")
    t.add_argument(
        "--fleet-partitions",
        type=int,
        help="partitions of <prefix>.fleet, the fleet stage's input (default: --partitions)",
    )
    t.set_defaults(func=_cmd_topics)
    return p


def _kafka_options(p: argparse.ArgumentParser, bootstrap_help: str = "Kafka bootstrap servers") -> None:
    from pipeline.bus.connection import add_arguments

    add_arguments(p, bootstrap_help=bootstrap_help)


def _fail(args: argparse.Namespace, message: str) -> None:
    print(f"{getattr(args, '_prog', 'gpuwarden')}: {message}", file=sys.stderr)
    if args.verbose:
        traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    """Run one ``gpuwarden`` command; return its exit status (listed in the README).

    A mistake of the user's (an option, a missing file, a bad config, a broker that does not
    answer) is one line on stderr and its own status; anything else is a bug: one line and 70,
    the traceback with ``-v``.
    """
    parser = build_parser()
    _everywhere(parser, set())
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage mistake (told by _Parser.error)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    progress.set_quiet(args.quiet)
    # `gpuwarden sim --out - | head` should end quietly; but a service, a producer or remediate
    # must not die of a peer that hangs up (a socket write to a closed connection raises instead).
    if getattr(args, "_prog", "").split(" ")[1:2] not in (["serve"], ["remediate"], ["produce"], ["record"]):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return int(args.func(args) or 0)
    except GpuwardenError as e:
        _fail(args, str(e))
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit as e:
        if isinstance(e.code, str):  # raise SystemExit("...") of a subcommand: a usage mistake
            _fail(args, e.code.removeprefix(f"{getattr(args, '_prog', '')}: "))
            return EXIT_USAGE
        raise
    except OSError as e:
        if e.filename is None:
            _fail(args, f"internal error: {e!r} (run with -v for the traceback)")
            return EXIT_INTERNAL
        _fail(args, f"{e.filename}: {e.strerror or e}")
        return EXIT_INPUT
    except Exception as e:  # noqa: BLE001 - the last resort: a bug, told in one line (-v: traceback)
        if type(e).__module__.startswith("kafka."):
            _fail(args, f"Kafka: {e}")
            return EXIT_UNAVAILABLE
        _fail(
            args,
            f"internal error: {type(e).__name__}: {e}" + ("" if args.verbose else " (run with -v for the traceback)"),
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
