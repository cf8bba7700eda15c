"""A review of the NIC port checks and the NICs' AER checks against what real ports do
(``pipeline/rules/ports.py``, ``portrates.py``, ``nicaer.py``): producer restarts and irregular
polls, a poll delivered twice (the producers send at least once), a record that says no state,
counters at the IBTA widths' maxima (they stop there) and at 2^64-1, counter resets
(``perfquery -R``, a driver reload), ports that go away and come back, hosts with storage NICs
beside the eight, and sampling at 1, 5, 10 and 30 s."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from pipeline.engine import Engine, EngineConfig
from pipeline.rules.nicaer import NicAerStage
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import NicRecord, dcgm
from tests.factories import T0
from tests.unit.rules.factories import port_series, run_ports

MAX64 = (1 << 64) - 1


def _show(alerts):
    return [(a.rule, a.state, round(a.ts - T0, 3), a.labels.get("device")) for a in alerts]


def _fired(alerts, rule):
    return [a for a in alerts if a.rule == rule and a.state == "firing"]


def _polls(times, ports=4, host="n1", gone=None):
    """``ports`` ACTIVE ports of ``host`` polled at ``times`` (one ts a poll, as ``ib-sysfs``
    stamps them); ``gone(t, p)``: port p left out of the poll at t."""
    return [NicRecord(ts=T0 + t, host=host, device=f"mlx5_{p}", port=1, state=4, phys_state=5, rate_gbps=400.0,
                      counters={"link_downed": 0}, gpus=[p])
            for t in times for p in range(ports) if not (gone and gone(t, p))]  # fmt: skip


# -- the lost port after a short gap between polls ---------------------------------------------


def _restarted(interval, period_over=0.0, restart_at=300.0, restart_gap=3.0, until=3000.0):
    """Poll times of a producer polling every ``interval`` (plus ``period_over`` each period: its
    wake-up latency, ``producers.common.run`` sleeps the interval less the poll's time) that was
    restarted once near ``restart_at`` and polled again ``restart_gap`` seconds later."""
    times, t, done = [], 0.0, False
    while t < until:
        times.append(t)
        if not done and t >= restart_at:
            t += restart_gap
            times.append(t)
            done = True
        t += interval + period_over
    return times


@pytest.mark.parametrize("interval, over", [(30.0, 0.002), (60.0, 0.0), (45.0, 0.0)])
def test_a_port_lost_after_a_producer_restart_is_still_found(interval, over):
    # One short gap (a restarted producer polls at once) must not make every later gap look
    # like a host back from a silence: the port that leaves the polls at 1200 s is lost.
    times = _restarted(interval, over)
    gone = lambda t, p: p == 2 and t >= 1200  # noqa: E731
    alerts, _ = run_ports(_polls(times, gone=gone))
    lost = _fired(alerts, "network_port_lost")
    assert [a.labels["device"] for a in lost] == ["mlx5_2"], _show(alerts)
    after = max(30.0, 2.5 * (interval + over))
    assert 1200.0 + after - interval - over < lost[0].ts - T0 <= 1200.0 + after + interval + over
    # And without the lost port, the restart alone raises nothing.
    assert run_ports(_polls(times))[0] == []


def test_a_host_back_from_a_silence_still_gets_its_grace_and_then_loses_a_port():
    # Polls every 60 s, a 20-minute silence (no NIC records at all), then back without mlx5_1:
    # no alert for the silence, the port lost once the grace (2.5 polls) from the return ran out.
    times = [t for t in range(0, 4800, 60) if not 1200 <= t < 2400]
    alerts, _ = run_ports(_polls(times, gone=lambda t, p: p == 1 and t >= 2400))
    lost = _fired(alerts, "network_port_lost")
    assert [a.labels["device"] for a in lost] == ["mlx5_1"], _show(alerts)
    assert 2400.0 + 150.0 < lost[0].ts - T0 <= 2400.0 + 150.0 + 60.0


# -- a poll delivered twice --------------------------------------------------------------------


def _node(seconds, ports, model="NVIDIA H100 80GB HBM3", host="n1", states=None, rates=None):
    recs = [dcgm(T0 + t, host, g, {"gpu_temp": 60}, model=model) for t in range(0, int(seconds), 10) for g in range(2)]
    for p in range(ports):
        rs = port_series(seconds, host=host, device=f"mlx5_{p}", gpus=[p] if p < 8 else [],
                         states=(lambda t, p=p: states(t, p)) if states else None)  # fmt: skip
        if rates:
            rs = [replace(r, rate_gbps=rates(r.ts - T0, p)) for r in rs]
        recs += rs
    return recs


def test_a_poll_delivered_twice_counts_each_active_port_once():
    # Seven of eight ports: the host is short whatever the delivery. The producers send at least
    # once (docs/producers.md), so a batch may come twice; 7 ports twice are not 14 ports.
    recs = _node(3600, ports=7)
    twice = [r for r in recs if isinstance(r, NicRecord) and 600 <= r.ts - T0 < 1200]
    alerts, _ = run_ports(recs + twice)
    low = [a for a in alerts if a.rule == "network_active_ports_low"]
    assert [(a.state, a.ts - T0) for a in low] == [("firing", 240.0)], _show(alerts)
    assert low[0].evidence["active_ports"] == 7


def test_duplicates_change_no_other_check():
    # A down port, errors and a reset, each record delivered twice: the same alerts as once.
    def states(t):
        return (1, 3) if 600 <= t < 700 else (4, 5)

    def counters(t):
        return {"link_downed": int(t >= 800), "symbol_error": int(t) if t < 2000 else 3, "carrier_changes": 0}

    once = port_series(3600, step=10.0, states=states, counters=counters)
    want, _ = run_ports(once)
    got, _ = run_ports(once + once)
    assert _show(got) == _show(want)


# -- a record that says no state ---------------------------------------------------------------


def test_a_record_that_says_no_state_neither_resolves_nor_refires_a_down_port():
    # The port is DOWN from 200 s; two of its records (a state file that did not read) carry its
    # counters but no state. Unknown is not up: one alert, firing until the port is ACTIVE again.
    recs = port_series(900, step=10.0, states=lambda t: (4, 5) if t < 200 or t >= 700 else (1, 3),
                       counters=lambda t: {"link_downed": 0})  # fmt: skip
    blank = {300.0, 400.0}
    recs = [replace(r, state=None, phys_state=None, state_name=None, phys_state_name=None)
            if r.ts - T0 in blank else r for r in recs]  # fmt: skip
    alerts, _ = run_ports(recs)
    down = [(a.state, a.ts - T0) for a in alerts if a.rule == "network_port_down"]
    assert down == [("firing", 200.0), ("resolved", 700.0)], _show(alerts)


def test_a_record_that_says_no_state_does_not_reset_a_degraded_ports_for():
    # Polling from 100 s at 10 s sampling, one state-less record at 120 s: still 30 s degraded.
    recs = port_series(400, step=10.0, states=lambda t: (4, 5) if t < 100 or t >= 300 else (2, 2),
                       counters=lambda t: {"link_downed": 0})  # fmt: skip
    recs = [replace(r, state=None, phys_state=None, state_name=None, phys_state_name=None)
            if r.ts - T0 == 120.0 else r for r in recs]  # fmt: skip
    deg = [(a.state, a.ts - T0) for a in run_ports(recs)[0] if a.rule == "network_port_degraded"]
    assert deg == [("firing", 130.0), ("resolved", 300.0)]


# -- counters at 2^64-1 ------------------------------------------------------------------------


def _snapshot_round_trip(engine, stages):
    blob = engine.snapshot()
    other = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=stages)
    other.restore(blob)
    return other


def test_aer_totals_at_2_64_keep_the_snapshot_whole():
    # Two corrected totals (the NIC's and its bridges') each jumping to 2^64-1, a value the
    # decoder accepts: their increases summed pass 2^64-1, which no snapshot can hold.
    cfg, _ = parse_port_config("")
    engine = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[NicAerStage(cfg)])
    recs = [NicRecord(ts=T0 + t, host="n1", device="mlx5_0", port=1,
                      counters={"pcie_aer_correctable": MAX64 if t >= 50 else 0,
                                "pcie_aer_upstream_correctable": MAX64 if t >= 50 else 0})
            for t in range(0, 100, 10)]  # fmt: skip
    alerts = engine.process(recs).alerts
    assert [(a.rule, a.state) for a in alerts] == [("nic_pcie_aer_correctable_rate", "firing")]
    other = _snapshot_round_trip(engine, [NicAerStage(cfg)])
    assert other.flush().alerts == engine.flush().alerts


def test_port_counters_summed_past_2_64_keep_the_snapshot_whole():
    # Checks set to sum two counters (the file allows up to 64), each at 2^64-1.
    text = ("rcv_errors: {counters: [port_rcv_errors, port_rcv_remote_physical_errors]}\n"
            "carrier_changes: {counters: [carrier_changes, link_downed], window: 1m}\n"
            "symbol_errors: {counters: [symbol_error, link_error_recovery]}\n")  # fmt: skip
    cfg, diags = parse_port_config(text)
    assert cfg is not None and diags == []
    names = ("port_rcv_errors", "port_rcv_remote_physical_errors", "carrier_changes", "link_downed", "symbol_error",
             "link_error_recovery")  # fmt: skip
    recs = port_series(200, step=10.0, counters=lambda t: {n: MAX64 if t >= 50 else 0 for n in names})
    engine = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    alerts = engine.process(recs).alerts
    assert {a.rule for a in alerts} >= {"network_rcv_errors", "network_carrier_changes", "network_symbol_errors"}
    other = _snapshot_round_trip(engine, [PortStage(cfg)])
    assert _show(other.flush().alerts) == _show(engine.flush().alerts)


def test_a_counter_read_once_as_2_64_then_back_is_one_increase_and_a_reset():
    # A glitch of one sample: the rise fires (any increase of link_downed), the fall is a reset.
    recs = port_series(1800, step=10.0, counters=lambda t: {"link_downed": MAX64 if t == 300 else 2})
    alerts, engine = run_ports(recs)
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [
        ("network_link_errors", "firing", 300.0),
        ("network_link_errors", "resolved", 900.0),
    ]
    assert alerts[0].evidence["increased"] == {"link_downed": MAX64 - 2}
    engine.snapshot()


# -- counters at the IBTA widths' maxima and resets --------------------------------------------


@pytest.mark.parametrize("name, top", [("symbol_error", (1 << 16) - 1), ("link_error_recovery", 255),
                                       ("link_downed", 255), ("port_rcv_errors", (1 << 16) - 1),
                                       ("excessive_buffer_overrun_errors", 15),
                                       ("local_link_integrity_errors", 15)])  # fmt: skip
def test_a_counter_pinned_at_its_width_raises_nothing_new(name, top):
    # The IBTA counters stop at their maximum (drivers/infiniband/core/sysfs.c: 16, 8 and 4
    # bits): found there at start, it is history and stays quiet at every sampling.
    for step in (1.0, 10.0, 30.0):
        alerts, _ = run_ports(port_series(1800, step=step, counters=lambda t: {name: top}))
        assert alerts == [], (step, _show(alerts))


@pytest.mark.parametrize("step", [1.0, 5.0, 10.0, 30.0])
def test_resets_by_perfquery_or_a_driver_reload_are_no_errors(step):
    # Every error counter cleared to 0 every 10 minutes (perfquery -R, OpenSM's PerfMgr), and
    # counting again slowly below every bound in between: no alert at any sampling.
    def counters(t):
        since = t % 600
        return {
            "symbol_error": int(since / 60),
            "link_error_recovery": int(since / 300),
            "port_rcv_errors": int(since / 2),
            "link_downed": 0,
            "local_ack_timeout_err": int(since / 4),
            "carrier_changes": 0,
        }

    alerts, _ = run_ports(
        port_series(3600, step=step, counters=lambda t: {k: v + 1000 * (t < 600) for k, v in counters(t).items()})
    )
    assert alerts == [], _show(alerts)


def test_a_reset_then_a_new_fatal_error_fires_once_the_series_moves_again():
    # link_downed 7 -> reset to 0 -> 1: the reset is no error, the increase after it is.
    recs = port_series(1800, step=10.0, counters=lambda t: {"link_downed": 7 if t < 300 else (0 if t < 600 else 1)})
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [
        ("network_link_errors", "firing", 600.0),
        ("network_link_errors", "resolved", 1200.0),
    ]


# -- ports that go away and come back, rates at any sampling ----------------------------------


@pytest.mark.parametrize("step", [1.0, 5.0, 10.0, 30.0])
def test_a_port_gone_a_while_and_back_is_lost_then_found_and_not_a_flap(step):
    recs = _polls([i * step for i in range(int(2400 / step))], gone=lambda t, p: p == 1 and 600 <= t < 1200)
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state, a.labels["device"]) for a in alerts] == [
        ("network_port_lost", "firing", "mlx5_1"),
        ("network_port_lost", "resolved", "mlx5_1"),
    ], _show(alerts)
    assert alerts[1].ts - T0 == 1200.0


@pytest.mark.parametrize("step", [1.0, 5.0, 10.0, 30.0])
def test_a_port_flapping_three_times_fires_once_at_any_sampling(step):
    down = [(1000.0 * k, 1000.0 * k + 60.0) for k in (1, 2, 3)]
    states = lambda t: (1, 2) if any(a <= t < b for a, b in down) else (4, 5)  # noqa: E731
    alerts, _ = run_ports(port_series(5000, step=step, states=states))
    flap = [(a.state, a.ts - T0) for a in alerts if a.rule == "network_port_flapping"]
    assert flap == [("firing", 3060.0)], _show(alerts)
    assert len(_fired(alerts, "network_port_down")) == 3


def test_irregular_gaps_read_the_rate_over_the_span_they_cover():
    # Samples at uneven gaps (1 to 47 s, a 10-minute hole): 8 port_rcv_errors a second all along
    # is under the bound of 10 however the spans fall; 20 a second is over it.
    gaps = [1, 3, 7, 2, 47, 1, 1, 13, 29, 600, 5, 1, 11]
    times, t = [], 0.0
    while t < 3600:
        for g in gaps:
            times.append(t)
            t += g
    for per_s, fires in ((8.0, False), (20.0, True)):
        recs = [NicRecord(ts=T0 + x, host="n1", device="mlx5_0", port=1, state=4, phys_state=5,
                          counters={"port_rcv_errors": int(per_s * x)}) for x in times]  # fmt: skip
        assert bool(_fired(run_ports(recs)[0], "network_rcv_errors")) is fires


# -- hosts with storage NICs beside the eight --------------------------------------------------


def test_storage_nics_at_a_lower_rate_do_not_hide_a_compute_port_down():
    # A DGX-like host: 8 compute ports at 400 Gb/s and 2 storage ports at 200. One compute port
    # down 20 minutes: its port alert and the host's (7 < 8 at 400).
    rates = lambda t, p: 400.0 if p < 8 else 200.0  # noqa: E731
    states = lambda t, p: (1, 3) if p == 3 and 600 <= t < 1800 else (4, 5)  # noqa: E731
    alerts, _ = run_ports(_node(3600, ports=10, states=states, rates=rates))
    assert [(a.rule, a.state, a.ts - T0) for a in alerts if a.state == "firing"] == [
        ("network_port_down", "firing", 600.0),
        ("network_active_ports_low", "firing", 840.0),
    ], _show(alerts)
    assert run_ports(_node(3600, ports=10, rates=rates))[0] == []


def test_a_large_host_is_judged_port_by_port_at_a_linear_cost():
    # 64 devices of 2 ports each on one host (a switch-like box) and 8 hosts beside it: each
    # lost port alone is found, and nothing else fires.
    recs = []
    for h in range(9):
        ports = 128 if h == 0 else 8
        recs += [NicRecord(ts=T0 + t, host=f"n{h}", device=f"mlx5_{p // 2}", port=1 + p % 2, state=4, phys_state=5,
                           rate_gbps=400.0, counters={"link_downed": 0, "symbol_error": 0})
                 for t in range(0, 600, 10) for p in range(ports) if not (h == 0 and p == 77 and t >= 300)]  # fmt: skip
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state, a.host, a.labels["device"], a.labels["port"]) for a in alerts] == [
        ("network_port_lost", "firing", "n0", "mlx5_38", "2")
    ]
