"""The NIC port checks and the IBTA counters that stop at their width's maximum
(``pipeline/rules/ports.py``, ``portconfig.SATURATES_AT``; drivers/infiniband/core/sysfs.c's
``PORT_PMA_ATTR``: symbol_error 16 bits, link_downed 8, local_link_integrity_errors 4...).

A counter stuck at its maximum counts nothing more: a check that reads it keeps its verdict (a
firing alert stays firing, a quiet one quiet) until the counter leaves the maximum (a reset), and
the evidence says which counters are saturated. Also: the windows' running sums beside their
deques (``errors``, ``sums``, the AER stage's ``corrected``) equal a re-sum of the deques."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from pipeline.engine import Engine, EngineConfig
from pipeline.rules.nicaer import NicAerStage
from pipeline.rules.portconfig import PMA_WIDTHS, SATURATES_AT, parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import NicRecord
from tests.factories import T0
from tests.unit.rules.factories import port_series, run_ports

STEPS = [1.0, 5.0, 10.0, 30.0]
KEEP = 600.0  # the shipped checks' keep_firing_for


def _show(alerts):
    return [(a.rule, a.state, round(a.ts - T0, 3), a.labels.get("device")) for a in alerts]


def _by_rule(alerts, rule):
    return [a for a in alerts if a.rule == rule]


def test_the_widths_are_the_kernels():
    # drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR(name, counter, width, offset).
    assert PMA_WIDTHS == {
        "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
        "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
        "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
        "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
    }  # fmt: skip
    assert SATURATES_AT["symbol_error"] == 65535 and SATURATES_AT["link_downed"] == 255
    assert SATURATES_AT["local_link_integrity_errors"] == 15


# -- a firing alert holds while its counter is saturated ----------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_symbol_errors_that_keep_coming_do_not_resolve_once_the_counter_saturates(step):
    # 20 symbol errors a second: symbol_error reaches 65535 at 3277 s and stops there. The link
    # is as bad as ever: both symbol checks stay firing until a reset (perfquery -R) at 8000 s.
    reset = 8000.0
    top = SATURATES_AT["symbol_error"]

    def counters(t):
        return {"symbol_error": min(top, int(20 * t)) if t < reset else 0}

    alerts, _ = run_ports(port_series(reset + 1200, step=step, counters=counters))
    assert {a.rule for a in alerts} == {"network_symbol_errors", "network_symbol_error_rate"}, _show(alerts)
    for rule in ("network_symbol_errors", "network_symbol_error_rate"):
        got = _by_rule(alerts, rule)
        assert [a.state for a in got] == ["firing", "resolved"], _show(alerts)
        assert got[0].ts - T0 < 120.0
        assert reset < got[1].ts - T0 <= reset + KEEP + step, _show(alerts)


@pytest.mark.parametrize("step", STEPS)
def test_a_link_error_that_pins_link_downed_at_255_holds_until_a_reset(step):
    # link_downed 3 -> 255 (its 8 bits' maximum) at 300 s: fires, says it is saturated, and
    # stays firing (more downs could not show) until the counter is cleared at 2400 s.
    recs = port_series(3600, step=step, counters=lambda t: {"link_downed": 3 if t < 300 else 255 if t < 2400 else 0})
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state) for a in alerts] == [
        ("network_link_errors", "firing"),
        ("network_link_errors", "resolved"),
    ], _show(alerts)
    assert alerts[0].ts - T0 == 300.0
    assert alerts[0].evidence["increased"] == {"link_downed": 252}
    assert alerts[0].evidence["saturated"] == ["link_downed"]
    assert 2400.0 < alerts[1].ts - T0 <= 2400.0 + KEEP


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("counter, rule, per_s", [
    ("port_rcv_errors", "network_rcv_errors", 50.0),
    ("link_error_recovery", "network_link_error_recovery", 12 / 60),
    ("symbol_error", "network_symbol_error_rate", 50.0),
])  # fmt: skip
def test_a_rate_check_holds_while_its_counter_is_saturated(step, counter, rule, per_s):
    # Over the bound until the counter stops at its maximum; a cleared counter resolves it.
    reset = 4000.0
    top = SATURATES_AT[counter]
    recs = port_series(5000, step=step, counters=lambda t: {counter: min(top, int(per_s * t)) if t < reset else 0})
    got = _by_rule(run_ports(recs)[0], rule)
    assert [a.state for a in got] == ["firing", "resolved"], _show(got)
    assert reset < got[1].ts - T0 <= reset + KEEP + max(step, 60.0)


@pytest.mark.parametrize("step", STEPS)
def test_an_alert_that_fires_while_the_counter_is_saturated_says_so(step):
    # for: 5m on the hourly symbol check: the counter saturates at 164 s (400 a second), the
    # verdict holds, and the alert fires at 5 minutes with the saturated counter in its evidence.
    top = SATURATES_AT["symbol_error"]
    text = "symbol_errors: {for: 5m}\nsymbol_error_rate: {enabled: false}\n"
    recs = port_series(1200, step=step, counters=lambda t: {"symbol_error": min(top, int(400 * t))})
    alerts, _ = run_ports(recs, config_text=text)
    fired = [a for a in alerts if a.state == "firing"]
    assert [a.rule for a in fired] == ["network_symbol_errors"], _show(alerts)
    assert 300.0 <= fired[0].ts - T0 <= 300.0 + 2 * step
    assert fired[0].evidence["saturated"] == ["symbol_error"]


@pytest.mark.parametrize("step", STEPS)
def test_a_poll_that_misses_the_counter_or_a_records_of_other_kinds_do_not_release_the_hold(step):
    # Pinned link_downed; every fifth poll does not carry it (a file that did not read), and
    # the NIC's AER records and a training log's come between the polls: still firing.
    def counters(t):
        if int(t / step) % 5 == 4:
            return {"symbol_error": 0}
        return {"link_downed": 3 if t < 300 else 255, "symbol_error": 0}

    recs = port_series(3000, step=step, counters=counters)
    recs += [NicRecord(ts=T0 + t + 0.5, host="n1", device="mlx5_0", port=1, counters={"pcie_aer_fatal": 0})
             for t in range(0, 3000, 7)]  # fmt: skip
    recs += [NicRecord(ts=T0 + t + 0.25, host="n1", device="mlx5_0", port=1,
                       counters={"nccl_ib_completion_errors": 0}) for t in range(0, 3000, 11)]  # fmt: skip
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [("network_link_errors", "firing", 300.0)], _show(alerts)


# -- a quiet one stays quiet ---------------------------------------------------------------------


@pytest.mark.parametrize("step", STEPS)
def test_a_counter_at_its_maximum_from_the_start_then_reset_counts_from_the_reset(step):
    # At 65535 from the first sample: history, quiet. Cleared at 1200 s, it counts again: 5 a
    # second from 1800 s fires the hourly check, and no evidence says saturated then.
    top = SATURATES_AT["symbol_error"]

    def counters(t):
        return {"symbol_error": top if t < 1200 else max(0, int(5 * (t - 1800)))}

    alerts, _ = run_ports(port_series(2400, step=step, counters=counters))
    fired = [a for a in alerts if a.state == "firing"]
    assert [a.rule for a in fired] == ["network_symbol_errors"], _show(alerts)
    assert 1800.0 < fired[0].ts - T0 < 1900.0
    assert "saturated" not in fired[0].evidence


@pytest.mark.parametrize("step", STEPS)
def test_a_counter_that_crept_up_to_its_maximum_below_the_bound_stays_quiet(step):
    # One symbol error every 100 s (under 120 an hour) up to 65535, then stuck: quiet all along.
    top = SATURATES_AT["symbol_error"]
    recs = port_series(7200, step=step, counters=lambda t: {"symbol_error": min(top, top - 20 + int(t / 100))})
    assert run_ports(recs)[0] == []


@pytest.mark.parametrize("step", STEPS)
def test_a_vendor_64_bit_counter_at_a_round_number_is_not_saturated(step):
    # local_ack_timeout_err (hw_counters, 64 bits) stopping at 65535 means the errors stopped.
    recs = port_series(3000, step=step, counters=lambda t: {"local_ack_timeout_err": min(65535, int(100 * t))})
    got = _by_rule(run_ports(recs)[0], "network_ack_timeouts")
    assert [a.state for a in got] == ["firing", "resolved"]
    assert got[1].ts - T0 < 655.35 + KEEP + 2 * step + 1
    assert all("saturated" not in a.evidence for a in got)


# -- snapshots ---------------------------------------------------------------------------------------


def _engine(cfg):
    return Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])


@pytest.mark.parametrize("step", [5.0, 30.0])
def test_the_hold_survives_a_snapshot_and_an_old_snapshot_still_loads(step):
    cfg, _ = parse_port_config("")
    recs = port_series(3600, step=step, counters=lambda t: {"link_downed": 3 if t < 300 else 255})
    first = [r for r in recs if r.ts - T0 < 600]
    rest = [r for r in recs if r.ts - T0 >= 600]
    engine = _engine(cfg)
    alerts = engine.process(first).alerts
    other = _engine(cfg)
    other.restore(engine.snapshot())
    alerts += other.process(rest).alerts + other.flush().alerts
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [("network_link_errors", "firing", 300.0)]
    # A snapshot from before the hold was kept (no "held", no "sat") loads, holding nothing.
    stage = PortStage(cfg)
    state = next(s for s in engine.stages if isinstance(s, PortStage)).to_state()
    for past in state["past"]:
        assert "held" in past and "sat" in past
        del past["held"], past["sat"]
    stage.load_state(state)
    assert all(p.cond == {} and p.saturated == [] for p in stage._book.pasts)


# -- the running sums ----------------------------------------------------------------------------


_event = hs.tuples(
    hs.floats(0.5, 90.0),  # gap to the next sample
    hs.integers(0, 400),  # symbol errors since
    hs.integers(0, 5),  # carrier changes since
    hs.integers(0, 300),  # corrected AER errors since
    hs.booleans(),  # a reset (every counter cleared)
)


@settings(max_examples=50, deadline=None)
@given(hs.lists(_event, min_size=1, max_size=80), hs.sampled_from([1.0, 5.0, 10.0, 30.0]))
def test_running_sums_equal_a_re_sum_of_the_windows(events, window):
    text = f"symbol_errors: {{window: {int(window * 4)}s}}\ncarrier_changes: {{window: {int(window)}s}}\n"
    cfg, diags = parse_port_config(text + f"pcie_aer_correctable: {{window: {int(window * 2)}s}}\n")
    assert cfg is not None and diags == []
    ports, aer = PortStage(cfg), NicAerStage(cfg)
    t, sym, car, cor = 0.0, 0, 0, 0
    for gap, ds, dc, da, reset in events:
        t += gap
        sym, car, cor = (0, 0, 0) if reset else (sym + ds, car + dc, cor + da)
        rec = NicRecord(ts=T0 + t, host="n1", device="mlx5_0", port=1, state=4, phys_state=5,
                        counters={"symbol_error": sym, "carrier_changes": car, "pcie_aer_correctable": cor})  # fmt: skip
        for stage in (ports, aer):
            stage.nic_arrived([rec])
            stage.nic_release(math.inf)
        p = ports._book.pasts[0]
        assert p.errors_sum == sum(n for _, n in p.errors)
        assert p.sums_total == {k: sum(n for _, n in q) for k, q in p.sums.items()}
        nic = aer._book.pasts[0]
        assert nic.corrected_sum == sum(n for _, n in nic.corrected)
    # And a snapshot brings them back from the deques.
    again = PortStage(cfg)
    again.load_state(ports.to_state())
    assert again._book.pasts[0].errors_sum == ports._book.pasts[0].errors_sum
    assert again._book.pasts[0].sums_total == ports._book.pasts[0].sums_total
    aer2 = NicAerStage(cfg)
    aer2.load_state(aer.to_state())
    assert aer2._book.pasts[0].corrected_sum == aer._book.pasts[0].corrected_sum
