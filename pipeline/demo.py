"""The demo driver: a simulated fleet through the in-process bus, the engine and the incident
stage (``gpuwarden demo``, ``make demo``).

What it prints, an operator's view of one run:

- a header: the fleet, the event time simulated, the rules and models loaded;
- one timeline of alert and incident events in event-time order (ties in the order they were
  emitted), its times in seconds after the simulation's start, which the timeline names in the
  wall-clock format alert summaries use (``2025-11-29 08:16:59Z``);
- every alert and incident named by its ``fault``, as replay counts alerts ("firing alerts by
  family") and as the alert events carry it: a rule or model name appears nowhere, so one fault
  never reads as two things;
- the injected faults against the alerts, and the incidents, each with counts that add up.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from pipeline.incidents import IncidentEvent
    from pipeline.schema import AlertEvent

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
FAULT_WIDTH = 29  # the longest shipped fault name, so alert lines keep their columns
DEFAULT_HOSTS, DEFAULT_DURATION, DEFAULT_SEED, DEFAULT_SCENARIO = 8, 1500.0, 7, "mixed"


def _where(host: str | None, gpu: int | None) -> str:
    return (host or "-") + (f"/GPU{gpu}" if gpu is not None else "")


def _wall(ts: float) -> str:
    """``ts`` as the alert summaries write wall-clock times (``pipeline/engine/checks.py``)."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def alert_line(a: AlertEvent, t0: float, width: int = FAULT_WIDTH) -> str:
    """One line per alert state change: time after ``t0``, state, severity, fault, where."""
    where = _where(a.host, a.gpu)
    if a.state == "firing":
        return f"+{a.ts - t0:5.0f}s FIRING   {a.severity:<8} {a.fault:<{width}} {where:<18} {a.summary}"
    return (
        f"+{a.ts - t0:5.0f}s resolved {a.severity:<8} {a.fault:<{width}} {where:<18} after {a.ts - a.started_at:.0f}s"
    )


def shown(e: IncidentEvent) -> bool:
    """Whether the timeline shows incident event ``e``: it opened, resolved or changed more than
    an alert joining (severity, action, a policy), since each alert already has its own line."""
    return e.state != "updated" or bool(e.policy) or any(c != "alert_joined" for c in e.changes)


def incident_line(e: IncidentEvent, t0: float) -> str:
    """One line per incident opened, escalated (or otherwise changed) or resolved."""
    label = "escalated" if e.state == "updated" and "action_escalated" in e.changes else e.state
    head = f"+{e.ts - t0:5.0f}s INCIDENT {label:<9} {e.incident} {_where(e.host, e.gpu):<18}"
    if e.state == "opened":
        return f"{head} root {e.root.fault}; {e.severity}, action {e.action}" + (f" ({e.reason})" if e.reason else "")
    if e.state == "resolved":
        return f"{head} {len(e.members) + e.more_members} alert(s), {e.severity}, action {e.action}"
    # The joining alert has its own line; what is news here is what else changed.
    changes = ", ".join(c for c in e.changes if c != "alert_joined")
    return f"{head} {e.severity}, action {e.action}: {e.reason or changes}"


