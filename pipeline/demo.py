"""``gpuwarden demo``: simulated fleet -> in-process bus -> engine -> alerts -> incidents, in
under a minute.

The same pieces as production, with the in-process bus standing in for Kafka: the simulator
publishes one message per host per second to ``gpuwarden.telemetry``, a consumer feeds the
engine, alerts go to ``gpuwarden.alerts`` and are printed as they fire, and the incident stage
groups them: one incident per root cause, printed as it opens, escalates and resolves.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.bus import MemoryBus, Topics, send_all
from pipeline.bus.sinks import BusOutput
from pipeline.bus.telemetry import per_host_messages
from pipeline.incidents import IncidentEvent, IncidentStage, default_config
from pipeline.incidents.config import IncidentConfigError
from pipeline.incidents.scoring import match_incidents
from pipeline.rules.loader import describe_loaded
from pipeline.runner import Pipeline
from pipeline.schema import AlertEvent, DeadLetter
from pipeline.scoring import knock_on, match_faults

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def alert_line(a: AlertEvent, t0: float) -> str:
    """One readable line per alert state change."""
    where = a.host or "-"
    if a.gpu is not None:
        where += f"/GPU{a.gpu}"
    if a.state == "firing":
        return f"+{a.ts - t0:5.0f}s FIRING   {a.severity:<8} {a.fault:<22} {where:<18} {a.summary}"
    return f"+{a.ts - t0:5.0f}s resolved {a.severity:<8} {a.fault:<22} {where:<18} after {a.ts - a.started_at:.0f}s"


def incident_line(e: IncidentEvent, t0: float) -> str:
    """One readable line per incident opened, escalated or resolved."""
    where = (e.host or "-") + (f"/GPU{e.gpu}" if e.gpu is not None else "")
    head = f"+{e.ts - t0:5.0f}s INCIDENT {e.state:<8} {e.incident} {where:<18}"
    if e.state == "opened":
        return f"{head} root {e.root.rule}; action {e.action}" + (f" ({e.reason})" if e.reason else "")
    if e.state == "resolved":
        return f"{head} {len(e.members) + e.more_members} alert(s), {e.severity}, action {e.action}"
    return f"{head} action {e.action}: {e.reason or ', '.join(e.changes)}"


def run_demo(
    hosts: int = 8,
    duration: float = 1200.0,
    seed: int = 7,
    scenario: str = "mixed",
    console: Console | None = None,
    rules: str | None = None,
    models: str | None = "auto",
) -> int:
    from producers.sim import Simulator

    from pipeline.detection import build_detector

    # Piped output (CI logs, tee) gets a log-friendly width instead of rich's 80 columns.
    console = console or Console(width=None if sys.stdout.isatty() else 140, soft_wrap=True)
    sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=scenario)
    topics = Topics()
    bus = MemoryBus(partitions=4)
    producer = bus.producer()
    consumer = bus.consumer(topics.telemetry, group="gpuwarden-demo")
    from pipeline.resources import rules_dir as default_rules

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
    t_start = time.perf_counter()
    t0 = None
    console.print(
        f"[bold]gpuwarden demo[/]: {hosts} hosts x 8 GPUs, {duration:.0f}s of event time, "
        f"scenario [cyan]{scenario}[/], seed {seed}, in-process bus, "
        + escape(describe_loaded(engine.rules, engine.models, str(rules_dir)))
    )

    # Every alert goes to the alerts topic and is printed as it fires; dead letters to the DLQ.
    sink = BusOutput(producer, topics)

    def publish(out_alerts: list[AlertEvent], dead: list[DeadLetter]) -> None:
        sink.alerts(out_alerts)
        sink.dead(dead)
        sink.flush()
        for a in out_alerts:
            style = _STYLE.get(a.severity, "") if a.state == "firing" else "green"
            progress.console.print(
                f"[{style}]{alert_line(a, t0 or a.ts)}[/]", highlight=False, soft_wrap=True, markup=True
            )
        alerts.extend(out_alerts)
        # Opened, escalated and resolved incidents are printed; an alert joining is in its own line.
        for e in stage.process(out_alerts):
            incidents.append(e)
            if e.state != "updated" or e.policy:
                progress.console.print(
                    f"[bold magenta]{incident_line(e, t0 or e.ts)}[/]", highlight=False, soft_wrap=True, markup=True
                )

    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}s event time"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("replaying fleet", total=duration, rate="")
        for batch in sim.batches():
            if not batch:
                continue
            if t0 is None:
                t0 = batch[0]["ts"]
            send_all(producer, topics.telemetry, per_host_messages(batch))
            out = pipe.handle(consumer.poll(max_records=100_000))
            consumer.commit()
            publish(out.alerts, out.dead)
            elapsed = time.perf_counter() - t_start
            progress.update(
                task, completed=batch[0]["ts"] - t0, rate=f"{pipe.totals.records / max(elapsed, 1e-9):,.0f} records/s"
            )
        out = pipe.flush()
        publish(out.alerts, out.dead)
    sink.close()

    elapsed = time.perf_counter() - t_start
    totals = pipe.totals
    console.print(
        f"\n{totals.records:,} records ({totals.messages:,} messages) in {elapsed:.1f}s; "
        f"{len(bus.messages(topics.alerts))} alert events on {topics.alerts}, "
        f"{len(bus.messages(topics.dlq))} dead letters on {topics.dlq} "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(totals.dead.items())) or 'none'})"
    )
    matches, unmatched = match_faults(sim.labels(), alerts)
    table = Table(title="Injected faults vs alerts", min_width=60)
    for col in ("injected fault", "culprit", "onset", "found after", "right GPU", "by"):
        table.add_column(col, no_wrap=True)
    for m in matches:
        lab = m.label
        culprit = str(lab.get("host")) + (f"/GPU{lab['gpu']}" if lab.get("gpu") is not None else "")
        table.add_row(
            lab["fault"],
            culprit,
            f"+{float(lab['onset']) - (t0 or 0):.0f}s",
            f"[green]{m.latency:.0f}s[/]" if m.latency is not None else "[red]missed[/]",
            {True: "yes", False: "[red]no[/]", None: "-"}[m.right_gpu],
            m.alert.rule if m.alert else "-",
        )
    console.print(table)
    labels = sim.labels()
    knock = [a for a in unmatched if knock_on(a, labels)]
    console.print(
        f"{sum(m.detected for m in matches)}/{len(matches)} injected faults detected; "
        f"{len(knock)} more alert(s) are knock-on effects on a faulty GPU or host (e.g. a throttled GPU "
        f"is also an NCCL straggler); {len(unmatched) - len(knock)} firing alert(s) matched no injected fault."
    )
    console.print(incident_table(incidents, labels))
    im = match_incidents(labels, incidents)
    firing = sum(a.state == "firing" for a in alerts)
    console.print(
        f"{len(im.incidents)} incident(s) for {len(im.faults)} injected fault(s) from {firing} firing alert(s); "
        f"{im.found}/{len(im.faults)} faults in an incident on their host; "
        f"{len(im.stray)} incident(s) matched no injected fault.",
        soft_wrap=True,
    )
    return 0


def incident_table(events: list[IncidentEvent], labels: list[dict]) -> Table:
    """One row per incident, as its last event left it, with the injected fault it covers."""
    last: dict[str, IncidentEvent] = {}
    for e in events:
        last[e.incident] = e
    table = Table(title="Incidents: one per root cause", min_width=60)
    for col in ("incident", "where", "root", "alerts", "severity", "action", "state", "injected fault"):
        table.add_column(col, no_wrap=col in ("incident", "alerts"))
    for e in last.values():
        m = match_incidents(labels, [x for x in events if x.incident == e.incident])
        fault = ", ".join(lab["fault"] for lab, hit in zip(m.faults, m.covered) if hit) or "[red]none[/]"
        table.add_row(
            e.incident,
            (e.host or "-") + (f"/GPU{e.gpu}" if e.gpu is not None else ""),
            e.root.rule,
            str(len(e.members) + e.more_members),
            e.severity,
            e.action,
            "resolved" if e.state == "resolved" else "open",
            fault,
        )
    return table
