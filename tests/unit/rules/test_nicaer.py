"""The NIC's PCIe AER checks (#34, the ``pcie_aer_*`` keys of ``rules/fabric/ports.yaml``): each
fires on the increase it names and stays quiet on history and resets; alerts name the NIC, its
PCI bus id and the GPUs behind it; the result is the same whatever the batches or a snapshot in
between; and the AER records (which say no port state) do not count as a poll of no ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.decode import Decoder
from pipeline.detection import build_stages
from pipeline.engine import Engine, EngineConfig
from pipeline.remediation.config import load_config
from pipeline.remediation.routes import RouteTree
from pipeline.rules.nicaer import NicAerStage
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import NicRecord, dcgm, encode, fault_family
from producers.pcie_aer import AerSource
from tests.factories import T0
from tests.unit.producers.pcie_factories import COR_NAMES, UNCOR_NAMES, aer_text, dgx_like, ib_class
from tests.unit.rules.factories import port_series

ROOT = Path(__file__).resolve().parents[3]


def aer_series(seconds, counters, device="mlx5_0", host="n1", step=10.0, gpus=(0, 1)):
    """A NIC's AER record every ``step`` seconds, as ``produce pcie-aer`` sends it: ``counters(t)``."""
    return [NicRecord(ts=T0 + t, host=host, device=device, port=1, counters=counters(t), gpus=list(gpus),
                      labels={"pci_bus_id": "0000:05:00.0"}) for t in range(0, int(seconds), int(step))]  # fmt: skip


def run(records, batch=None, config_text="", engine=None):
    cfg, diags = parse_port_config(config_text)
    assert cfg is not None, diags
    engine = engine or Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg), NicAerStage(cfg)])
    recs = sorted(records, key=lambda r: r.ts)
    step = batch or max(1, len(recs))
    out = []
    for i in range(0, len(recs), step):
        out += engine.process(recs[i:i + step]).alerts
    return out + engine.flush().alerts, engine


def zero(**over):
    return {"pcie_aer_correctable": 0, "pcie_aer_nonfatal": 0, "pcie_aer_fatal": 0, "pcie_aer_upstream_correctable": 0,
            "pcie_aer_upstream_nonfatal": 0, "pcie_aer_upstream_fatal": 0, **over}  # fmt: skip


def test_a_fatal_error_at_the_nic_is_critical_and_names_the_nic_and_its_gpus():
    alerts, _ = run(aer_series(3600, lambda t: zero(pcie_aer_fatal=int(t >= 600))))
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [
        ("nic_pcie_aer_fatal", "firing", 600.0), ("nic_pcie_aer_fatal", "resolved", 1200.0)]
    a = alerts[0]
    assert (a.fault, a.severity, a.host, a.gpu, fault_family(a.fault)) == ("pcie_aer_fatal", "critical", "n1", None,
                                                                           "pcie")
    assert a.labels == {"device": "mlx5_0", "pci_bus_id": "0000:05:00.0", "gpus": "0,1"}
    assert a.evidence["increased"] == {"pcie_aer_fatal": 1}
    assert a.summary == ("NIC mlx5_0 on n1 counted fatal PCIe AER errors, 1 at the NIC and 0 at the bridges above it; "
                         "GPUs 0,1 behind it")


def test_a_nonfatal_error_at_a_bridge_above_the_nic_is_a_warning():
    alerts, _ = run(aer_series(1200, lambda t: zero(pcie_aer_upstream_nonfatal=3 if t >= 300 else 0)))
    fire = [a for a in alerts if a.state == "firing"]
    assert [(a.rule, a.fault, a.severity) for a in fire] == [("nic_pcie_aer_nonfatal", "pcie_aer_nonfatal", "warning")]
    assert "0 at the NIC and 3 at the bridges above it" in fire[0].summary


