"""Guardrails against fake scontrol/kubectl/nvidia-smi on PATH that record every argv.

A 50% fleet storm drains at most K nodes and opens a breaker that survives restarts; the same
alert is acted on once, across restarts; nodes drained by someone else are left alone; dry-run
calls nothing; cooldown, attempt cap, undo ownership and action ordering hold.
"""

from __future__ import annotations

import json
import random

import pytest

from pipeline.cli import main
from pipeline.remediation.guardrails import StateStore
from tests.unit.remediation.factories import alert, config

K = 5


def storm_config(tmp_path, **guard):
    return config(tmp_path, guardrails={"breaker": {"max_nodes": K, "max_percent": 10, "fleet_size": 200,
                                                    "window": "10m"}, **guard})


def test_half_the_fleet_alerting_drains_at_most_k_and_the_breaker_survives_a_restart(tmp_path, fakes, harness):
    h = harness(storm_config(tmp_path))
    hosts = [f"gpu-node-{i:03d}" for i in range(200)]
    rng = random.Random(3)
    storm = rng.sample(hosts, 100)                  # 50% of a 200-node fleet ...
    for i, host in enumerate(storm):
        h.clock.t += 0.5                            # ... within a minute
        h.handle(alert(host, gpu=i % 8))
    drained = [c for c in fakes.updates() if "state=drain" in c]
    assert 0 < len(drained) <= K
    assert len(h.decisions("acted")) == len(drained)
    assert len(h.decisions("blocked")) == 100 - len(drained)
    blocked = h.decisions("blocked")
    assert "circuit breaker opened" in blocked[0].reason and "limit 5" in blocked[0].reason
    assert all("circuit breaker open" in b.reason for b in blocked)
    # blocked while open: not even the query ran for those nodes
    queried = {c[-1] for c in fakes.calls("scontrol") if c[:2] == ["show", "node"]}
    assert len(queried) <= K + 1

    h.restart()                                     # a new process over the same state file
    h.clock.t += 3600                               # long after the window: only a human closes it
    before = len(fakes.calls())
    out = h.handle(alert(storm[-1], gpu=1, id="forced-one"), force=True)
    assert [r.decision for r in out] == ["blocked"] and out[0].forced
    assert len(fakes.calls()) == before             # no query, no drain
    assert StateStore(h.cfg.state_file).breaker(600).open

    # a human closes it: the next node is drained again
    assert main(["remediate", "breaker", "reset", "--config", _write_cfg(tmp_path, h.cfg), "--by", "oncall",
                 "--note", "bad rule fixed"]) == 0
    out = h.handle(alert("gpu-node-199-late", gpu=0, id="after-reset"))
    assert [r.decision for r in out] == ["acted"]
    assert fakes.updates()[-1][1] == "nodename=gpu-node-199-late"


def _write_cfg(tmp_path, cfg) -> str:
    """The CLI wants a file: write the same config as YAML (JSON is YAML)."""
    doc = {"state_file": str(cfg.state_file), "actions": {"drain": {"type": "slurm_drain"}},
           "receivers": [{"name": "drain", "actions": ["drain"]}], "route": {"receiver": "drain"},
           "guardrails": {"breaker": {"max_nodes": K}}}
    p = tmp_path / "cli.yaml"
    p.write_text(json.dumps(doc))
    return str(p)


def test_percent_of_fleet_limit_opens_before_k(tmp_path, fakes, harness):
    h = harness(config(tmp_path, guardrails={"breaker": {"max_nodes": 50, "max_percent": 2, "fleet_size": 200}}))
    for i in range(10):
        h.handle(alert(f"n{i}"))
    assert len(fakes.updates()) == 4                # 4/200 = 2% allowed, the 5th would be 2.5%
    assert "2.5%" in h.decisions("blocked")[0].reason


