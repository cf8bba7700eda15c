"""The host inventory: alerts for hosts outside it are audited `unknown_host`, never acted on and
never counted by the breaker; sources (file, list, Slurm, Kubernetes) and their refresh."""

from __future__ import annotations

import logging
import time

import pytest

from pipeline.errors import ConfigError
from pipeline.remediation.config import InventorySettings
from pipeline.remediation.inventory import build_inventory, parse_hosts
from tests.unit.remediation.factories import Clock, alert, config

DRAIN = {"drain": {"type": "slurm_drain"}, "log": {"type": "log"}}
CHAIN = [{"name": "drain", "actions": ["log", "drain"]}]


def test_forged_alerts_for_unknown_hosts_are_not_acted_on_and_cannot_trip_the_breaker(tmp_path, fakes, harness):
    fakes.mark("nodes", "gpu-node-1")
    fakes.mark("nodes", "gpu-node-2")
    cfg = config(tmp_path, actions=DRAIN, receivers=CHAIN, inventory={"source": "slurm"},
                 guardrails={"breaker": {"max_nodes": 2}})
    h = harness(cfg)
    # 20 invented hosts: before the inventory they filled the breaker's window and opened it.
    for i in range(20):
        out = h.handle(alert(f"fake-{i}", id=f"forged-{i}"))
        assert [(r.action, r.decision) for r in out] == [("log", "acted"), ("drain", "skipped")]
        assert out[1].reason.startswith("unknown_host: fake-") and "slurm host inventory (2 hosts" in out[1].reason
    assert fakes.updates() == []
    assert h.store.breaker(600).hosts_in_window == [] and not h.store.breaker_is_open()[0]
    assert h.audit.reasons["unknown_host"] == 20
    # ... and the real hosts are still drained.
    out = h.handle(alert("gpu-node-1", id="real"))
    assert out[1].decision == "acted"
    assert fakes.updates() == [["update", "nodename=gpu-node-1", "state=drain",
                                "reason=gpuwarden: hbm_uncorrectable_error alert real"]]


def test_unknown_host_is_logged_as_a_warning(tmp_path, fakes, harness, caplog):
    cfg = config(tmp_path, inventory={"source": "list", "hosts": ["n1"]})
    with caplog.at_level(logging.INFO, logger="gpuwarden.remediation.audit"):
        harness(cfg).handle(alert("n9"))
    warn = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1 and "unknown_host" in warn[0].getMessage() and "n9" in warn[0].getMessage()


def test_an_inventory_applies_in_dry_run_too(tmp_path, fakes, harness):
    cfg = config(tmp_path, inventory={"source": "list", "hosts": ["n1"]}, guardrails={"dry_run": True})
    h = harness(cfg)
    assert [r.decision for r in h.handle(alert("n1"))] == ["dry_run"]
    out = h.handle(alert("n2"))
    assert out[0].decision == "skipped" and out[0].reason.startswith("unknown_host: n2")


def test_without_an_inventory_live_node_actions_refuse_to_start(tmp_path, fakes, harness):
    cfg = config(tmp_path, inventory={})
    with pytest.raises(ConfigError) as e:
        harness(cfg)
    assert e.value.key == "inventory" and "drain" in str(e.value)


def test_without_an_inventory_dry_run_and_non_disruptive_actions_still_run(tmp_path, fakes, harness):
    h = harness(config(tmp_path, inventory={}, guardrails={"dry_run": True}, actions=DRAIN, receivers=CHAIN))
    assert [r.decision for r in h.handle(alert("anything"))] == ["acted", "dry_run"]
    # an action kept dry on its own, and a job-level checkpoint, do not need one either
    cfg = config(tmp_path, inventory={}, actions={"drain": {"type": "slurm_drain", "dry_run": True},
                                                  "ckpt": {"type": "checkpoint"}},
                 receivers=[{"name": "drain", "actions": ["ckpt", "drain"]}])
    assert [r.decision for r in harness(cfg).handle(alert("n1", job="42"))] == ["acted", "dry_run"]


def test_source_any_trusts_every_host_and_says_so(tmp_path, fakes, harness, caplog):
    with caplog.at_level(logging.WARNING, logger="gpuwarden.remediation"):
        h = harness(config(tmp_path, inventory={"source": "any"}))
    assert "inventory.source is `any`" in caplog.text
    assert [r.decision for r in h.handle(alert("whatever-host"))] == ["acted"]


def test_file_inventory_lines_or_yaml_list(tmp_path, fakes, harness):
    (tmp_path / "hosts.txt").write_text("# the fleet\ngpu-node-1\n\ngpu-node-2   # rack 7\nnot a host!\n")
    (tmp_path / "hosts.yaml").write_text("- gpu-node-3\n- gpu-node-4\n")
    for name, ok, other in (("hosts.txt", "gpu-node-2", "gpu-node-3"), ("hosts.yaml", "gpu-node-4", "gpu-node-1")):
        cfg = config(tmp_path, inventory={"source": "file", "path": name},
                     state_file=str(tmp_path / f"{name}.sqlite"))
        h = harness(cfg)
        assert h.handle(alert(ok))[0].decision == "acted"
        assert h.handle(alert(other))[0].reason.startswith("unknown_host")


