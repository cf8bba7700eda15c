"""Faults that come together or in sequence, as an operator sees them: one incident per root
cause, a second independent fault its own incident, no more decisions (pages, drains) than root
causes. Each test of a fix failed before it (docs/architecture.md, "Incidents")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents.config import IncidentConfig
from pipeline.incidents.events import IncidentEvent
from pipeline.schema import AlertEvent
from tests.factories import T0

# rule -> (fault, severity), as the shipped packs name them
FAULTS = {
    "nvlink_xid74": ("nvlink_xid74", "critical"),
    "nvlink_crc_error_rate_high": ("nvlink_crc_error_rate", "critical"),
    "nvlink_crc_errors": ("nvlink_crc_errors", "warning"),
    "nvlink_replays": ("nvlink_replay_errors", "warning"),
    "nvlink_recoveries": ("nvlink_recovery_errors", "critical"),
    "nvlink_bandwidth_collapse": ("nvlink_bandwidth_collapse", "critical"),
    "nvlink_nvswitch_fatal_sxid": ("nvswitch_fatal", "critical"),
    "gpu_cooling_degraded": ("thermal_cooling_degraded", "warning"),
    "gpu_thermal_throttling": ("thermal_throttling", "critical"),
    "hbm_sbe_burst": ("hbm_ecc_burst", "warning"),
    "hbm_dbe": ("hbm_uncorrectable_error", "critical"),
    "hbm_ecc_xid": ("hbm_ecc_xid", "critical"),
    "hbm_ecc_xid_notice": ("hbm_ecc_xid_notice", "warning"),
    "gpu_xid_warning": ("gpu_xid_warning", "warning"),
    "gpu_xid_repeated": ("gpu_xid_repeated", "warning"),
    "pcie_aer_fatal": ("pcie_aer_fatal", "critical"),
    "nccl_rank_straggler": ("nccl_straggler", "warning"),
    "nccl_comm_busbw": ("nccl_busbw_degraded", "warning"),
    "builtin_telemetry_gap": ("telemetry_gap", "warning"),
    "gpu_fallen_off_bus": ("gpu_fallen_off_bus", "critical"),
    "builtin_gpu_lost": ("gpu_lost", "critical"),
    "gpu_xid_critical": ("gpu_xid_critical", "critical"),
    "hang_collective": ("hang_collective", "critical"),
}


def _alert(rule: str, t: float, gpu: int | None = 0, host: str = "n1", *, state: str = "firing",
           started: float | None = None, **evidence) -> AlertEvent:
    fault, severity = FAULTS[rule]
    start = t if started is None else started
    return AlertEvent(id=f"{rule}/{host}/{gpu}/{start:g}", state=state, fault=fault, severity=severity, rule=rule,
                      host=host, gpu=gpu, ts=T0 + t, started_at=T0 + start, evidence=evidence)


def _resolved(a: AlertEvent, t: float) -> AlertEvent:
    return AlertEvent(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "state": "resolved", "ts": T0 + t})


def _run(alerts: list[AlertEvent], batches: list[int] | None = None, one_by_one: bool = False) -> list[IncidentEvent]:
    """The incident events of ``alerts`` fed through the stage's ``AlertFeed`` (as replay and serve
    do): added in ``batches`` (the rest last), released once, processed at once or one by one."""
    stage = IncidentStage(default_config())
    feed = stage.feed()
    i = 0
    for n in batches or []:
        feed.add(alerts[i:i + n])
        i += n
    feed.add(alerts[i:])
    released = feed.flush()
    if one_by_one:
        return [e for a in released for e in stage.process([a])]
    return stage.process(released)


def _opened(events: list[IncidentEvent]) -> list[IncidentEvent]:
    return [e for e in events if e.state == "opened"]


# -- Part 1: an XID names the root among alerts of equal action and severity -------------------

# A link going down at one second on one GPU: the CRC rate past DCGM's failure threshold
# (critical, drain_node) and XID 74 (critical, drain_node) tie on action and severity, and the
# CRC rate's rule name sorts first.
CRC, XID74 = _alert("nvlink_crc_error_rate_high", 0), _alert("nvlink_xid74", 0, xid=74.0)
WARNINGS = [_alert("nvlink_crc_errors", 0), _alert("nvlink_replays", 0)]


@pytest.mark.parametrize("arrival", [[CRC, XID74], [XID74, CRC]], ids=["crc-first", "xid-first"])
@pytest.mark.parametrize("batching", ["together", "apart"])
def test_a_link_going_down_is_rooted_at_its_xid_not_its_crc_rate(arrival, batching) -> None:
    # Before: opened with root nvlink_crc_error_rate_high in every order and batching.
    alerts = [*WARNINGS, *arrival] if batching == "together" else [arrival[0], *WARNINGS, arrival[1]]
    batches = [] if batching == "together" else [1, 2]
    for one_by_one in (False, True):
        events = _run(alerts, batches, one_by_one)
        assert [(e.root.rule, e.severity, e.action) for e in _opened(events)] == [
            ("nvlink_xid74", "critical", "drain_node")]
        assert len({e.incident for e in events}) == 1 and len(events[-1].members) == 4


def test_the_xid_breaks_only_a_tie_of_action_and_severity() -> None:
    cfg = IncidentConfig(actions=("watch", "reset_gpu", "drain_node"), default_action={"critical": "drain_node"},
                         rule_actions=(("r_reset", "reset_gpu"),))
    st = IncidentStage(cfg)

    def a(rule: str, severity: str, **ev) -> AlertEvent:
        return AlertEvent(id=rule, state="firing", fault="nvlink_x", severity=severity, rule=rule, host="n1", gpu=0,
                          ts=T0, started_at=T0, evidence=ev)

    # A higher action first, then the more severe, then the alert carrying an XID.
    ranked = sorted([a("r_reset", "critical", xid=74), a("c_nox", "critical"), a("w_xid", "warning", xid=74),
                     a("z_xid", "critical", xid=74)], key=st.rootness)
    assert [x.rule for x in ranked] == ["z_xid", "c_nox", "r_reset", "w_xid"]


def test_whether_an_alert_carries_an_xid_is_its_own_not_its_rules() -> None:
    # The engine puts the fields a rule's condition reads in each alert's evidence: one rule's
    # alerts may carry an XID or none (a count without a gauge), so the XID test is not cached
    # by rule; the action still is, once per (rule, severity).
    st = IncidentStage(default_config())
    with_xid = _alert("gpu_xid_repeated", 0, xid=13.0)
    without = [_alert("gpu_xid_repeated", 0, xid=None), _alert("gpu_xid_repeated", 0, xid=0.0),
               _alert("gpu_xid_repeated", 0, xid=True), _alert("gpu_xid_repeated", 0, xid="74"),
               _alert("gpu_xid_repeated", 0)]
    assert st.rootness(with_xid)[-1] == 0
    assert {st.rootness(x)[-1] for x in without} == {1}
    assert st.rootness(with_xid)[:2] == st.rootness(without[0])[:2]
    assert len(st._rungs) == 1


# -- (a) two different faults on two GPUs of one host at once ----------------------------------

def test_two_faults_on_two_gpus_of_a_host_at_once_are_two_incidents() -> None:
    alerts = [_alert("gpu_cooling_degraded", 0, gpu=1), _alert("hbm_sbe_burst", 0, gpu=3),
              _alert("gpu_thermal_throttling", 20, gpu=1), _alert("hbm_dbe", 20, gpu=3),
              _alert("hbm_ecc_xid", 20, gpu=3, xid=48.0)]
    events = _run(alerts)
    assert [(e.gpu, e.root.rule) for e in _opened(events)] == [(1, "gpu_cooling_degraded"), (3, "hbm_sbe_burst")]
    last = {e.incident: e for e in events}
    assert sorted((e.gpu, e.action) for e in last.values()) == [(1, "drain_node"), (3, "drain_node")]


# -- (b) two different faults on one GPU minutes apart -----------------------------------------

def test_an_hbm_uncorrectable_error_minutes_into_a_thermal_incident_is_its_own_incident() -> None:
    # Before: the DBE and its XID 48 joined the thermal incident (its last alert was within
    # join_window): no incident, no decision, no page said the HBM failed.
    alerts = [_alert("gpu_cooling_degraded", 0), _alert("gpu_thermal_throttling", 20),
              _alert("hbm_dbe", 200), _alert("hbm_ecc_xid", 200, xid=48.0), _alert("hbm_sbe_burst", 215)]
    events = _run(alerts)
    opened = _opened(events)
    assert [e.root.rule for e in opened] == ["gpu_cooling_degraded", "hbm_dbe"]
    hbm = [e for e in events if e.incident == opened[1].incident][-1]
    assert hbm.members == [a.id for a in alerts[2:]] and hbm.action == "drain_node"


def test_an_hbm_fault_whose_first_alert_joined_a_thermal_incident_by_time_is_still_its_own() -> None:
    # Its SBE burst (watch) within join_window of the GPU's thermal incident joins it as a symptom;
    # before, its rule and family then were the thermal incident's, so the DBE minutes later
    # joined it by family: no incident, no page said the HBM failed.
    alerts = [_alert("gpu_thermal_throttling", 0), _alert("hbm_sbe_burst", 120), _alert("hbm_dbe", 600),
              _alert("hbm_ecc_xid", 600, xid=48.0)]
    events = _run(alerts)
    opened = _opened(events)
    assert [e.root.rule for e in opened] == ["gpu_thermal_throttling", "hbm_dbe"]
    thermal = [e for e in events if e.incident == opened[0].incident][-1]
    assert thermal.members == [alerts[0].id, alerts[1].id]


def test_a_fatal_pcie_error_just_after_an_hbm_incident_is_its_own_incident() -> None:
    # Seen on a simulated fleet (llama3, 8 hosts, seed 5): an SRAM ECC burst and, 24 s after it
    # ended, an independent fatal PCIe error on the same GPU were one incident.
    alerts = [_alert("hbm_sbe_burst", 0), _alert("hbm_dbe", 100), _alert("pcie_aer_fatal", 180)]
    assert [e.root.rule for e in _opened(_run(alerts))] == ["hbm_sbe_burst", "pcie_aer_fatal"]


def test_a_symptom_or_an_application_xid_still_joins_the_recent_fault_of_its_gpu() -> None:
    # What join_window's same-GPU rule is for: the throttled GPU's straggler and an application's
    # XID on it are that incident's (watch; an application XID alone opens nothing).
    alerts = [_alert("gpu_thermal_throttling", 0), _alert("nccl_rank_straggler", 40, comm="c1"),
              _alert("gpu_xid_warning", 60, xid=13.0)]
    events = _run(alerts)
    assert len(_opened(events)) == 1 and events[-1].members == [a.id for a in alerts]


@pytest.mark.parametrize("hang_at", [200.0, 700.0])
def test_the_hung_collective_of_a_gpu_off_the_bus_is_that_incident(hang_at) -> None:
    # The GPU's ranks stop with it; the hang detector blames its rank at the job's timeout. Before:
    # joined by time alone if within join_window of the GPU's last alert, its own incident (and
    # a second decision) after it; with actions of their own no longer joined by time alone,
    # gpu_off_the_bus names it (llama3, 16 hosts, seed 31: two such pairs).
    alerts = [_alert("gpu_xid_critical", 0, gpu=4, xid=119.0), _alert("builtin_gpu_lost", 30, gpu=4),
              _alert("hang_collective", hang_at, gpu=4)]
    events = _run(alerts)
    assert [e.root.rule for e in _opened(events)] == ["gpu_xid_critical"]
    assert events[-1].members == [a.id for a in alerts]


def test_an_alert_joins_the_incident_of_its_family_not_the_one_opened_last_on_its_gpu() -> None:
    # Before: the DBE joined the thermal incident opened on the GPU since (the latest opened
    # there, and recent), not the GPU's open HBM incident, which never escalated.
    sbe = _alert("hbm_sbe_burst", 0)
    alerts = [sbe, _alert("gpu_thermal_throttling", 600), _alert("hbm_dbe", 700)]
    events = _run(alerts)
    assert [e.root.rule for e in _opened(events)] == ["hbm_sbe_burst", "gpu_thermal_throttling"]
    assert (events[-1].root.rule, events[-1].action, events[-1].changes) == (
        "hbm_sbe_burst", "drain_node", ["alert_joined", "severity_rose", "action_escalated"])


# -- (c) an NVSwitch fault that fails every GPU's links ------------------------------------------

def _nvswitch(gpu_dt: float) -> list[AlertEvent]:
    """An NVSwitch fatal SXid at t=0 (host-level) and, ``gpu_dt`` from it, XID 74 and the CRC
    rate on each of 8 GPUs; their recoveries 5 s later; the host's bandwidth alert at 30 s."""
    out = [_alert("nvlink_nvswitch_fatal_sxid", 0, gpu=None)]
    for g in range(8):
        out += [_alert("nvlink_xid74", gpu_dt, gpu=g, xid=74.0), _alert("nvlink_crc_error_rate_high", gpu_dt, gpu=g),
                _alert("nvlink_recoveries", gpu_dt + 5, gpu=g)]
    return [*out, _alert("nccl_comm_busbw", 30, gpu=None, comm="c1")]


