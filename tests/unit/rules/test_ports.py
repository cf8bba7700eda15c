"""The NIC port checks (#34, ``rules/fabric/ports.yaml``): each fires on the fault it names and
stays quiet on healthy and congested ports; alerts name host, device, port and the GPUs behind
the NIC; the result is the same whatever the batches, the arrival order within the allowed
lateness, or a snapshot and restore in between."""

from __future__ import annotations

import random

import pytest

from pipeline.detection import build_stages
from pipeline.engine import Engine, EngineConfig
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import FAMILIES, NicRecord, fault_family
from tests.factories import T0
from tests.unit.rules.factories import port_series, run_ports

HOUR = 3600.0


def firing(alerts):
    return [(a.rule, a.host, a.labels["device"], a.labels["port"]) for a in alerts if a.state == "firing"]


def test_a_port_that_goes_down_raises_a_critical_alert_naming_its_gpus():
    recs = port_series(600, gpus=[0, 1], netdev="ibp26s0",
                       states=lambda t: (1, 3) if 200 <= t < 400 else (4, 5))
    alerts, _ = run_ports(recs)
    fire = [a for a in alerts if a.rule == "network_port_down"]
    assert [(a.state, a.ts - T0) for a in fire] == [("firing", 200.0), ("resolved", 400.0)]
    a = fire[0]
    assert (a.severity, a.fault, a.host, a.gpu, a.family) == ("critical", "network_port_down", "n1", None, "network")
    assert a.labels == {"device": "mlx5_0", "port": "1", "netdev": "ibp26s0", "link_layer": "InfiniBand",
                        "gpus": "0,1"}
    assert a.evidence["gpus"] == [0, 1] and a.evidence["state"] == "DOWN" and a.evidence["phys_state"] == "Disabled"
    assert "mlx5_0 port 1 on n1 is DOWN (Disabled)" in a.summary and "GPUs 0,1" in a.summary
    assert fire[1].summary == a.summary and fire[1].id == a.id


def test_a_port_never_active_is_not_judged():
    # A DGX's spare Ethernet ports sit Down/Disabled from boot (gpud's ibstat captures).
    alerts, _ = run_ports(port_series(HOUR, states=lambda t: (1, 3)) + port_series(HOUR, port=2,
                                                                                    states=lambda t: (1, 2)))
    assert alerts == []


def test_polling_at_runtime_is_a_warning_after_30s_and_a_blip_is_not():
    long = port_series(600, states=lambda t: (1, 2) if 100 <= t < 300 else (4, 5))
    alerts, _ = run_ports(long)
    # DOWN with Polling is down (critical); INIT with LinkErrorRecovery is the degraded case.
    assert ("network_port_down", "n1", "mlx5_0", "1") in firing(alerts)
    deg = port_series(600, states=lambda t: (2, 6) if 100 <= t < 300 else (4, 5))
    alerts, _ = run_ports(deg)
    assert [(a.rule, a.severity, a.state, a.ts - T0) for a in alerts] == [
        ("network_port_degraded", "warning", "firing", 130.0), ("network_port_degraded", "warning", "resolved", 300.0)]
    blip = port_series(600, states=lambda t: (4, 6) if 100 <= t < 120 else (4, 5))
    assert run_ports(blip)[0] == []


@pytest.mark.parametrize("name", ["link_downed", "excessive_buffer_overrun_errors", "local_link_integrity_errors",
                                  "rnr_nak_retry_err"])
def test_any_increase_of_a_fatal_counter_is_critical(name):
    # gpud's capture holds excessive_buffer_overrun_errors 15 and link_downed 255 at rest: a level
    # is no fault, an increase is.
    recs = port_series(1200, counters=lambda t: {name: 255 + (1 if t >= 300 else 0), "port_xmit_wait": int(t) * 10**6})
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [
        ("network_link_errors", "firing", 300.0), ("network_link_errors", "resolved", 900.0)]
    assert alerts[0].evidence["increased"] == {name: 1} and f"{name} +1" in alerts[0].summary


def test_a_counter_reset_is_no_increase():
    recs = port_series(600, counters=lambda t: {"link_downed": 40 if t < 300 else 0})
    assert run_ports(recs)[0] == []