def test_parse_hosts_per_source():
    assert parse_hosts("node/a\nnode/b.example\n", "kubernetes") == ({"a", "b.example"}, [])
    assert parse_hosts("n1\nn1\nn2\n", "slurm") == ({"n1", "n2"}, [])
    hosts, bad = parse_hosts("ok\n-all\nx\x1b[2J\n", "slurm")
    assert hosts == {"ok"} and bad == ["-all", "x\\x1b[2J"]


def test_kubernetes_source_lists_nodes_with_kubectl(tmp_path, fakes, harness):
    fakes.mark("nodes", "k8s-gpu-1")
    cfg = config(tmp_path, actions={"cordon": {"type": "k8s_cordon"}},
                 receivers=[{"name": "drain", "actions": ["cordon"]}],
                 inventory={"source": "kubernetes", "argv": ["kubectl", "--context", "prod", "get", "nodes",
                                                             "-o", "name"]})
    h = harness(cfg)
    assert h.handle(alert("k8s-gpu-1"))[0].decision == "acted"
    assert h.handle(alert("k8s-gpu-2"))[0].reason.startswith("unknown_host")
    assert ["--context", "prod", "get", "nodes", "-o", "name"] in fakes.calls("kubectl")


def test_refresh_picks_up_new_hosts_and_a_failing_refresh_keeps_the_last_good_list(tmp_path, fakes):
    fakes.mark("nodes", "n1")
    clock = Clock(1000.0)
    inv = build_inventory(InventorySettings(source="slurm", refresh="5m"), clock=clock)
    assert inv.knows("n1") and not inv.knows("n2")
    fakes.mark("nodes", "n2")
    clock.t += 299
    inv.refresh_if_due()
    assert not inv.knows("n2"), "not before refresh is due"
    clock.t += 1
    inv.refresh_if_due()
    assert inv.knows("n2")
    fakes.fail("sinfo")
    clock.t += 300
    inv.refresh_if_due()
    assert inv.knows("n1") and inv.knows("n2") and "exit 1" in inv.error
    # a failed refresh is retried sooner than the refresh interval
    assert inv.next_refresh == clock.t + 30


def test_a_hanging_listing_command_is_bounded_by_the_timeout(tmp_path, fakes):
    fakes.mark("nodes", "n1")
    clock = Clock(0.0)
    inv = build_inventory(InventorySettings(source="slurm", timeout="0.5s"), clock=clock)
    fakes.hang("sinfo")
    clock.t += 301
    t0 = time.monotonic()
    assert inv.refresh() is False
    assert time.monotonic() - t0 < 5 and "timed out" in inv.error and inv.knows("n1")


def test_an_empty_listing_is_a_failure_not_an_empty_fleet(tmp_path, fakes):
    fakes.mark("nodes", "n1")
    clock = Clock(0.0)
    inv = build_inventory(InventorySettings(source="slurm"), clock=clock)
    (fakes.dir / "nodes").write_text("")
    assert inv.refresh() is False and inv.knows("n1") and "no hosts" in inv.error


def test_until_a_first_list_loads_no_host_is_known(tmp_path, fakes, harness):
    fakes.fail("sinfo")
    h = harness(config(tmp_path, inventory={"source": "slurm"}))
    out = h.handle(alert("n1"))
    assert out[0].reason.startswith("unknown_host") and "not loaded yet" in out[0].reason
    assert fakes.updates() == []
    fakes.heal("sinfo")
    fakes.mark("nodes", "n1")
    h.clock.t += 31
    h.rem.tick()
    assert h.handle(alert("n1", id="again"))[0].decision == "acted"


@pytest.mark.parametrize("inv, key", [
    ({"source": "ldap"}, "inventory.source"),
    ({"source": "file"}, "inventory.path"),
    ({"source": "list"}, "inventory.hosts"),
    ({"source": "list", "hosts": ["ok", "bad host"]}, "inventory.hosts"),
    ({"source": "file", "path": "h.txt", "argv": ["cat"]}, "inventory.argv"),
    ({"source": "slurm", "refresh": "soon"}, "inventory.refresh"),
    ({"source": "slurm", "timeout": 0}, "inventory.timeout"),
    # A listing runs in the remediator's loop: 366d (what a duration allows) held every action that long.
    ({"source": "slurm", "timeout": "6m"}, "inventory.timeout"),
    ({"sorce": "slurm"}, "inventory.sorce"),
])
def test_bad_inventory_config_names_the_key(tmp_path, inv, key):
    with pytest.raises(ConfigError) as e:
        config(tmp_path, inventory=inv)
    assert e.value.key == key


def test_a_missing_inventory_file_is_a_config_error_at_start(tmp_path, harness):
    cfg = config(tmp_path, inventory={"source": "file", "path": "nope.txt"})
    with pytest.raises(ConfigError) as e:
        harness(cfg)
    assert e.value.key == "inventory.path" and str(tmp_path / "nope.txt") in str(e.value)


def test_a_hostile_inventory_file_is_a_failed_refresh_not_a_crash(tmp_path) -> None:
    # Found in review: '[' * 100000 raised RecursionError out of refresh(), and an alias bomb
    # cost unbounded memory: the inventory file went through plain yaml.safe_load.
    from pipeline.remediation.inventory import parse_hosts

    assert parse_hosts("[" * 100_000, "file")[0] == set()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert parse_hosts(bomb, "file")[0] == set()
    assert parse_hosts("- gpu-node-1\n- gpu-node-2\n", "file")[0] == {"gpu-node-1", "gpu-node-2"}