@pytest.mark.parametrize("gpu_dt", [-4.5, -1.0, 0.0, 1.0])
def test_an_nvswitch_fault_is_one_incident_whichever_is_seen_first(gpu_dt) -> None:
    # The SXid at the GPUs' second, after them by less than the feed's hold, or before them: one
    # incident, rooted at the SXid (it goes first, a host-level alert sorts first in its second,
    # and the feed puts a cause that came within the hold before its symptoms), which
    # nvswitch_fabric gives every GPU's NVLink alert.
    events = _run(_nvswitch(gpu_dt))
    opened = _opened(events)
    assert len(opened) == 1 and not any(e.policy for e in events)
    assert opened[0].root.rule == "nvlink_nvswitch_fatal_sxid"
    assert len(events[-1].members) == len(_nvswitch(gpu_dt))


def test_an_nvswitch_fault_seen_after_the_hold_is_an_incident_per_gpu_and_no_lemon() -> None:
    # The SXid more than the hold (5 s) after its GPUs' alerts: no longer waited for, each GPU's
    # incident is open and paged; the eight open within a second are one episode for lemon_host
    # (five incidents in seven days), not five recurrences.
    events = _run(_nvswitch(-6.0))
    assert len(_opened(events)) > 5 and not [e.policy for e in events if e.policy]


