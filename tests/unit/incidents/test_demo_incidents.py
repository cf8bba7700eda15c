"""The demo prints incidents: one per injected fault."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pipeline.demo import run_demo


def _demo(**kw) -> str:
    buf = io.StringIO()
    assert run_demo(console=Console(file=buf, width=200), **kw) == 0
    return buf.getvalue()


def test_the_short_demo_prints_one_incident_per_injected_fault() -> None:
    out = _demo(hosts=4, duration=600)
    assert "Incidents: one per root cause" in out and "INCIDENT opened" in out
    assert "8 incident(s) for 8 injected fault(s)" in out
    assert "8/8 faults in an incident on their host, 8/8 in one of their own; 0 incident(s) matched no injected fault" in out


@pytest.mark.slow
def test_the_default_demo_prints_one_incident_per_injected_fault() -> None:
    # `make demo`: 8 hosts, 1500 s, seed 7 -- about 30 firing alerts for 8 faults.
    out = _demo()
    assert "8 incident(s) for 8 injected fault(s) from " in out
    assert "0 incident(s) matched no injected fault" in out


def test_a_broken_incidents_config_beside_the_rules_stops_the_demo(tmp_path) -> None:
    from pipeline.resources import rules_dir

    for f in rules_dir().glob("*.yaml"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "incidents.yaml").write_text("quiet: soon\n")
    buf = io.StringIO()
    assert run_demo(hosts=1, duration=60, console=Console(file=buf, width=200), rules=str(tmp_path)) == 1
    assert "incidents.yaml:1:8: quiet: 'soon' is not a duration" in buf.getvalue()