def test_breaker_status_cli(tmp_path, fakes, harness, capsys):
    h = harness(storm_config(tmp_path))
    for i in range(K + 1):
        h.handle(alert(f"n{i}"))
    path = _write_cfg(tmp_path, h.cfg)
    assert main(["remediate", "breaker", "status", "--config", path, "--exit-code"]) == 1
    assert "OPEN" in capsys.readouterr().out
    assert main(["remediate", "breaker", "status", "--config", path, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["open"] and len(st["hosts_in_window"]) == K


def test_same_alert_three_times_and_after_restart_is_acted_on_once(tmp_path, fakes, harness):
    h = harness(config(tmp_path))
    a = alert("n7", gpu=3, id="dup-1")
    for _ in range(3):
        h.handle(a)
    h.restart()
    h.clock.t += 10 * 86400                         # long past any cooldown: still the same alert id
    h.handle(a)
    assert len(fakes.updates()) == 1
    assert [r.decision for r in h.all] == ["acted", "skipped", "skipped", "skipped"]
    assert all(r.reason.startswith("duplicate: alert dup-1") for r in h.all[1:])


def test_node_drained_by_someone_else_is_left_alone(tmp_path, fakes, harness):
    fakes.mark("drained", "n2")                     # an admin drained n2 by hand
    h = harness(config(tmp_path))
    out = h.handle(alert("n2"))
    assert [r.decision for r in out] == ["skipped"]
    assert "left alone: node already drained" in out[0].reason and "admin:bad_fan" in out[0].reason
    assert fakes.updates() == []
    assert fakes.calls("scontrol") == [["show", "node", "-o", "n2"]]


def test_node_cordoned_by_someone_else_is_left_alone_in_kubernetes(tmp_path, fakes, harness):
    fakes.mark("cordoned", "k2")
    h = harness(config(tmp_path, actions={"cordon": {"type": "k8s_cordon", "kubectl_args": ["--context", "prod"]}},
                       receivers=[{"name": "c", "actions": ["cordon"]}], route={"receiver": "c"}))
    assert [r.decision for r in h.handle(alert("k2"))] == ["skipped"]
    assert [r.decision for r in h.handle(alert("k3"))] == ["acted"]
    assert [c for c in fakes.calls("kubectl") if "cordon" in c] == [["--context", "prod", "cordon", "k3"]]


def test_dry_run_calls_nothing_and_audits_every_intended_action(tmp_path, fakes, harness):
    cfg = config(tmp_path, guardrails={"dry_run": True},
                 actions={"ckpt": {"type": "checkpoint"}, "drain": {"type": "slurm_drain"},
                          "cordon": {"type": "k8s_cordon"}, "reset": {"type": "gpu_reset"},
                          "cmd": {"type": "command", "argv": ["scontrol", "notify", "{host}"]}},
                 receivers=[{"name": "all", "actions": ["ckpt", "drain", "cordon", "reset", "cmd"]}],
                 route={"receiver": "all"})
    h = harness(cfg)
    for i in range(3):
        h.handle(alert(f"n{i}", gpu=i, job=f"{100 + i}"))
    assert fakes.calls() == []                      # not even the read-only queries
    dry = h.decisions("dry_run")
    assert len(dry) == 15 and len(h.all) == 15
    assert dry[0].argv == ["scancel", "--signal=USR1", "--full", "100"]
    assert dry[1].argv == ["scontrol", "update", "nodename=n0", "state=drain",
                           "reason=gpuwarden: hbm_uncorrectable_error alert a-n0-0-hbm_uncorrectable_error"]
    assert dry[2].argv == ["kubectl", "cordon", "n0"]
    assert dry[3].argv == ["nvidia-smi", "-r", "-i", "0"]
    assert dry[4].argv == ["scontrol", "notify", "n0"]
    # dry-run left no trace in the breaker
    assert StateStore(cfg.state_file).breaker(600).hosts_in_window == []


def test_one_action_can_be_enabled_while_the_rest_stay_dry(tmp_path, fakes, harness):
    cfg = config(tmp_path, guardrails={"dry_run": True},
                 actions={"drain": {"type": "slurm_drain", "dry_run": False}, "reset": {"type": "gpu_reset"}},
                 receivers=[{"name": "r", "actions": ["drain", "reset"]}], route={"receiver": "r"})
    h = harness(cfg)
    assert [r.decision for r in h.handle(alert("n1"))] == ["acted", "dry_run"]
    assert fakes.calls("nvidia-smi") == []


def test_cooldown_and_attempt_cap_stop_loops(tmp_path, fakes, harness):
    cfg = config(tmp_path, guardrails={"cooldown": "1h", "max_attempts": 2, "attempt_window": "24h"},
                 actions={"reset": {"type": "gpu_reset"}}, receivers=[{"name": "r", "actions": ["reset"]}],
                 route={"receiver": "r"})
    h = harness(cfg)
    assert h.handle(alert("n1", 2, id="x1"))[0].decision == "acted"
    h.clock.t += 600
    out = h.handle(alert("n1", 2, id="x2"))          # a new alert id, same GPU, 10 min later
    assert out[0].decision == "skipped" and out[0].reason.startswith("cooldown:")
    h.clock.t += 3600
    fakes.fail("nvidia-smi")                         # now the reset fails (and so does its query)
    out = h.handle(alert("n1", 2, id="x3"))
    assert out[0].decision == "failed"
    h.clock.t += 600
    out = h.handle(alert("n1", 2, id="x4"))
    assert out[0].decision == "skipped" and out[0].reason.startswith("attempt_cap: 2 attempts")
    h.restart()                                      # the cap is persisted too
    assert h.handle(alert("n1", 2, id="x5"))[0].reason.startswith("attempt_cap")
    assert h.handle(alert("n1", 3, id="x6"))[0].decision == "failed"    # another GPU has its own count


def test_gpu_reset_refused_while_processes_run_on_it(tmp_path, fakes, harness):
    fakes.mark("busy-4", "31337")
    h = harness(config(tmp_path, actions={"reset": {"type": "gpu_reset"}},
                       receivers=[{"name": "r", "actions": ["reset"]}], route={"receiver": "r"}))
    out = h.handle(alert("n1", 4))
    assert out[0].decision == "skipped" and "processes still run on the GPU" in out[0].reason
    assert h.handle(alert("n1", 5))[0].decision == "acted"
    assert [c for c in fakes.calls("nvidia-smi") if "-r" in c] == [["-r", "-i", "5"]]


def test_a_query_that_cannot_run_means_no_action(tmp_path, fakes, harness):
    # The remote shell is missing: we cannot tell whether the GPU is idle, so no reset.
    h = harness(config(tmp_path, actions={"reset": {"type": "gpu_reset", "via": ["no-such-rsh", "{host}"]}},
                       receivers=[{"name": "r", "actions": ["reset"]}], route={"receiver": "r"}))
    out = h.handle(alert("n1", 4))
    assert out[0].decision == "failed" and "cannot run 'no-such-rsh'" in out[0].error
    assert out[0].argv == ["no-such-rsh", "n1", "nvidia-smi", "-r", "-i", "4"]
    assert fakes.calls() == []


def test_checkpoint_runs_before_the_drain_and_a_failure_stops_it(tmp_path, fakes, harness):
    cfg = config(tmp_path, actions={"ckpt": {"type": "checkpoint", "signal": "USR2"}, "drain": {"type": "slurm_drain"}},
                 receivers=[{"name": "r", "actions": ["ckpt", "drain"]}], route={"receiver": "r"})
    h = harness(cfg)
    h.handle(alert("n1", job="4242"))
    progs = [c[0] for c in fakes.calls() if c[0] != "scontrol" or c[1] == "update"]
    assert progs == ["scancel", "scontrol"]
    assert fakes.calls("scancel") == [["--signal=USR2", "--full", "4242"]]
    fakes.fail("scancel")
    out = h.handle(alert("n2", job="4243"))
    assert [r.decision for r in out] == ["failed", "skipped"]
    assert "stop_on_failure" in out[1].reason
    assert not any("nodename=n2" in c for c in fakes.updates())


def test_undo_only_touches_nodes_gpuwarden_drained_and_is_opt_in(tmp_path, fakes, harness):
    cfg = config(tmp_path, actions={"drain": {"type": "slurm_drain"}, "resume": {"type": "slurm_resume"}},
                 receivers=[{"name": "r", "actions": ["drain"], "on_resolved": ["resume"]},
                            {"name": "plain", "actions": ["drain"]}],
                 route={"receiver": "r", "routes": [{"matchers": ['host="p1"'], "receiver": "plain"}]})
    h = harness(cfg)
    h.handle(alert("n1", id="u1"))
    assert h.handle(alert("n1", id="u1", state="resolved"))[0].decision == "acted"
    assert fakes.updates()[-1] == ["update", "nodename=n1", "state=resume"]
    out = h.handle(alert("n9", id="u9", state="resolved"))           # never drained by us
    assert out[0].decision == "skipped" and out[0].reason.startswith("undo: gpuwarden did not take n9 out")
    h.handle(alert("p1", id="p"))
    out = h.handle(alert("p1", id="p", state="resolved"))            # no on_resolved: nothing by default
    assert out[0].decision == "skipped" and "no undo configured" in out[0].reason
    assert fakes.updates()[-1] == ["update", "nodename=p1", "state=drain",
                                   "reason=gpuwarden: hbm_uncorrectable_error alert p"]


def test_group_wait_acts_once_per_node_and_survives_a_restart(tmp_path, fakes, harness):
    cfg = config(tmp_path, route={"receiver": "drain", "group_by": ["host"], "group_wait": "30s"})
    h = harness(cfg)
    for g in range(8):
        out = h.handle(alert("n1", gpu=g))
        assert out[0].decision == ("queued" if g == 0 else "skipped")
    h.restart()
    assert h.rem.tick() == 0 and fakes.updates() == []
    h.clock.t += 31
    assert h.rem.tick() == 1
    assert len(fakes.updates()) == 1 and "alert a-n1-0-" in fakes.updates()[0][-1]  # the group's first alert: GPU 0's
    out = h.handle(alert("n1", gpu=5, id="later"))
    assert out[0].decision == "skipped" and out[0].reason.startswith("repeat_interval")


def test_old_counts_are_pruned_but_claims_are_kept(tmp_path, fakes, harness):
    h = harness(config(tmp_path, guardrails={"cooldown": "1h", "attempt_window": "2h",
                                              "breaker": {"window": "10m"}}))
    h.handle(alert("n1", id="old"))
    db = h.store.db
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 1
    h.clock.t += 3 * 3600
    h.rem.tick()
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM node_actions").fetchone()[0] == 0
    assert h.handle(alert("n1", id="old"))[0].reason.startswith("duplicate")


def test_k8s_drain_cordons_and_evicts_after_a_taint_in_the_same_chain(tmp_path, fakes, harness):
    # The taint leaves the node "tainted"; the drain must run anyway (no already-out query),
    # and it counts once for the breaker, with the eviction options as argv.
    h = harness(config(tmp_path, actions={"taint": {"type": "k8s_taint"},
                                          "drain": {"type": "k8s_drain", "drain_timeout": "2m", "grace_period": 30,
                                                    "kubectl_args": ["--context", "prod"]}},
                       receivers=[{"name": "out", "actions": ["taint", "drain"]}], route={"receiver": "out"}))
    assert [r.decision for r in h.handle(alert("k7"))] == ["acted", "acted"]
    drains = [c for c in fakes.calls("kubectl") if "drain" in c]
    assert drains == [["--context", "prod", "drain", "k7", "--ignore-daemonsets", "--timeout=120s",
                       "--delete-emptydir-data", "--grace-period=30"]]
    assert [r.decision for r in h.handle(alert("k7", id="again"))] == ["skipped", "skipped"]  # cooldown


def test_k8s_drain_bad_durations_name_their_key(tmp_path):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="actions.d.drain_timeout"):
        config(tmp_path, actions={"d": {"type": "k8s_drain", "drain_timeout": "soon"}},
               receivers=[{"name": "d", "actions": ["d"]}], route={"receiver": "d"})