class Timeline:
    """Events kept by event time, printed in that order: the incident stage emits a resolution
    only when a later alert moves its clock, so the order events arrive in is not event time."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, Any]] = []

    def add(self, ts: float, item: Any) -> None:
        """Keep ``item`` at event time ``ts``."""
        self._items.append((ts, len(self._items), item))

    def lines(self) -> list[Any]:
        """The items by event time; ties keep the order they were added in."""
        return [item for _, _, item in sorted(self._items, key=lambda x: (x[0], x[1]))]


def run_demo(
    hosts: int = DEFAULT_HOSTS,
    duration: float = DEFAULT_DURATION,
    seed: int = DEFAULT_SEED,
    scenario: str = DEFAULT_SCENARIO,
    console: Console | None = None,
    rules: str | None = None,
    models: str | None = "auto",
) -> int:
    """Run the demo and print its timeline and summaries; 0, or 1 where the rules or the
    incidents config do not load (their diagnostics printed)."""
    from rich.console import Console
    from rich.markup import escape

    from pipeline import progress
    from pipeline.bus import MemoryBus, Topics, send_all
    from pipeline.bus.sinks import BusOutput
    from pipeline.bus.telemetry import per_host_messages
    from pipeline.detection import build_detector
    from pipeline.incidents import IncidentStage, default_config
    from pipeline.incidents.config import IncidentConfigError
    from pipeline.incidents.scoring import match_incidents
    from pipeline.resources import rules_dir as default_rules
    from pipeline.rules.loader import describe_loaded
    from pipeline.replay import incident_watermark
    from pipeline.runner import Pipeline
    from pipeline.schema import DeadLetter
    from pipeline.scoring import knock_on, match_faults
    from producers.sim import Simulator

    # Piped output (CI logs, tee) gets a log-friendly width instead of rich's 80 columns, wide
    # enough that the incident table's longest fault names are not cut.
    console = console or Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
    sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=scenario)
    topics = Topics()
    bus = MemoryBus(partitions=4)
    producer = bus.producer()
    consumer = bus.consumer(topics.telemetry, group="gpuwarden-demo")
    rules_dir = rules or str(default_rules())
    engine, diags = build_detector([rules_dir], models)
    if engine is None:
        for d in diags:
            console.print(str(d), markup=False, highlight=False)
        return 1
    try:
        stage = IncidentStage(default_config(rules_dir))
    except IncidentConfigError as e:
        for problem in e.diagnostics:
            console.print(str(problem), markup=False, highlight=False, soft_wrap=True)
        return 1
    pipe = Pipeline(engine)
    alerts: list[AlertEvent] = []
    incidents: list[IncidentEvent] = []
    timeline = Timeline()
    t_start = time.perf_counter()
    t0 = sim.start_ts
    console.print(
        f"[bold]gpuwarden demo[/]: {len(sim.hosts)} hosts x {sim.gpus_per_host} GPUs, {duration:.0f}s of event time, "
        f"scenario [cyan]{escape(scenario)}[/], seed {seed}, in-process bus, "
        + escape(describe_loaded(engine.rules, engine.models, str(rules_dir)))
    )

    # Every alert goes to the alerts topic, dead letters to the DLQ, incidents to the stage.
    sink = BusOutput(producer, topics)

    feed = stage.feed()  # the stage's input in replay's and serve's order

    def publish(out_alerts: list[AlertEvent], dead: list[DeadLetter], final: bool = False) -> None:
        sink.alerts(out_alerts)
        sink.dead(dead)
        sink.flush()
        alerts.extend(out_alerts)
        feed.add(out_alerts)
        events = stage.process(feed.flush() if final else feed.release(incident_watermark(engine)))
        incidents.extend(events)
        # In the order emitted, so that a tie keeps an alert before the incident event it caused.
        for a in out_alerts:
            timeline.add(a.ts, a)
        for e in events:
            if shown(e):
                timeline.add(e.ts, e)

    # Drawn on stderr and only on a terminal, as every command's progress (-q, CI: none).
    with progress.bar("replaying fleet: seconds of event time", total=duration) as advance:
        done = 0.0
        for batch in sim.batches():
            if not batch:
                continue
            send_all(producer, topics.telemetry, per_host_messages(batch))
            out = pipe.handle(consumer.poll(max_records=100_000))
            consumer.commit()
            publish(out.alerts, out.dead)
            now = batch[0]["ts"] - t0
            advance(max(0.0, now - done))
            done = max(done, now)
        out = pipe.flush()
        publish(out.alerts, out.dead, final=True)
    sink.close()

    print_timeline(console, timeline, t0)
    elapsed = time.perf_counter() - t_start
    totals = pipe.totals
    n_dead = len(bus.messages(topics.dlq))
    console.print(
        f"\n{totals.records:,} records ({totals.messages:,} messages) in {elapsed:.1f}s; "
        f"{len(bus.messages(topics.alerts))} alert event(s) on {topics.alerts}, "
        f"{n_dead} dead letter(s) on {topics.dlq} "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(totals.dead.items())) or 'none'})",
        highlight=False,
    )
    labels = sim.labels()
    matches, unmatched = match_faults(labels, alerts)
    console.print(fault_table(matches, t0))
    firing = sum(a.state == "firing" for a in alerts)
    knock = [a for a in unmatched if knock_on(a, labels)]
    # Every firing alert is counted once: on an injected fault (its family, host and time),
    # a knock-on of one, or none, so the three add up to the firing alerts.
    console.print(
        f"{sum(m.detected for m in matches)}/{len(matches)} injected faults detected by "
        f"{firing - len(unmatched)} firing alert(s); "
        f"{len(knock)} more alert(s) are knock-on effects on a faulty GPU or host (e.g. a throttled GPU "
        f"is also an NCCL straggler); {len(unmatched) - len(knock)} firing alert(s) matched no injected fault.",
        highlight=False,
    )
    console.print(incident_table(incidents, labels))
    im = match_incidents(labels, incidents)
    console.print(
        f"{len(im.incidents)} incident(s) for {len(im.faults)} injected fault(s) from {firing} firing alert(s); "
        f"{im.found}/{len(im.faults)} faults in an incident on their host, "
        f"{im.opened}/{len(im.faults)} in one of their own; "
        f"{len(im.stray)} incident(s) matched no injected fault.",
        soft_wrap=True,
        highlight=False,
    )
    return 0


def print_timeline(console: Console, timeline: Timeline, t0: float) -> None:
    """Print the timeline's alert and incident events in event-time order, times after ``t0``."""
    from rich.markup import escape

    from pipeline.schema import AlertEvent

    events = timeline.lines()
    width = max([FAULT_WIDTH, *(len(x.fault) for x in events if isinstance(x, AlertEvent))])
    console.print(f"timeline: times are seconds after {_wall(t0)} (the simulation's start)", highlight=False)
    if not events:
        console.print("  no alerts", highlight=False)
    for x in events:
        if isinstance(x, AlertEvent):
            style = _STYLE.get(x.severity, "") if x.state == "firing" else "green"
            text = f"[{style}]{escape(alert_line(x, t0, width))}[/]"
        else:
            text = f"[bold magenta]{escape(incident_line(x, t0))}[/]"
        console.print(text, highlight=False, soft_wrap=True, markup=True)