# -- (d) a host going silent while one of its GPUs has an open incident --------------------------

def test_a_host_going_silent_is_its_own_incident_and_leaves_its_gpus_open() -> None:
    hot = _alert("gpu_thermal_throttling", 0, gpu=2)
    gap = _alert("builtin_telemetry_gap", 400, gpu=None)
    events = _run([hot, gap, _resolved(gap, 700), _alert("hbm_sbe_burst", 1100, host="n9")])
    assert [(e.gpu, e.root.rule) for e in _opened(events)] == [(2, "gpu_thermal_throttling"),
                                                               (None, "builtin_telemetry_gap"), (0, "hbm_sbe_burst")]
    resolved = [e.root.rule for e in events if e.state == "resolved"]
    assert resolved == ["builtin_telemetry_gap"]  # the GPU's alert still fires: its incident stays open


# -- (e) a fault that clears and recurs after join_window ----------------------------------------

@pytest.mark.parametrize("rule, lasts", [("builtin_telemetry_gap", 60.0), ("nvlink_nvswitch_fatal_sxid", 600.0)])
def test_a_host_level_fault_back_before_its_incident_resolved_rejoins_it(rule, lasts) -> None:
    # Before: the second firing, more than join_window after the first joined, opened a second
    # incident beside the first, still open in its quiet period (a second drain and page for a
    # fault whose incident had not even resolved). A GPU's fault rejoins by its family.
    first = _alert(rule, 0, gpu=None)
    again = _alert(rule, lasts + 240, gpu=None)
    events = _run([first, _resolved(first, lasts), again, _alert("hbm_sbe_burst", 5000, host="n9")])
    assert [e.root.rule for e in _opened(events)] == [rule, "hbm_sbe_burst"]
    assert not [e for e in events if e.state == "resolved"]  # ``again`` still fires


