"""CLI: ``gpuwarden remediate [--config F]``, ``remediate breaker status|reset``, ``remediate act``,
``gpuwarden routes test fault=... severity=... [label=value ...] [--expect RECEIVER ...]``."""

from __future__ import annotations

import argparse
import difflib
import getpass
import json
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

import msgspec

from pipeline.bus import connection
from pipeline.errors import ConfigError, InputError, UsageError
from pipeline.remediation.audit import AuditLog
from pipeline.remediation.config import load_config, parse_duration
from pipeline.remediation.guardrails import BreakerState, StateStore, read_breaker
from pipeline.remediation.incidents import SOURCES, decode_incident
from pipeline.remediation.remediator import Remediator
from pipeline.remediation.routes import RouteTree, alert_from_args
from pipeline.remediation.service import RemediationService
from pipeline.resources import default_routes
from pipeline.schema import FAMILIES, AlertEvent

DEFAULT_ROUTES = str(default_routes())  # the shipped example routes, installed or in a checkout


def _config_arg(p: argparse.ArgumentParser, default: str | None = None, suppress: bool = False) -> None:
    p.add_argument(
        "--config", metavar="FILE", help="remediation config (YAML)", default=argparse.SUPPRESS if suppress else default
    )


def _load(args: argparse.Namespace):
    if not getattr(args, "config", None):
        raise ConfigError("--config", "give the remediation config file")
    return load_config(args.config)


