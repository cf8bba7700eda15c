"""NVSentinel's non-fatal NIC rate checks and the lost port (#34, ``rules/fabric/ports.yaml``):
each fires on the rate it names whether ports are sampled every 1, 10 or 30 s, and stays quiet
under it, on a congested fabric and on a fault-free fleet; a port that stops being reported
while its host reports the others is lost, a host that goes silent is not."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine import Engine, EngineConfig
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from tests.factories import T0
from tests.unit.rules.factories import port_series, run_ports

STEPS = [1.0, 5.0, 10.0, 30.0]


def fired(alerts, rule):
    return [a for a in alerts if a.rule == rule and a.state == "firing"]


def _counter(name, per_s, start=600.0, stop=1200.0, base=14):
    """``name`` at ``base``, climbing ``per_s`` a second between ``start`` and ``stop``."""
    return lambda t: {name: base + int(per_s * (min(max(t, start), stop) - start))}


# NVSentinel nic-health-monitor values.yaml: port_rcv_errors 10/s, link_error_recovery 5/min,
# symbol_error 10/s, local_ack_timeout_err 1/s, roce_slow_restart 10/s.
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("counter, rule, over, under", [
    ("port_rcv_errors", "network_rcv_errors", 25.0, 4.0),
    ("link_error_recovery", "network_link_error_recovery", 12 / 60, 3 / 60),
    ("symbol_error", "network_symbol_error_rate", 25.0, 4.0),
    ("local_ack_timeout_err", "network_ack_timeouts", 3.0, 0.5),
    ("roce_slow_restart", "network_roce_slow_restart", 25.0, 4.0),
])  # fmt: skip
def test_a_rate_over_nvsentinels_bound_fires_at_any_sampling(step, counter, rule, over, under):
    alerts, _ = run_ports(port_series(2400, step=step, counters=_counter(counter, over)))
    got = fired(alerts, rule)
    assert len(got) == 1, [(a.rule, a.state, a.ts - T0) for a in alerts]
    a = got[0]
    window = 60.0 if counter == "link_error_recovery" else 1.0
    # Found within one span (the window, or the sample step when that is longer) of the onset.
    assert 600.0 <= a.ts - T0 <= 600.0 + 2 * max(step, window)
    assert (a.severity, a.fault, a.host, a.labels["device"]) == ("warning", rule, "n1", "mlx5_0")
    r = a.evidence["rates"][rule]
    assert r["rate"] > (5 if counter == "link_error_recovery" else 1) and r["over_s"] >= window - 1e-6
    assert counter in a.summary and "NVSentinel" in a.summary
    # It resolves after keep_firing_for (10m) past the rate's end.
    res = [x for x in alerts if x.rule == rule and x.state == "resolved"]
    assert res and 1200.0 + 600.0 - 1e-6 <= res[0].ts - T0 <= 1200.0 + 600.0 + 2 * max(step, window)
    quiet, _ = run_ports(port_series(1800, step=step, counters=_counter(counter, under)))
    assert fired(quiet, rule) == []


@pytest.mark.parametrize("step", STEPS)
def test_carrier_changes_more_than_two_in_an_interval(step):
    # One flap is two carrier changes (down, up): NVSentinel's delta > 2 asks for more.
    def flaps(changes):
        return lambda t: {"carrier_changes": 1 + (changes if t >= 600 else 0)}

    assert fired(run_ports(port_series(1200, step=step, counters=flaps(2)))[0], "network_carrier_changes") == []
    got = fired(run_ports(port_series(1200, step=step, counters=flaps(4)))[0], "network_carrier_changes")
    assert [a.ts - T0 for a in got] == [600.0]
    assert got[0].evidence["in_window"]["network_carrier_changes"] == 4 and "carrier_changes" in got[0].summary


def test_a_counter_reset_restarts_the_span_without_a_verdict():
    # The driver reloads at 600 s: port_rcv_errors falls from 10**6 to 0, then climbs slowly.
    recs = port_series(1200, step=10, counters=lambda t: {"port_rcv_errors": 10**6 if t < 600 else int(t - 600)})
    assert run_ports(recs)[0] == []


def test_port_xmit_discards_is_off_by_default_and_on_in_the_baseline():
    from pathlib import Path

    recs = port_series(1200, step=10, counters=_counter("port_xmit_discards", 400.0))
    assert run_ports(recs)[0] == []
    baseline = Path(__file__).resolve().parents[3] / "rules" / "baselines" / "fabric" / "ports.yaml"
    got = fired(run_ports(recs, config_text=baseline.read_text())[0], "network_xmit_discards")
    assert len(got) == 1


@pytest.mark.parametrize("step", STEPS)
def test_a_congested_or_fault_free_fleet_stays_quiet_at_any_sampling(step):
    # 4 hosts x 8 ports for 20 minutes; a congested fabric (the simulator's network_congestion):
    # xmit_wait and discards climb, the data counters run at line rate; healthy PAM4 links: a few
    # symbol errors an hour, an old port_rcv_errors count, one carrier change since boot.
    recs = []
    for h in range(4):
        for p in range(8):
            def counters(t, p=p):
                return {"symbol_error": 150 + int(t // 900), "port_rcv_errors": 14, "link_error_recovery": 2,
                        "carrier_changes": 1, "local_ack_timeout_err": 3 + int(t // 600),
                        "port_xmit_wait": 2489603687 + int(t) * 5 * 10**7, "port_xmit_discards": int(t) * 400,
                        "port_rcv_data": int(t) * 10**10, "roce_slow_restart": 0}  # fmt: skip
            recs += port_series(1200, step=step, host=f"n{h}", device=f"mlx5_{p}", counters=counters, gpus=[p])
    alerts, eng = run_ports(recs, batch=4 * 8 * 5)
    assert alerts == []


def test_the_rate_checks_survive_a_restore():
    recs = sorted(port_series(1800, step=10, counters=_counter("port_rcv_errors", 25.0))
                  + port_series(1800, step=10, device="mlx5_1", counters=_counter("link_error_recovery", 0.2)),
                  key=lambda r: r.ts)  # fmt: skip
    want, _ = run_ports(recs)
    assert {a.rule for a in want} == {"network_rcv_errors", "network_link_error_recovery"}
    cfg, _ = parse_port_config("")
    for cut in (61, 121, 125):
        first = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
        got = first.process(recs[:cut]).alerts
        second = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
        second.restore(first.snapshot())
        got += second.process(recs[cut:]).alerts + second.flush().alerts
        assert [(a.id, a.state, a.ts) for a in got] == [(a.id, a.state, a.ts) for a in want]


def test_a_bad_rate_setting_is_refused_with_its_position():
    cfg, diags = parse_port_config("rcv_errors: {threshold: -3}\nport_lost: {counters: [x]}\n", "p.yaml")
    assert cfg is None and [(d.line, d.code) for d in diags] == [(1, "R006"), (2, "R004")]
    cfg, diags = parse_port_config("link_error_recovery: {threshold: 2, window: 5m}\nxmit_discards: {enabled: true}")
    assert diags == [] and cfg.checks["link_error_recovery"].window_s == 300.0 and cfg.checks["xmit_discards"].enabled


# -- the lost port ----------------------------------------------------------------------------


def _host(seconds, step, ports=4, host="n1", gone=None, silent=None):
    """``ports`` ports of ``host`` every ``step`` s; ``gone(t, p)``: port p left out at t;
    ``silent(t)``: the whole host sends nothing at t."""
    recs = []
    for p in range(ports):
        for r in port_series(seconds, step=step, host=host, device=f"mlx5_{p}", gpus=[p],
                             counters=lambda t: {"link_downed": 0}):  # fmt: skip
            t = r.ts - T0
            if (gone and gone(t, p)) or (silent and silent(t)):
                continue
            recs.append(r)
    return recs


@pytest.mark.parametrize("step", [*STEPS, 60.0])
def test_a_port_that_stops_being_reported_is_lost(step):
    recs = _host(1800, step, gone=lambda t, p: p == 2 and 600 <= t < 1200) + _host(1800, step, host="n2")
    alerts, _ = run_ports(recs)
    lost = [a for a in alerts if a.rule == "network_port_lost"]
    assert [(a.state, a.host, a.labels["device"]) for a in lost] == [("firing", "n1", "mlx5_2"),
                                                                      ("resolved", "n1", "mlx5_2")]
    after = max(30.0, 2.5 * step)
    last = 600.0 - step
    assert last + after < lost[0].ts - T0 <= last + after + step
    assert lost[1].ts - T0 == 1200.0
    a = lost[0]
    assert (a.severity, a.fault, a.labels["gpus"]) == ("critical", "network_port_lost", "2")
    assert a.evidence["host_ports"] == 3 and a.evidence["last_seen"] == T0 + last
    assert "mlx5_2 port 1 on n1 is no longer reported" in a.summary


@pytest.mark.parametrize("step", STEPS)
def test_a_host_gone_silent_loses_no_port(step):
    # The whole host is silent for 10 minutes (telemetry_gap's case), then back with every port.
    quiet = _host(1800, step, silent=lambda t: 600 <= t < 1200)
    assert [a.rule for a in run_ports(quiet)[0]] == []
    # Back without one port: lost after the same grace, counted from its return.
    back = _host(1800, step, silent=lambda t: 600 <= t < 1200, gone=lambda t, p: p == 1 and t >= 600)
    lost = fired(run_ports(back)[0], "network_port_lost")
    assert [a.labels["device"] for a in lost] == ["mlx5_1"]
    assert 1200.0 + max(30.0, 2.5 * step) < lost[0].ts - T0 <= 1200.0 + max(30.0, 2.5 * step) + step


def test_a_missed_sample_or_a_slow_poll_is_not_a_lost_port():
    # One poll of one port missing (a sysfs read that failed), and one poll 50 s late.
    recs = _host(1800, 10, gone=lambda t, p: (p == 0 and t == 500) or 900 < t < 950)
    assert run_ports(recs)[0] == []


def test_the_lost_port_survives_a_restore():
    recs = sorted(_host(1800, 10, gone=lambda t, p: p == 3 and t >= 600), key=lambda r: r.ts)
    want, _ = run_ports(recs)
    assert [(a.rule, a.state) for a in want] == [("network_port_lost", "firing")]
    cfg, _ = parse_port_config("")
    first = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    got = first.process(recs[:250]).alerts
    second = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    second.restore(first.snapshot())
    got += second.process(recs[250:]).alerts + second.flush().alerts
    assert [(a.id, a.state, a.ts) for a in got] == [(a.id, a.state, a.ts) for a in want]


def _aer(seconds, step, host="n1", ports=4, offset=3.0, until=None):
    """``produce pcie-aer``'s NIC records: each NIC's AER totals, no port state, on their own clock."""
    from pipeline.schema import NicRecord

    return [NicRecord(ts=T0 + t, host=host, device=f"mlx5_{p}", port=1, counters={"pcie_aer_fatal": 0},
                      gpus=[p]) for t in np.arange(offset, until if until is not None else seconds, step)
            for p in range(ports)]  # fmt: skip


def test_a_nics_aer_records_neither_keep_a_lost_port_alive_nor_lose_one():
    # The port mlx5_2 leaves the ib-sysfs polls while pcie-aer still reports its NIC: it is lost.
    recs = _host(1800, 10.0, gone=lambda t, p: p == 2 and t >= 600) + _aer(1800, 10.0)
    lost = fired(run_ports(recs)[0], "network_port_lost")
    assert [a.labels["device"] for a in lost] == ["mlx5_2"]
    # pcie-aer stopping (or polling slowly) loses no port the ib-sysfs polls still show.
    quiet = _host(1800, 10.0) + _aer(1800, 60.0, until=300)
    assert fired(run_ports(quiet)[0], "network_port_lost") == []