def test_a_fault_back_after_its_incident_resolved_is_a_new_incident() -> None:
    for rule, gpu in (("builtin_telemetry_gap", None), ("gpu_thermal_throttling", 2)):
        first = _alert(rule, 0, gpu=gpu)
        # Back just after quiet (300 s) and the hold (5 s: an incident stays open that long past
        # its quiet, for a symptom the feed put after its cause).
        events = _run([first, _resolved(first, 60), _alert(rule, 60 + 306, gpu=gpu)])
        assert [e.state for e in events] == ["opened", "resolved", "opened"]


def test_bandwidth_alerts_of_other_communicators_on_a_host_stay_their_own() -> None:
    a = _alert("nccl_comm_busbw", 0, gpu=None, comm="c1")
    events = _run([a, _resolved(a, 10), _alert("nccl_comm_busbw", 400, gpu=None, comm="c2")])
    assert len(_opened(events)) == 2


def test_a_restored_stage_finds_the_recurring_host_level_incident() -> None:
    import msgspec

    first = _alert("builtin_telemetry_gap", 0, gpu=None)
    stage = IncidentStage(default_config())
    stage.process([first, _resolved(first, 60)])
    again = IncidentStage(default_config())
    again.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(stage.to_state())))
    events = again.process([_alert("builtin_telemetry_gap", 300, gpu=None)])
    assert [(e.state, e.changes) for e in events] == [("updated", ["alert_joined"])]


