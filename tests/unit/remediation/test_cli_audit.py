"""The remediation CLI as an operator meets it: a one-shot `remediate act` reaches a decision on a
route with group_wait, `breaker status` reads without creating the state file, and `routes test`
flags a fault name no detector raises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from pipeline.cli import main
from pipeline.schema import encode
from tests.unit.remediation.factories import Harness, alert, config

ROOT = Path(__file__).resolve().parents[3]
FINAL = {"acted", "dry_run", "skipped", "failed", "blocked"}


def _grouped_cfg(tmp_path: Path, inventory: dict) -> Path:
    """rules/routes.yaml's shape: a node-fatal route grouping by host with a 30s group_wait."""
    p = tmp_path / "routes.yaml"
    p.write_text(yaml.safe_dump({
        "state_file": "state.sqlite", "audit": {"kafka": False, "file": "audit.jsonl"},
        "inventory": inventory,
        "actions": {"log": {"type": "log"}, "drain": {"type": "slurm_drain"}},
        "receivers": [{"name": "log-only", "actions": ["log"]}, {"name": "drain-node", "actions": ["drain"]}],
        "route": {"receiver": "log-only", "group_by": ["..."], "repeat_interval": "4h", "routes": [
            {"name": "node-fatal", "matchers": ['severity="critical"'], "receiver": "drain-node",
             "group_by": ["host"], "group_wait": "30s"}]},
    }))
    return p


def _act(cfg: Path, a, tmp_path: Path, capsys) -> tuple[int, list[dict], str]:
    f = tmp_path / f"{a.id}.json"
    f.write_bytes(encode(a))
    rc = main(["remediate", "act", "--config", str(cfg), "--alert", str(f)])
    out, err = capsys.readouterr()
    return rc, [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")], err


def test_act_decides_now_on_a_route_with_group_wait(tmp_path, fakes, capsys):
    cfg = _grouped_cfg(tmp_path, {"source": "list", "hosts": ["n1"]})
    rc, recs, err = _act(cfg, alert("n1", gpu=0, id="g-0"), tmp_path, capsys)
    # Before: one `queued` record and nothing else, ever (no service ticks after a one-shot).
    assert rc == 0 and [(r["decision"], r.get("action")) for r in recs] == [("dry_run", "drain")]
    assert "group_wait 30s not waited" in err and "one-shot" in err
    # Again: a duplicate that says what was decided, not "outcome unknown".
    rc, recs, _ = _act(cfg, alert("n1", gpu=0, id="g-0"), tmp_path, capsys)
    assert [r["decision"] for r in recs] == ["skipped"]
    assert "dry_run:drain" in recs[0]["reason"] and "outcome unknown" not in recs[0]["reason"]
    # Another GPU of the same node: its group already acted.
    _, recs, _ = _act(cfg, alert("n1", gpu=1, id="g-1"), tmp_path, capsys)
    assert [r["decision"] for r in recs] == ["skipped"] and recs[0]["reason"].startswith("repeat_interval:")


def test_act_applies_the_inventory_on_its_first_run(tmp_path, monkeypatch, capsys):
    # The audit's run: a slurm inventory that cannot load (no sinfo) knows no host.
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    cfg = _grouped_cfg(tmp_path, {"source": "slurm"})
    rc, recs, _ = _act(cfg, alert("n1", id="u-0"), tmp_path, capsys)
    assert [r["decision"] for r in recs] == ["skipped"] and recs[0]["reason"].startswith("unknown_host:")
    assert {r["decision"] for r in recs} <= FINAL


def test_the_service_still_waits_and_a_duplicate_says_queued(tmp_path):
    cfg = config(tmp_path, route={"receiver": "drain", "group_by": ["host"], "group_wait": "30s"})
    h = Harness(cfg)
    try:
        assert [r.decision for r in h.handle(alert("n1", id="q-0"))] == ["queued"]
        again = h.handle(alert("n1", id="q-0"))
        assert [r.decision for r in again] == ["skipped"] and "(queued until " in again[0].reason
    finally:
        h.close()


def test_breaker_status_does_not_create_the_state_file(tmp_path, capsys):
    rem = tmp_path / "rem"
    rem.mkdir()
    shutil.copy(ROOT / "rules" / "routes.yaml", rem / "routes.yaml")
    cfg = str(rem / "routes.yaml")
    state = rem / "remediation-state.sqlite"
    assert main(["remediate", "breaker", "status", "--config", cfg, "--exit-code"]) == 0
    out = capsys.readouterr().out
    assert "breaker: closed" in out and "does not exist yet" in out and str(state) in out
    assert main(["remediate", "breaker", "status", "--config", cfg, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["open"] is False and st["hosts_in_window"] == [] and st["state_file_exists"] is False
    assert sorted(p.name for p in rem.iterdir()) == ["routes.yaml"]      # nothing created
    # a state file in a directory not made yet: not made either
    other = rem / "other.yaml"
    other.write_text((rem / "routes.yaml").read_text().replace("remediation-state.sqlite", "var/s.sqlite"))
    assert main(["remediate", "breaker", "status", "--config", str(other)]) == 0
    assert not (rem / "var").exists()
    capsys.readouterr()
    # reset changes state: it creates the file, and status then reads it
    assert main(["remediate", "breaker", "reset", "--config", cfg, "--by", "oncall"]) == 0
    assert state.exists()
    capsys.readouterr()
    assert main(["remediate", "breaker", "status", "--config", cfg, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state_file_exists"] is True and st["reset_by"] == "oncall"


def test_routes_test_flags_a_mistyped_fault(capsys):
    rc = main(["routes", "test", "fault=hbm_uncorectable", "severity=critical", "host=gpu-node-007"])
    out, err = capsys.readouterr()
    assert rc == 0 and "page-critical" in out    # still answered: a pack of one's own may raise it
    assert "fault=hbm_uncorectable" in err and "did you mean hbm_uncorrectable_error" in err
    rc = main(["routes", "test", "fault=hbm_uncorrectable_error", "severity=critical", "host=gpu-node-007",
               "--expect", "drain-node"])
    assert rc == 0 and "warning" not in capsys.readouterr().err


def test_routes_test_takes_a_custom_fault_its_routes_name(tmp_path, capsys):
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({
        "state_file": "s.sqlite", "actions": {"log": {"type": "log"}},
        "receivers": [{"name": "a", "actions": ["log"]}, {"name": "b", "actions": ["log"]}],
        "route": {"receiver": "a", "routes": [
            {"matchers": ['fault=~"hbm_site_custom|gpu_site_other"'], "receiver": "b"}]}}))
    assert main(["routes", "test", "fault=hbm_site_custom", "--config", str(p), "--expect", "b"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["routes", "test", "fault=hbm_site_custm", "--config", str(p), "--expect", "a"]) == 0
    assert "did you mean hbm_site_custom" in capsys.readouterr().err