@pytest.mark.parametrize("per_sample, seconds, fires", [(0.3, 2 * HOUR, False),   # 108 an hour: under the bound
                                                        (0.4, 2 * HOUR, True),    # 144 an hour
                                                        (3.0, 300.0, False),      # a burst of 87: under it
                                                        (5.0, 300.0, True)])      # a burst of 145 within the hour
def test_symbol_errors_above_120_an_hour(per_sample, seconds, fires):
    recs = port_series(seconds, counters=lambda t: {"symbol_error": int(t / 10 * per_sample)})
    alerts, _ = run_ports(recs)
    got = [a for a in alerts if a.state == "firing"]
    assert [a.rule for a in got] == (["network_symbol_errors"] if fires else [])
    if fires:
        assert got[0].evidence["symbol_errors_in_window"] > 120 and "IBTA 1e-12" in got[0].summary


def test_three_flaps_in_12h_and_two_are_not_a_flapping_port():
    def flaps(n):
        downs = [1000.0 + i * 3000 for i in range(n)]
        return lambda t: (1, 2) if any(d <= t < d + 60 for d in downs) else (4, 5)

    two, _ = run_ports(port_series(6 * HOUR, step=30, states=flaps(2)))
    three, _ = run_ports(port_series(6 * HOUR, step=30, states=flaps(3)))
    assert "network_port_flapping" not in {a.rule for a in two}
    got = [a for a in three if a.rule == "network_port_flapping"]
    assert [(a.state, a.ts - T0) for a in got] == [("firing", 7080.0)]  # the first ACTIVE sample after the third
    assert got[0].evidence["flaps_in_window"] == 3 and "3 times in 12h" in got[0].summary