def test_corrected_errors_fire_past_100_in_10_minutes_and_not_at_100():
    def steady(per_step):
        return lambda t: zero(pcie_aer_correctable=int(t // 10) * per_step)

    over, _ = run(aer_series(1800, steady(2)))  # 120 in 10 minutes
    assert [(a.rule, a.state) for a in over][:1] == [("nic_pcie_aer_correctable_rate", "firing")]
    assert over[0].evidence["corrected_in_window"] > 100
    at, _ = run(aer_series(1800, lambda t: zero(pcie_aer_upstream_correctable=int(t // 600) * 100)))
    assert at == []


def test_totals_found_at_start_are_history_and_a_reset_is_no_error():
    assert run(aer_series(1200, lambda t: zero(pcie_aer_fatal=7, pcie_aer_correctable=5000)))[0] == []
    reset = aer_series(1200, lambda t: zero(pcie_aer_fatal=7 if t < 600 else 0))
    assert run(reset)[0] == []


def test_port_records_without_aer_counters_and_disabled_checks_raise_nothing():
    recs = port_series(1200, counters=lambda t: {"symbol_error": 0})
    recs += aer_series(1200, lambda t: zero(pcie_aer_fatal=int(t >= 600)))
    off, _ = run(recs, config_text="pcie_aer_fatal: {enabled: false}\n")
    assert off == []
    on, eng = run(recs)
    assert [a.rule for a in on if a.state == "firing"] == ["nic_pcie_aer_fatal"]
    assert eng.stage("nic_aer").dropped == 0


def test_the_same_alerts_whatever_the_batches_or_a_snapshot_between():
    recs = aer_series(3600, lambda t: zero(pcie_aer_correctable=int(t // 10) * 3 if 900 <= t < 2000 else 0,
                                           pcie_aer_nonfatal=int(t >= 2500)))  # fmt: skip
    want, _ = run(recs)
    assert {a.rule for a in want} == {"nic_pcie_aer_correctable_rate", "nic_pcie_aer_nonfatal"}
    got, _ = run(recs, batch=7)
    assert [(a.id, a.state, a.ts) for a in got] == [(a.id, a.state, a.ts) for a in want]
    cfg, _ = parse_port_config("")
    first = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg), NicAerStage(cfg)])
    half = len(recs) // 2
    got = first.process(recs[:half]).alerts
    second = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg), NicAerStage(cfg)])
    second.restore(first.snapshot())
    got += second.process(recs[half:]).alerts + second.flush().alerts
    assert [(a.id, a.state, a.ts) for a in got] == [(a.id, a.state, a.ts) for a in want]


def test_a_snapshot_from_an_engine_without_the_stage_restores():
    cfg, _ = parse_port_config("")
    old = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    old.process(aer_series(300, lambda t: zero()))
    new = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg), NicAerStage(cfg)])
    new.restore(old.snapshot())
    alerts, _ = run(aer_series(600, lambda t: zero(pcie_aer_fatal=int(t >= 400))), engine=new)
    assert [a.rule for a in alerts if a.state == "firing"] == ["nic_pcie_aer_fatal"]


def test_aer_records_are_not_a_poll_of_no_active_ports():
    # An H100 node whose ports no producer reports, and the AER producer's records: they say no
    # port's state, so the host is not judged on them (before: a poll of 0 of 8 ports ACTIVE).
    recs = [dcgm(T0 + t, "n1", g, {"gpu_temp": 60}, model="NVIDIA H100 80GB HBM3")
            for t in range(0, 1200, 10) for g in range(2)]  # fmt: skip
    recs += [NicRecord(ts=T0 + t, host="n1", device=f"mlx5_{p}", port=1, counters=zero())
             for t in range(0, 1200, 10) for p in range(8)]  # fmt: skip
    assert run(recs)[0] == []
    # With the ports' own records interleaved, the host is judged on those alone.
    for p in range(8):
        recs += port_series(1200, device=f"mlx5_{p}", gpus=[p], states=(lambda t: (1, 3)) if p == 3 else None)
    assert [a.rule for a in run(recs)[0] if a.state == "firing"] == ["network_active_ports_low"]


def test_from_the_producer_to_an_alert_of_the_shipped_packs_and_its_route(tmp_path):
    root = tmp_path / "root"
    dev = dgx_like(root)
    ib_class(root, "mlx5_0", dev["nic"])
    now = [T0]
    src = AerSource(root, host="gpu-node-007", clock=lambda: now[0])
    stages, diags = build_stages([str(ROOT / "rules")], None)
    assert stages is not None, diags
    eng, dec = stages.host, Decoder()
    alerts = []
    for i in range(12):
        now[0] = T0 + 10 * i
        if i == 6:  # a Surprise Down at the PCIe switch port above the NIC
            (dev["switch_dn1"] / "aer_dev_fatal").write_text(aer_text("TOTAL_ERR_FATAL", UNCOR_NAMES, {"SDES": 1}))
        if i == 8:
            (dev["nic"] / "aer_dev_correctable").write_text(aer_text("TOTAL_ERR_COR", COR_NAMES, {"RxErr": 500}))
        out = dec.decode(encode(src.poll()), f"aer#{i}")
        assert out.dead == []
        alerts += eng.process(out.records).alerts
    alerts += eng.flush().alerts
    fire = {a.rule: a for a in alerts if a.state == "firing"}
    # The GPUs under that switch port see it as theirs (rules/pcie.yaml); the NIC's alert names the NIC.
    assert {"nic_pcie_aer_fatal", "nic_pcie_aer_correctable_rate", "pcie_aer_fatal"} <= set(fire)
    nic = fire["nic_pcie_aer_fatal"]
    assert nic.labels == {"device": "mlx5_0", "pci_bus_id": "0000:05:00.0", "gpus": "0,1"}
    tree = RouteTree.build(load_config(ROOT / "rules" / "routes.yaml").raw.route)
    assert [m.receiver for m in tree.match(nic)] == ["fabric"]


@pytest.mark.parametrize("text", [
    "pcie_aer_correctable: {threshold: -1}\n",
    "pcie_aer_fatal: {counters: []}\n",
    "pcie_aer_fatal: {models: {h100: {ports: 8, rate_gbps: 400}}}\n",
])
def test_a_bad_setting_is_a_diagnostic(text):
    cfg, diags = parse_port_config(text, "p.yaml")
    assert cfg is None and diags and all(str(d).startswith("p.yaml:1:") for d in diags)