def _cmd_remediate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    k = cfg.raw.kafka
    conn = connection.from_args(args, base=connection.KafkaConnection(k.bootstrap, k.security))
    connection.check(conn)  # refused credentials: one line and exit 4, not a consumer polling nothing
    svc = RemediationService(
        cfg,
        bootstrap=conn.bootstrap,
        prefix=args.prefix,
        group=args.group,
        source=args.source,
        security=conn.options(),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    dry = "dry-run" if cfg.guardrails.dry_run else "LIVE"
    inv = svc.remediator.inventory
    print(
        f"gpuwarden remediate: {svc.topic} (group {svc.group}) on {svc.bootstrap}, "
        f"disruptive actions {dry}, state {cfg.state_file}, "
        f"{inv.describe() if inv else 'no inventory (node actions dry-run only)'}"
        + (f", honouring {svc.remediator.silences.describe()}" if svc.remediator.silences else ""),
        file=sys.stderr,
    )
    stats = svc.run(stop, idle_exit_s=args.idle_exit)
    print(
        f"gpuwarden remediate: {stats.messages} {svc.source} handled; decisions {svc.audit.total}; "
        f"unknown hosts {svc.audit.reasons.get('unknown_host', 0)}"
        + (
            f"; Alertmanager silences ignored (a pattern RE2 does not accept) {sil.ignored_total}"
            if (sil := svc.remediator.silences) is not None
            else ""
        ),
        file=sys.stderr,
    )
    return 0


def _cmd_breaker(args: argparse.Namespace) -> int:
    cfg = _load(args)
    window = parse_duration(cfg.guardrails.breaker.window, "guardrails.breaker.window")
    exists = cfg.state_file.exists()
    missing = not exists and args.breaker_command == "status"
    if args.breaker_command == "reset":
        store = StateStore(cfg.state_file)
        try:
            was_open = store.reset_breaker(args.by or getpass.getuser(), args.note or "")
            print("breaker closed" if was_open else "breaker was not open; reset recorded anyway")
            st = store.breaker(window)
        finally:
            store.close()
    elif exists:
        # ``status`` only reads, so it works on a read-only state file and changes nothing in it.
        st = read_breaker(cfg.state_file, window)
    else:
        # Not created here: a state file that is not there yet is the default state (closed,
        # nothing recorded); ``reset`` and the deciding commands create it.
        st = BreakerState(False, None, None, None, None, None, [])
    b = cfg.guardrails.breaker
    if args.json:
        print(json.dumps({**st.to_dict(), "state_file": str(cfg.state_file), "state_file_exists": exists}, indent=2))
    else:
        print(f"breaker: {'OPEN' if st.open else 'closed'}")
        if missing:
            print(
                f"  state file {cfg.state_file} does not exist yet: nothing recorded "
                "(remediate, remediate act or breaker reset creates it)"
            )
        if st.open:
            print(f"  opened: {st.opened_at} ({st.reason})")
        if st.reset_at:
            print(f"  last reset: {st.reset_at} by {st.reset_by} {st.reset_note or ''}".rstrip())
        print(
            f"  nodes acted on in the last {window:g}s: {len(st.hosts_in_window)} "
            f"(limit {b.max_nodes}" + (f", {b.max_percent:g}% of {b.fleet_size}" if b.fleet_size else "") + ")"
        )
    return 1 if (args.breaker_command == "status" and st.open and args.exit_code) else 0


def _cmd_act(args: argparse.Namespace) -> int:
    cfg = _load(args)
    path = args.alert or args.incident
    try:
        data = Path(path).read_bytes()
        alert = msgspec.json.decode(data, type=AlertEvent) if args.alert else None
        incident = decode_incident(data) if args.incident else None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(f"{path}: not an {'alert' if args.alert else 'incident'} event: {e}") from None
    store = StateStore(cfg.state_file)
    audit = AuditLog(file=cfg.audit_file)
    rem = Remediator(cfg, store, audit)
    try:
        if alert is not None:
            # one_shot: nothing runs after this command to act on a group once its group_wait is over.
            rem.handle(alert, origin=f"cli:{path}", force=args.force, one_shot=True)
        elif incident is not None:
            rem.handle_incident(incident, origin=f"cli:{path}", force=args.force)
        recs = list(audit.records)
        audit.flush()
    finally:
        rem.close()
        store.close()
    for note in rem.notes:
        print(f"remediate act: {note}", file=sys.stderr)
    for r in recs:
        print(msgspec.json.encode(r).decode())
    return 1 if any(r.decision in ("failed", "blocked") for r in recs) else 0


# What an alert can say (pipeline/schema.py's families; the rule loader's severities): a value
# outside them matches no route that names one, so a typo would test nothing and look like a pass.
_SEVERITIES = ("critical", "warning", "info")
_STATES = ("firing", "resolved")


def _known_alert(alert: AlertEvent) -> AlertEvent:
    """``alert`` when its fault's family, severity and state are ones an alert can have; else a
    usage error naming the value and the known ones.

    >>> _known_alert(alert_from_args(["fault=hbm_dbe", "severity=critical"])).family
    'hbm'
    """
    if alert.family not in FAMILIES:
        raise UsageError(
            f"fault={alert.fault}: unknown fault family {alert.family!r} "
            f"(a fault is FAMILY_NAME, FAMILY one of {', '.join(FAMILIES)}; e.g. fault=hbm_ecc_burst)"
        )
    if alert.severity and alert.severity not in _SEVERITIES:
        raise UsageError(f"severity={alert.severity}: unknown severity (one of {', '.join(_SEVERITIES)})")
    if alert.state not in _STATES:
        raise UsageError(f"state={alert.state}: unknown state (one of {', '.join(_STATES)})")
    return alert


_FAULT_NAMES = re.compile(r"[a-z0-9_]+(?:\|[a-z0-9_]+)*")


def _route_faults(tree: RouteTree) -> set[str]:
    """The faults the routes name literally: ``fault="x"``, ``fault!="x"``, ``fault=~"x|y"``."""
    out: set[str] = set()
    todo = [tree.root]
    while todo:
        r = todo.pop()
        todo += r.children
        for m in r.matchers:
            if m.name == "fault" and (m.op in ("=", "!=") or _FAULT_NAMES.fullmatch(m.value)):
                out.update(m.value.split("|") if m.op in ("=~", "!~") else [m.value])
    return out


def _warn_unknown_fault(alert: AlertEvent, tree: RouteTree, shipped: frozenset[str] | None) -> None:
    """A warning on stderr when ``alert.fault`` is raised by no shipped detector and named by no
    route: most likely a typo, which would silently test a route other than the one meant. Not an
    error: a rule pack of one's own may raise any family-prefixed fault (docs/rules.md)."""
    if shipped is None:
        return  # (no list of the shipped detectors' faults given to ``register``)
    known = shipped | _route_faults(tree)
    if alert.fault in known:
        return
    close = difflib.get_close_matches(alert.fault, sorted(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    print(
        f"routes test: warning: fault={alert.fault} is not a fault of the shipped rule packs, nor one "
        f"this config's routes name; {hint}(a fault of your own rule pack is fine; otherwise the "
        "route below is not the one that fault would take)",
        file=sys.stderr,
    )


def _cmd_routes_test(args: argparse.Namespace) -> int:
    alert = _known_alert(alert_from_args(args.pairs))
    cfg = load_config(args.config)
    tree = RouteTree.build(cfg.raw.route)
    _warn_unknown_fault(alert, tree, args.known_faults() if args.known_faults else None)
    matches = tree.match(alert)
    for m in matches:
        r = cfg.receivers[m.receiver]
        chain = r.actions if alert.state == "firing" else r.on_resolved
        print(
            f"{m.describe()}  ->  receiver {m.receiver}: "
            + (", ".join(f"{a} ({type(cfg.actions[a]).__struct_config__.tag})" for a in chain) or "no actions")
        )
        print(
            f"    group_by={m.route.group_by} group_wait={m.route.group_wait:g}s "
            f"repeat_interval={m.route.repeat_interval:g}s"
        )
    got = [m.receiver for m in matches]
    if args.expect is not None and got != args.expect:
        print(f"FAIL: expected receivers {args.expect}, got {got}", file=sys.stderr)
        return 1
    return 0


def register(sub, known_faults: Callable[[], frozenset[str]] | None = None) -> None:
    """Add ``remediate`` and ``routes`` to the ``gpuwarden`` CLI's subparsers. ``known_faults``:
    the faults the shipped detectors raise (``pipeline.detection.shipped_faults``; remediation
    reads alerts and does not import the detectors), for ``routes test``'s typo warning."""
    rm = sub.add_parser("remediate", help="run remediation on the alerts topic (routes, actions, guardrails)")
    _config_arg(rm)
    connection.add_arguments(rm, bootstrap_help="broker (default: the config's kafka.bootstrap)")
    rm.add_argument("--prefix", help="topic prefix (default: the config's kafka.prefix)")
    rm.add_argument("--group", help="consumer group (default: the config's kafka.group)")
    rm.add_argument(
        "--source",
        choices=SOURCES,
        default=None,
        help="act on each alert (<prefix>.alerts) or on each incident (<prefix>.incidents); default: the config's source",
    )
    rm.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long without an alert (tests, one-shot catch-up)",
    )
    rm.set_defaults(func=_cmd_remediate)
    rsub = rm.add_subparsers(dest="remediate_command")

    br = rsub.add_parser("breaker", help="show or reset (close) the circuit breaker")
    br.add_argument("breaker_command", choices=["status", "reset"])
    _config_arg(br, suppress=True)
    br.add_argument("--by", help="who resets it (default: the login name)")
    br.add_argument("--note", help="why it is safe to resume")
    br.add_argument("--json", action="store_true")
    br.add_argument("--exit-code", action="store_true", help="status exits 1 while the breaker is open")
    br.set_defaults(func=_cmd_breaker)

    act = rsub.add_parser("act", help="decide one alert or incident event (JSON file) now, through every guardrail")
    one = act.add_mutually_exclusive_group(required=True)
    one.add_argument("--alert", metavar="FILE", help="an alert event")
    one.add_argument("--incident", metavar="FILE", help="an incident event (as in <prefix>.incidents)")
    act.add_argument(
        "--force",
        action="store_true",
        help="ignore once-per-alert, grouping, cooldown and attempt cap (never the breaker or dry-run)",
    )
    _config_arg(act, suppress=True)
    act.set_defaults(func=_cmd_act)

    ro = sub.add_parser("routes", help="test remediation routes")
    rosub = ro.add_subparsers(dest="routes_command", required=True)
    rt = rosub.add_parser("test", help="print the route path and actions an alert would take")
    rt.add_argument(
        "pairs",
        nargs="+",
        metavar="name=value",
        help="fault=..., severity=..., host=..., gpu=..., job=..., state=..., any label=value",
    )
    rt.add_argument("--expect", nargs="+", metavar="RECEIVER", help="exit 1 unless exactly these receivers match")
    _config_arg(rt, default=DEFAULT_ROUTES)
    rt.set_defaults(func=_cmd_routes_test, known_faults=known_faults)