# -- through the simulator and replay ------------------------------------------------------------

def test_replay_of_a_thermal_fault_then_an_hbm_error_on_one_gpu_is_two_incidents(tmp_path: Path) -> None:
    scenario = {"checkpoint_every": None, "faults": [
        {"type": "thermal_throttling", "host": 0, "gpu": 1, "onset": 60, "duration": 600},
        {"type": "hbm_ecc_burst", "host": 0, "gpu": 1, "onset": 240, "duration": 60,
         "params": {"escalate": True, "sbe_per_min": 40, "xid92": False, "dbe_at": 0.0, "remap_at": 2.0}},
    ]}
    sc, rec, inc = tmp_path / "sc.yaml", tmp_path / "r.jsonl", tmp_path / "i.jsonl"
    sc.write_text(yaml.safe_dump(scenario))
    assert main(["-q", "sim", "--hosts", "2", "--duration", "700", "--seed", "1", "--scenario", str(sc),
                 "--out", str(rec)]) == 0
    assert main(["-q", "replay", str(rec), "--models", "none", "--incidents-out", str(inc)]) == 0
    opened = [e for e in map(json.loads, inc.read_text().splitlines()) if e["state"] == "opened"]
    assert [(e["gpu"], e["root"]["rule"]) for e in opened] == [(1, "gpu_cooling_degraded"), (1, "hbm_dbe")]


# -- the shipped routes: a host-level fault drains its node --------------------------------------

@pytest.mark.parametrize("rule, fault, labels", [
    ("nvlink_nvswitch_fatal_sxid", "nvswitch_fatal", {}),
    ("network_port_down", "network_port_down", {"device": "mlx5_3", "port": "1"}),
    ("builtin_nccl_wrong_results", "nccl_wrong_results", {"nnodes": "1"}),
])
def test_the_example_routes_drain_the_node_of_a_host_level_fault(tmp_path, rule, fault, labels) -> None:
    # Before: the example's drain reason named {gpu}, which a host-level alert lacks: the drain
    # was skipped ("missing_value: alert has no gpu"), so an NVSwitch fault, a NIC port down or a
    # one-node burn-in's wrong results never drained their node (the fabric team was told).
    from pipeline.remediation.audit import AuditLog
    from pipeline.remediation.config import parse_config
    from pipeline.remediation.guardrails import StateStore
    from pipeline.remediation.remediator import Remediator
    from pipeline.resources import rules_dir

    doc = yaml.safe_load((rules_dir() / "routes.yaml").read_text())
    doc.update(state_file=str(tmp_path / "s.sqlite"), audit={"kafka": False}, inventory={"source": "any"})
    doc.pop("kafka")
    for name in ("page-oncall", "notify-fabric"):
        doc["actions"][name] = {"type": "log"}
    cfg = parse_config(doc, base_dir=tmp_path)
    assert cfg.guardrails.dry_run is True
    store, audit = StateStore(cfg.state_file), AuditLog(clock=lambda: T0)
    rem = Remediator(cfg, store, audit, clock=lambda: T0)
    a = AlertEvent(id="a1", state="firing", fault=fault, severity="critical", rule=rule, host="gpu-node-007",
                   gpu=None, job="pretrain", ts=T0, started_at=T0, labels=labels)
    try:
        rem.handle(a, one_shot=True)
    finally:
        rem.close()
        store.close()
    drains = [(r.decision, r.reason) for r in audit.records if r.action == "drain"]
    assert len(drains) == 1 and drains[0][0] == "dry_run", drains
    assert "reason=gpuwarden " + fault in " ".join(audit.records[[r.action for r in audit.records].index("drain")].argv)


def test_another_jobs_host_level_hang_is_no_recurrence() -> None:
    def hang(i: str, t: float, job: str) -> AlertEvent:
        return AlertEvent(id=i, state="firing", fault="hang_collective", severity="critical", rule="hang_collective",
                          host="n1", gpu=None, job=job, ts=T0 + t, started_at=T0 + t)

    first = hang("h1", 0, "j1")
    # Within h1's incident's quiet period, past join_window: another job's hang opens its own.
    events = _run([first, _resolved(first, 100), hang("h2", 330, "j2"), hang("h3", 340, "j2")])
    assert [(e.state, e.members) for e in events] == [("opened", ["h1"]), ("opened", ["h2"]),
                                                      ("updated", ["h2", "h3"])]
