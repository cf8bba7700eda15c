"""What ``gpuwarden demo`` prints reads right to an operator: one timeline in event-time order,
each fault under one name (the alert's ``fault``, as replay counts them), every escalation shown
and counts that add up."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pipeline.incidents import IncidentEvent
from pipeline.incidents.events import IncidentRoot
from pipeline.schema import AlertEvent

_LINE = re.compile(r"^\+\s*(\d+)s ")


@pytest.fixture(scope="module")
def default_demo() -> str:
    """The demo as `make demo` runs it (its defaults), piped: about 10 s."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo"], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _timeline(out: str) -> list[str]:
    return [line for line in out.splitlines() if _LINE.match(line)]


def _fields(line: str) -> list[str]:
    """A timeline line's words after its "+Ns" time."""
    m = _LINE.match(line)
    assert m
    return line[m.end() :].split()


def _fired(out: str) -> set[str]:
    """The fault of every FIRING line (its third word: FIRING, severity, fault)."""
    return {_fields(line)[2] for line in _timeline(out) if _fields(line)[0] == "FIRING"}


def _table_column(out: str, title: str, column: str) -> list[str]:
    lines = out[out.index(title) :].splitlines()
    header = next(i for i, line in enumerate(lines) if column in line and "┃" in line)
    cols = [c.strip() for c in lines[header].strip("┃").split("┃")]
    k = cols.index(column)
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("│"):
            break
        rows.append([c.strip() for c in line.strip("│").split("│")][k])
    return rows


def test_the_timeline_is_in_event_time_order(default_demo: str) -> None:
    times = [int(_LINE.match(line).group(1)) for line in _timeline(default_demo)]  # type: ignore[union-attr]
    assert len(times) > 40
    late = [
        (a, b)
        for a, b, ta, tb in zip(_timeline(default_demo), _timeline(default_demo)[1:], times, times[1:])
        if tb < ta
    ]
    assert not late, late


def test_incident_lines_and_tables_name_a_fault_as_its_alerts_do(default_demo: str) -> None:
    fired = _fired(default_demo)
    roots = [m.group(1) for m in re.finditer(r"INCIDENT opened .* root (\S+?);", default_demo)]
    assert roots and set(roots) <= fired, set(roots) - fired
    # The HBM incident opens on the SBE-rate model's alert: named by its fault, not the model.
    assert "root hbm_sbe_rate_anomaly;" in default_demo and "root hbm_sbe_rate;" not in default_demo
    assert set(_table_column(default_demo, "Incidents: one per root cause", "root")) <= fired
    by = _table_column(default_demo, "Injected faults vs alerts", "by")
    assert by and set(by) - {"-"} <= fired, set(by) - fired


def test_every_action_an_incident_reached_is_on_the_timeline(default_demo: str) -> None:
    ids = _table_column(default_demo, "Incidents: one per root cause", "incident")
    actions = _table_column(default_demo, "Incidents: one per root cause", "action")
    assert "drain_node" in actions
    for inc, action in zip(ids, actions):
        assert any(inc in line and f"action {action}" in line for line in _timeline(default_demo)), (inc, action)
    assert "INCIDENT escalated" in default_demo


def test_the_alert_counts_add_up(default_demo: str) -> None:
    m = re.search(
        r"(\d+)/(\d+) injected faults detected by (\d+) firing alert\(s\); (\d+) more alert\(s\) are knock-on"
        r".*; (\d+) firing alert\(s\) matched no injected fault",
        default_demo,
    )
    assert m, default_demo[-2000:]
    on_faults, knock, stray = int(m.group(3)), int(m.group(4)), int(m.group(5))
    firing = sum(_fields(line)[0] == "FIRING" for line in _timeline(default_demo))
    assert on_faults + knock + stray == firing
    assert f"from {firing} firing alert(s)" in default_demo


def test_relative_times_say_what_they_count_from(default_demo: str) -> None:
    # Alert summaries give wall-clock times ("since 2025-11-29 08:16:59Z"); the "+Ns" column
    # must name its zero in the same format so the two can be compared.
    stamps = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", default_demo)
    assert stamps
    zero = re.search(r"times are seconds after (\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ)", default_demo)
    assert zero, default_demo[:600]
    assert zero.group(1) <= min(stamps)


def test_one_dead_letter_is_not_plural(default_demo: str) -> None:
    assert "1 dead letters" not in default_demo
    assert re.search(r"\d+ dead letter\(s\) on gpuwarden\.dlq", default_demo)


def test_help_gives_units_and_defaults() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    text = " ".join(proc.stdout.split())
    assert "seconds of event time (default 1500)" in text
    assert "(default 8)" in text and "(default 7)" in text and "(default mixed)" in text


def _alert(fault: str, rule: str, ts: float, state: str = "firing") -> AlertEvent:
    return AlertEvent(
        id=f"{rule}-{ts}",
        state=state,
        fault=fault,
        severity="warning",
        rule=rule,
        host="n1",
        gpu=0,
        ts=ts,
        started_at=ts - 5 if state == "resolved" else ts,
        summary="s",
    )


def _incident(state: str, ts: float, changes: list[str] | None = None, action: str = "watch") -> IncidentEvent:
    return IncidentEvent(
        incident="inc-1",
        state=state,
        ts=ts,
        opened_at=100.0,
        host="n1",
        gpu=0,
        root=IncidentRoot(alert="a", rule="hbm_sbe_rate", fault="hbm_sbe_rate_anomaly"),
        members=["a", "b"],
        severity="critical",
        action=action,
        changes=changes or [],
    )


def test_lines_name_the_fault_and_keep_their_columns() -> None:
    from pipeline.demo import alert_line, incident_line

    short = alert_line(_alert("hbm_ecc_burst", "hbm_sbe_burst", 110.0), 100.0)
    long = alert_line(_alert("thermal_hbm_cooling_degraded", "gpu_hbm_cooling_degraded", 110.0), 100.0)
    assert "hbm_ecc_burst" in short and "hbm_sbe_burst" not in short
    # The host column starts at the same place whatever the fault's length.
    assert short.index("n1/GPU0") == long.index("n1/GPU0")
    opened = incident_line(_incident("opened", 100.0), 100.0)
    assert "root hbm_sbe_rate_anomaly;" in opened
    esc = incident_line(_incident("updated", 120.0, ["alert_joined", "action_escalated"], "drain_node"), 100.0)
    assert "INCIDENT escalated" in esc and "action drain_node" in esc and "alert_joined" not in esc


def test_an_escalation_is_shown_and_a_plain_join_is_not() -> None:
    from pipeline.demo import shown

    assert shown(_incident("opened", 100.0)) and shown(_incident("resolved", 300.0))
    assert shown(_incident("updated", 120.0, ["alert_joined", "severity_rose"]))
    assert not shown(_incident("updated", 120.0, ["alert_joined"]))


def test_the_timeline_sorts_by_time_and_keeps_ties_in_arrival_order() -> None:
    from pipeline.demo import Timeline

    t = Timeline()
    t.add(10.0, "a")
    t.add(5.0, "b")
    t.add(10.0, "c")
    t.add(5.0, "d")
    assert t.lines() == ["b", "d", "a", "c"]