def fault_table(matches: list[Any], t0: float) -> Table:
    """One row per injected fault: where, when, how soon an alert found it and that alert's fault."""
    from rich.table import Table

    table = Table(title="Injected faults vs alerts", min_width=60)
    for col in ("injected fault", "culprit", "onset", "found after", "right GPU", "by"):
        # A name too long for a narrow terminal folds onto a second line rather than losing its end.
        table.add_column(col, overflow="fold")
    for m in matches:
        lab = m.label
        table.add_row(
            lab["fault"],
            _where(str(lab.get("host")), lab.get("gpu")),
            f"+{float(lab['onset']) - t0:.0f}s",
            f"[green]{m.latency:.0f}s[/]" if m.latency is not None else "[red]missed[/]",
            {True: "yes", False: "[red]no[/]", None: "-"}[m.right_gpu],
            m.alert.fault if m.alert else "-",
        )
    return table


def incident_table(events: list[IncidentEvent], labels: list[dict]) -> Table:
    """One row per incident, as its last event left it, with the injected fault it covers."""
    from rich.table import Table

    from pipeline.incidents.scoring import match_incidents

    last: dict[str, IncidentEvent] = {}
    for e in events:
        last[e.incident] = e
    table = Table(title="Incidents: one per root cause", min_width=60)
    for col in ("incident", "where", "root", "alerts", "severity", "action", "state", "injected fault"):
        table.add_column(col, no_wrap=col in ("incident", "alerts"), overflow="fold")
    for e in last.values():
        m = match_incidents(labels, [x for x in events if x.incident == e.incident])
        fault = ", ".join(lab["fault"] for lab, hit in zip(m.faults, m.covered) if hit) or "[red]none[/]"
        table.add_row(
            e.incident,
            _where(e.host, e.gpu),
            e.root.fault,
            str(len(e.members) + e.more_members),
            e.severity,
            e.action,
            "resolved" if e.state == "resolved" else "open",
            fault,
        )
    return table
