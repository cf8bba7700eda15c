"""Config errors name their key; the route tree matches like Alertmanager; `routes test` and --expect."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ConfigError
from pipeline.remediation.config import load_config, parse_config, parse_duration
from pipeline.remediation.routes import RouteTree
from tests.unit.remediation.factories import alert

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "rules" / "routes.yaml"


def base(**over):
    doc = {"actions": {"log": {"type": "log"}}, "receivers": [{"name": "r", "actions": ["log"]}],
           "route": {"receiver": "r"}}
    doc["actions"].update(over.pop("actions", {}))
    doc.update(over)
    return doc


@pytest.mark.parametrize("doc,key", [
    (base(unknown_top=1), "unknown_top"),
    (base(guardrails={"breaker": {"max_node": 3}}), "guardrails.breaker.max_node"),
    (base(actions={"d": {"type": "slurm_drain", "reson": "x"}}), "actions.d.reson"),
    (base(actions={"d": {"type": "slurm_dran"}}), "actions.d.type"),
    (base(actions={"d": {"reason": "x"}}), "actions.d.type"),
    (base(actions={"d": {"type": ["log"]}}), "actions.d.type"),          # was TypeError: unhashable
    (base(actions={"d": {"type": {"log": 1}}}), "actions.d.type"),
    (base(route={"receiver": "r", "routes": [{"matchers": ['a="b"'], "recv": "r"}]}), "route.routes[0].recv"),
    (base(route={"receiver": "nope"}), "route.receiver"),
    (base(route={"receiver": "r", "routes": [{"matchers": ['a=~"("']}]}), "route.routes[0].matchers[0]"),
    (base(route={"receiver": "r", "routes": [{"matchers": ["a is b"]}]}), "route.routes[0].matchers[0]"),
    (base(route={"receiver": "r", "group_wait": "soon"}), "route.group_wait"),
    (base(receivers=[{"name": "r", "actions": ["missing"]}]), "receivers[0].actions"),
    (base(guardrails={"cooldown": "1 fortnight"}), "guardrails.cooldown"),
    (base(guardrails={"breaker": {"max_percent": 140}}), "guardrails.breaker.max_percent"),
    (base(guardrails={"max_attempts": "three"}), "guardrails.max_attempts"),
    (base(actions={"c": {"type": "command", "argv": ["x"], "entity": "rack"}}), "actions.c"),
    (base(actions={"t": {"type": "k8s_taint", "effect": "Evict"}}), "actions.t.effect"),
    (base(actions={"c": {"type": "checkpoint", "mode": "http"}}), "actions.c.url"),
    (base(actions={"c": {"type": "checkpoint", "signal": "USR1;id"}}), "actions.c.signal"),
])
def test_bad_config_names_the_key(doc, key):
    with pytest.raises(ConfigError) as e:
        parse_config(doc)
    assert e.value.key == key, str(e.value)
    assert repr(key) in str(e.value)


def test_yaml_is_loaded_safely(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("route: !!python/object/apply:os.system ['touch /tmp/gw-pwned']\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.key == "(yaml)"
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_durations():
    assert parse_duration("10m", "k") == 600 and parse_duration(90, "k") == 90 and parse_duration("1.5h", "k") == 5400
    assert parse_duration("250ms", "k") == 0.25
    with pytest.raises(ConfigError):
        parse_duration(-1, "k")


def test_example_config_loads_and_defaults_to_dry_run():
    cfg = load_config(EXAMPLE)
    assert cfg.guardrails.dry_run is True
    assert cfg.state_file == EXAMPLE.parent / "remediation-state.sqlite"


TREE = {
    "receiver": "default", "group_by": ["host"], "repeat_interval": "2h",
    "routes": [
        {"name": "hbm-crit", "matchers": ['family="hbm"', 'severity="critical"'], "receiver": "drain",
         "continue": True, "group_wait": "30s"},
        {"name": "pager", "matchers": ['severity=~"critical|page"'], "receiver": "page",
         "routes": [{"name": "rack9-quiet", "matchers": ['host=~"r9-.*"'], "receiver": "default"}]},
        {"name": "team", "matchers": ['team="ml"', 'fault!="nvlink_crc_errors"'], "receiver": "team"},
    ],
}


def tree():
    return RouteTree.build(parse_config({
        "actions": {"log": {"type": "log"}},
        "receivers": [{"name": n, "actions": ["log"]} for n in ("default", "drain", "page", "team")],
        "route": TREE}).raw.route)


@pytest.mark.parametrize("kw,expected", [
    ({"fault": "hbm_uncorrectable_error", "severity": "critical"}, ["drain", "page"]),   # continue
    ({"fault": "hbm_ecc_burst", "severity": "warning"}, ["default"]),
    ({"fault": "thermal_throttling", "severity": "critical"}, ["page"]),
    ({"fault": "thermal_throttling", "severity": "critical", "host": "r9-n3"}, ["default"]),   # nested
    ({"fault": "nvlink_crc_errors", "severity": "warning", "labels": {"team": "ml"}}, ["default"]),
    ({"fault": "nvlink_replay_errors", "severity": "warning", "labels": {"team": "ml"}}, ["team"]),
])
def test_route_tree(kw, expected):
    a = alert(kw.pop("host", "n1"), **kw)
    ms = tree().match(a)
    assert [m.receiver for m in ms] == expected


def test_settings_are_inherited_down_the_tree():
    ms = tree().match(alert("r9-n1", fault="hbm_uncorrectable_error"))
    drain, quiet = ms
    assert drain.route.group_wait == 30 and drain.route.group_by == ["host"] and drain.route.repeat_interval == 7200
    assert quiet.describe() == "root > pager > rack9-quiet" and quiet.route.group_wait == 0
    assert drain.route.group_key(alert("r9-n1", 3)) == drain.route.group_key(alert("r9-n1", 5))


def test_routes_test_cli(capsys):
    args = ["routes", "test", "fault=hbm_uncorrectable_error", "severity=critical", "host=gpu-node-007", "gpu=3",
            "--config", str(EXAMPLE)]
    assert main(args + ["--expect", "drain-node"]) == 0
    out = capsys.readouterr().out
    assert "root > node-fatal" in out and "drain (slurm_drain)" in out and "checkpoint (checkpoint)" in out
    assert main(args + ["--expect", "page"]) == 1
    assert "expected receivers ['page'], got ['drain-node']" in capsys.readouterr().err
    assert main(["routes", "test", "fault=hbm_row_remap_pending", "severity=critical", "--config", str(EXAMPLE),
                 "--expect", "reset-gpu", "page"]) == 0
    assert main(["routes", "test", "fault=thermal_throttling", "severity=warning", "host=staging-4",
                 "--config", str(EXAMPLE), "--expect", "log-only"]) == 0
    assert main(["routes", "test", "severity=critical", "--config", str(EXAMPLE)]) == 2    # no fault: clear error
    assert "fault" in capsys.readouterr().err


@pytest.mark.parametrize("fault,severity,receiver", [
    ("network_port_down", "critical", "fabric"),
    ("network_port_flapping", "critical", "fabric"),
    ("pcie_aer_fatal", "critical", "fabric"),
    ("nvswitch_fatal", "critical", "fabric"),
    ("network_port_degraded", "warning", "fabric-notify"),
    ("network_active_ports_low", "warning", "fabric-notify"),
    ("pcie_aer_nonfatal", "warning", "log-only"),
])
def test_the_example_sends_fabric_faults_to_the_fabric_team(fault, severity, receiver, capsys):
    # A fabric fault drains its node and tells the fabric team (the alert JSON names the port and
    # the GPUs behind it); a degraded port only tells them.
    args = ["routes", "test", f"fault={fault}", f"severity={severity}", "host=gpu-node-007", "device=mlx5_3",
            "port=1", "--config", str(EXAMPLE), "--expect", receiver]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    if receiver == "fabric":
        assert "drain (slurm_drain)" in out and "notify-fabric (webhook)" in out and "group_by=['host']" in out


def test_the_example_pages_once_for_an_uncorrectable_error_and_its_xid(capsys):
    # Found by an audit: the counter's alert drained and paged, XID 48 of the same error paged
    # again through page-critical; in node-fatal's host group they are one dispatch.
    for fault in ("hbm_uncorrectable_error", "hbm_ecc_xid"):
        args = ["routes", "test", f"fault={fault}", "severity=critical", "host=gpu-node-004", "gpu=4",
                "--config", str(EXAMPLE), "--expect", "drain-node"]
        assert main(args) == 0, capsys.readouterr().err
        assert "root > node-fatal" in capsys.readouterr().out


def test_the_example_only_logs_a_staging_hosts_critical_alert(capsys):
    # The staging route came last, so a staging host's critical alert drained it.
    args = ["routes", "test", "fault=hbm_uncorrectable_error", "severity=critical", "host=staging-4",
            "--config", str(EXAMPLE), "--expect", "log-only"]
    assert main(args) == 0, capsys.readouterr().err


def test_the_example_pages_once_for_a_gpu_off_the_bus_and_lost_from_telemetry(capsys):
    # Found by an audit of one fault at a time: XID 79 drained and paged through node-fatal, the
    # GPU's silence (builtin_gpu_lost, fault gpu_lost) paged again through page-critical.
    for fault in ("gpu_fallen_off_bus", "gpu_lost", "nvlink_xid74", "nvlink_crc_error_rate"):
        args = ["routes", "test", f"fault={fault}", "severity=critical", "host=gpu-node-004", "gpu=4",
                "--config", str(EXAMPLE), "--expect", "drain-node"]
        assert main(args) == 0, capsys.readouterr().err
        assert "root > node-fatal" in capsys.readouterr().out


def test_the_example_pages_a_gpu_once_for_a_critical_fault():
    # The same audit: a throttling alert that resolved in a checkpoint's dip and fired again
    # (a new alert id) paged again; another fault of the same GPU still pages (review).
    routes = RouteTree.build(load_config(EXAMPLE).raw.route)
    first = alert("gpu-node-002", 2, fault="thermal_throttling", id="a1")
    again = alert("gpu-node-002", 2, fault="thermal_throttling", id="a2")
    other = alert("gpu-node-002", 2, fault="nvlink_recovery_errors", id="a3")
    elsewhere = alert("gpu-node-002", 5, fault="thermal_throttling", id="a4")
    (m,) = routes.match(first)
    assert m.receiver == "page"
    key = m.route.group_key
    assert key(first) == key(again) != key(other)
    assert key(first) != key(elsewhere)