def _fleet(hosts=16, ports=8, seconds=HOUR, congested=False):
    recs = []
    for h in range(hosts):
        for p in range(ports):
            def counters(t, p=p):
                c = {"link_downed": 0, "excessive_buffer_overrun_errors": 15, "symbol_error": int(t // 600),
                     "local_link_integrity_errors": 0, "port_rcv_errors": 14, "port_xmit_wait": 2489603687}
                if congested:  # a congested fabric: waits and discards climb, no errors
                    c.update(port_xmit_wait=2489603687 + int(t) * 5 * 10**7, port_xmit_discards=int(t) * 400,
                             port_rcv_data=int(t) * 10**10)
                return c
            recs += port_series(seconds, host=f"n{h:02d}", device=f"mlx5_{p}", counters=counters, gpus=[p])
    return recs


@pytest.mark.parametrize("congested", [False, True])
def test_a_healthy_or_congested_fleet_stays_quiet(congested):
    alerts, eng = run_ports(_fleet(congested=congested), batch=16 * 8)
    assert alerts == [] and eng.stats["records.nic"] == 16 * 8 * 360


def test_the_same_alerts_whatever_the_batches_order_or_a_restore():
    recs = (port_series(HOUR, states=lambda t: (1, 3) if 600 <= t < 1200 else (4, 5), gpus=[2, 3])
            + port_series(HOUR, host="n2", counters=lambda t: {"symbol_error": int(t / 10 * 0.5),
                                                                 "link_downed": 1 if t > 2000 else 0})
            + port_series(HOUR, host="n3"))
    want, _ = run_ports(recs)
    assert len(want) >= 5
    ids = lambda alerts: [(a.id, a.state, a.ts) for a in alerts]  # noqa: E731
    for batch in (1, 7, 100):
        assert ids(run_ports(recs, batch=batch)[0]) == ids(want)
    # Shuffled within a few seconds (the allowed lateness), per host message.
    rng = random.Random(4)
    by_ts = sorted(recs, key=lambda r: r.ts)
    shuffled = []
    for i in range(0, len(by_ts), 6):
        chunk = by_ts[i:i + 6]
        rng.shuffle(chunk)
        shuffled += chunk
    cfg, _ = parse_port_config("")
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    got = []
    for i in range(0, len(shuffled), 6):
        got += eng.process(shuffled[i:i + 6]).alerts
    got += eng.flush().alerts
    assert sorted(ids(got)) == sorted(ids(want))
    # A snapshot half-way, restored into a new engine, goes on as if nothing happened.
    first = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    half = len(by_ts) // 2
    got = first.process(by_ts[:half]).alerts
    second = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    second.restore(first.snapshot())
    got += second.process(by_ts[half:]).alerts + second.flush().alerts
    assert ids(got) == ids(want)


def test_the_shipped_packs_run_the_port_checks_in_the_host_stage(tmp_path):
    import shutil
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[3] / "rules"
    stages, diags = build_stages([str(shipped)], "auto")
    assert stages is not None and stages.host.stage("ports") is not None, diags
    # A broken ports file stops the build with its position, as a broken rule file does.
    rules = tmp_path / "rules"
    shutil.copytree(shipped, rules)
    (rules / "fabric" / "ports.yaml").write_text("flapping:\n  window: forever\n")
    stages, diags = build_stages([str(rules)], "auto")
    assert stages is None and [(Path(d.file).name, d.line, d.col, d.code) for d in diags] == [
        ("ports.yaml", 2, 11, "R007")]
    # No fabric/ports.yaml: no port checks, records still carried.
    shutil.rmtree(rules / "fabric")
    stages, _ = build_stages([str(rules)], "auto")
    assert stages is not None and stages.host.stage("ports") is None


def _node(seconds, model="NVIDIA H100 80GB HBM3", ports=8, host="n1", states=None, rate=400.0):
    """A host's GPUs (DCGM samples every 10 s, naming their model) and its ports at ``rate``."""
    from pipeline.schema import dcgm

    recs = [dcgm(T0 + t, host, g, {"gpu_temp": 60}, model=model) for t in range(0, int(seconds), 10) for g in range(2)]
    for p in range(ports):
        recs += port_series(seconds, host=host, device=f"mlx5_{p}", gpus=[p],
                            states=(lambda t, p=p: states(t, p)) if states else None)
    for r in recs:
        if isinstance(r, NicRecord) and r.device == "mlx5_7" and rate != 400.0:
            r.rate_gbps = rate
    return recs


def test_fewer_active_ports_than_the_gpu_model_needs():
    assert run_ports(_node(HOUR))[0] == []
    # One of eight down for 10 minutes: the port alert at once, the host's after 4 minutes.
    down = _node(HOUR, states=lambda t, p: (1, 3) if p == 3 and 600 <= t < 1200 else (4, 5))
    alerts, _ = run_ports(down)
    low = [a for a in alerts if a.rule == "network_active_ports_low"]
    assert [(a.state, a.ts - T0) for a in low] == [("firing", 840.0), ("resolved", 1200.0)]
    a = low[0]
    assert (a.host, a.gpu, a.severity, a.evidence["active_ports"], a.evidence["expected_ports"]) == (
        "n1", None, "critical", 7, 8)
    assert "mlx5_3:1" not in a.evidence["active"] and "its NVIDIA H100 80GB HBM3 GPUs need 8" in a.summary
    # A port that trains at 200 Gb/s is not one of the eight; a node that never had eight is judged too.
    slow, _ = run_ports(_node(HOUR, rate=200.0))
    assert [(a.rule, a.state) for a in slow] == [("network_active_ports_low", "firing")]
    seven, _ = run_ports(_node(HOUR, ports=7, model="NVIDIA B200"))
    assert [(a.rule, a.state) for a in seven] == [("network_active_ports_low", "firing")]


def _dgx(states=None, rate=400.0, mapped=8):
    """``_node``'s eight compute ports (the first ``mapped`` with their GPU named) and two storage
    ports at 400 Gb/s with no GPU behind them (a DGX H100's two dual-port storage NICs)."""
    recs = _node(HOUR, states=states, rate=rate)
    for r in recs:
        if isinstance(r, NicRecord) and int(r.device.removeprefix("mlx5_")) >= mapped:
            r.gpus = []
    for d in ("mlx5_8", "mlx5_9"):
        recs += port_series(HOUR, device=d)
    return recs


def test_storage_ports_do_not_hide_a_compute_port_down_or_slow():
    # Counted among all ten, nine ports at 400 Gb/s met the eight an H100 needs: a compute port
    # down, or retrained at 200 Gb/s, raised no host alert.
    assert run_ports(_dgx())[0] == []
    down = _dgx(states=lambda t, p: (1, 3) if p == 3 and 600 <= t < 1200 else (4, 5))
    low = [a for a in run_ports(down)[0] if a.rule == "network_active_ports_low"]
    assert [(a.state, a.ts - T0) for a in low] == [("firing", 840.0), ("resolved", 1200.0)]
    assert low[0].evidence["active_ports"] == 7 and low[0].evidence["counted"] == "ports with GPUs"
    assert "mlx5_8:1" not in low[0].evidence["active"]
    slow = [a for a in run_ports(_dgx(rate=200.0))[0] if a.rule == "network_active_ports_low"]
    assert [a.state for a in slow] == ["firing"]
    # A compute port whose records stop (a NIC gone, polled by a producer that sends nothing for
    # it) still counts as one: decided poll by poll, seven named ports fell back to all ten.
    gone = [r for r in _dgx() if not (isinstance(r, NicRecord) and r.device == "mlx5_3" and r.ts >= T0 + 600)]
    low = [a for a in run_ports(gone)[0] if a.rule == "network_active_ports_low"]
    assert [(a.state, a.ts - T0) for a in low] == [("firing", 840.0)] and low[0].evidence["active_ports"] == 7
    # Fewer ports with their GPUs named than the model needs (a producer without --pci-map for
    # some): every port counts, as before.
    partial = [a for a in run_ports(_dgx(rate=200.0, mapped=4))[0] if a.rule == "network_active_ports_low"]
    assert partial == []


def test_a_model_not_listed_or_unknown_is_not_judged_for_its_port_count():
    assert run_ports(_node(HOUR, ports=2, model="Tesla T4"))[0] == []
    assert run_ports([r for r in _node(HOUR, ports=2) if isinstance(r, NicRecord)])[0] == []
    one, _ = run_ports(_node(HOUR, ports=1, model="NVIDIA A100-SXM4-80GB", rate=200.0))
    assert one == []


def test_the_model_survives_a_restore():
    recs = sorted(_node(HOUR, ports=7), key=lambda r: r.ts)
    cfg, _ = parse_port_config("")
    first = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    first.process(recs[:100])
    second = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    second.restore(first.snapshot())
    got = [a for a in second.process(recs[100:]).alerts + second.flush().alerts if a.state == "firing"]
    assert [a.rule for a in got] == ["network_active_ports_low"]


def test_rules_check_reads_the_ports_file_beside_the_rules(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from pipeline.cli import main

    rules = tmp_path / "rules"
    shutil.copytree(Path(__file__).resolve().parents[3] / "rules", rules)
    assert main(["rules", "check", str(rules)]) == 0
    (rules / "fabric" / "ports.yaml").write_text("port_down:\n  severity: fatal\n")
    capsys.readouterr()
    assert main(["rules", "check", str(rules)]) == 1
    out = capsys.readouterr().out
    assert "fabric/ports.yaml:2:13: rule \"port_down\": port_down.severity: 'fatal'" in out and "[R006]" in out


def test_a_counter_name_a_letter_from_a_known_one_is_a_warning_naming_it(tmp_path, capsys):
    """A typo in ``counters`` made a check that never fires (no port writes ``symbol_eror``) and
    nothing said so: a name a letter or two from a known counter is a W204 warning with the name
    meant, fatal under ``--strict``; a driver's own name (bnxt_re, mana) is no warning."""
    import shutil
    from pathlib import Path

    from pipeline.cli import main

    cfg, diags = parse_port_config("symbol_errors:\n  counters: [symbol_eror]\n"
                                   "link_errors:\n  counters: [link_downed, requester_timeout, rx_roce_drops]\n",
                                   "p.yaml")
    assert cfg is not None and cfg.checks["symbol_errors"].counters == ("symbol_eror",)
    assert [(d.line, d.col, d.code, d.severity) for d in diags] == [(2, 14, "W204", "warning")]
    assert "'symbol_eror'" in diags[0].message and "did you mean 'symbol_error'?" in diags[0].message
    rules = tmp_path / "rules"
    shutil.copytree(Path(__file__).resolve().parents[3] / "rules", rules)
    (rules / "fabric" / "ports.yaml").write_text("link_errors:\n  counters: [link_downed, lnk_error_recovery]\n")
    capsys.readouterr()
    assert main(["rules", "check", str(rules)]) == 0
    assert main(["rules", "check", "--strict", str(rules)]) == 1
    assert "fabric/ports.yaml:2:27: warning: rule \"link_errors\"" in capsys.readouterr().out
    built, said = build_stages([str(rules)], "none")
    assert built is not None and [d.code for d in said if d.file.endswith("ports.yaml")] == ["W204"]


def test_network_is_a_fault_family():
    assert "network" in FAMILIES and fault_family("network_port_down") == "network"


@pytest.mark.parametrize("text, code, where", [
    ("port_down: [", "R001", (1, 13)),
    ("port_down: !!python/object/apply:os.system [ls]", "R002", (1, 12)),
    ("port_down: 3", "R003", (1, 12)),
    ("port_down: {severity: critical, expr: x}", "R004", (1, 33)),
    ("symbol_errors: {threshold: -1}", "R006", (1, 28)),
    ("symbol_errors: {threshold: .nan}", "R006", (1, 28)),
    ("active_ports: {models: {h100: {ports: 0, rate_gbps: 400}}}", "R006", (1, 39)),
    ("active_ports: {models: [h100]}", "R003", (1, 24)),
    ("port_degraded: {for: 3 days}", "R007", (1, 22)),
    ("link_errors: {counters: [link_downed, '../x']}", "R006", (1, 25)),
    ("a: &a [*a]", "R011", None),
    ("x" * 70_000, "R010", None),
])
def test_a_bad_ports_file_gets_positions_and_codes(text, code, where):
    cfg, diags = parse_port_config(text, "ports.yaml")
    assert cfg is None and diags and diags[0].code == code
    if where is not None:
        assert (diags[0].line, diags[0].col) == where
    assert str(diags[0]).startswith("ports.yaml:")


def test_disabled_checks_do_not_run():
    recs = port_series(600, states=lambda t: (1, 3) if t >= 200 else (4, 5))
    assert run_ports(recs, config_text="port_down: {enabled: false}")[0] == []


def test_ports_records_without_state_or_counters_raise_nothing():
    recs = [NicRecord(ts=T0 + t, host="n1", device="mlx5_0", port=1) for t in range(0, 600, 10)]
    assert run_ports(recs)[0] == []


def test_the_model_is_learnt_from_columnar_samples_as_from_records():
    from pipeline import colwire, rows
    from pipeline.decode import Decoder

    recs = sorted(_node(HOUR, ports=7), key=lambda r: r.ts)
    # The GPUs' first samples (the ones their model is learnt from) as one columnar message.
    first = [r for r in recs if r.ts == T0 and not isinstance(r, NicRecord)]
    cols = Decoder().decode_many([colwire.encode_dcgm(first)], ["t[0]@0"], [True]).records
    assert isinstance(cols, rows.DcgmColumns) and len(cols) == len(first) == 2
    got = []
    for batch in (cols, first):
        cfg, _ = parse_port_config("")
        engine = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
        engine.process(batch)
        alerts, _ = run_ports([r for r in recs if r not in first], engine=engine)
        got.append([(a.rule, a.state, a.ts, a.summary) for a in alerts if a.rule == "network_active_ports_low"])
    assert got[0] == got[1] and [a[1] for a in got[0]] == ["firing"]


def test_a_port_its_producer_says_is_gone_is_lost_even_if_this_stage_never_saw_it():
    # After a restart without state, the stage first hears of mlx5_3 as absent (the producer saw
    # it before): silent from then on, lost after the window; its absent records are no poll of
    # it, so they neither resolve nor fire its other checks.
    from pipeline.schema import NIC_ABSENT_LABEL

    recs = [r for r in _node(HOUR) if not (isinstance(r, NicRecord) and r.device == "mlx5_3")]
    recs += [NicRecord(ts=T0 + t, host="n1", device="mlx5_3", port=1, gpus=[3], labels={NIC_ABSENT_LABEL: "1"})
             for t in range(0, 600, 10)]  # fmt: skip
    alerts, _ = run_ports(sorted(recs, key=lambda r: r.ts))
    lost = [a for a in alerts if a.rule == "network_port_lost"]
    assert [(a.state, a.ts - T0) for a in lost] == [("firing", 40.0)]
    assert lost[0].evidence["gpus"] == [3]
    assert {a.rule for a in alerts} == {"network_port_lost", "network_active_ports_low"}
