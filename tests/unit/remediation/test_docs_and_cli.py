"""docs/remediation.md's configs load and its `routes test` lines pass; `remediate act` from the CLI."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.remediation.config import load_config, parse_config
from pipeline.schema import encode
from tests.unit.remediation.factories import alert

DOC = Path(__file__).resolve().parents[3] / "docs" / "remediation.md"


def doc_configs() -> dict[str, str]:
    """The doc's YAML blocks that start with ``# remediate-<name>.yaml``, by that name."""
    blocks = re.findall(r"```yaml\n(# (remediate-\S+\.yaml)\n.*?)```", DOC.read_text(), re.S)
    return {name: body for body, name in blocks}


def test_the_doc_has_a_complete_slurm_and_kubernetes_config():
    cfgs = doc_configs()
    assert set(cfgs) == {"remediate-slurm.yaml", "remediate-k8s.yaml", "remediate-incidents.yaml"}
    types = {name: {a["type"] for a in yaml.safe_load(body)["actions"].values()} for name, body in cfgs.items()}
    assert {"slurm_drain", "slurm_resume", "checkpoint", "gpu_reset", "webhook"} <= types["remediate-slurm.yaml"]
    assert {"k8s_cordon", "k8s_taint", "k8s_uncordon", "checkpoint"} <= types["remediate-k8s.yaml"]


@pytest.mark.parametrize("name", ["remediate-slurm.yaml", "remediate-k8s.yaml", "remediate-incidents.yaml"])
def test_doc_configs_load(name, tmp_path):
    doc = yaml.safe_load(doc_configs()[name])
    doc["state_file"] = str(tmp_path / "s.sqlite")
    cfg = parse_config(doc)
    assert cfg.guardrails.dry_run is False and cfg.guardrails.breaker.fleet_size
    assert cfg.raw.source == ("incidents" if name == "remediate-incidents.yaml" else "alerts")


@pytest.mark.parametrize("name", ["remediate-slurm.yaml", "remediate-k8s.yaml", "remediate-incidents.yaml"])
def test_doc_configs_start(name, tmp_path):
    # Live node actions need the inventory and a templated checkpoint URL needs allow_hosts: the
    # doc's configs must pass those start-time checks, not only load.
    from pipeline.remediation.audit import AuditLog
    from pipeline.remediation.guardrails import StateStore
    from pipeline.remediation.inventory import Inventory
    from pipeline.remediation.remediator import Remediator

    doc = yaml.safe_load(doc_configs()[name])
    doc["state_file"] = str(tmp_path / "s.sqlite")
    cfg = parse_config(doc)
    assert cfg.raw.inventory.source in ("slurm", "kubernetes")
    store = StateStore(cfg.state_file)
    try:
        inv = Inventory(cfg.raw.inventory.source, None, 300.0, hosts=frozenset({"gpu-node-007"}))
        Remediator(cfg, store, AuditLog(), inventory=inv).close()
    finally:
        store.close()


def test_doc_routes_test_lines_pass(tmp_path):
    cfgs = doc_configs()
    for name, body in cfgs.items():
        (tmp_path / name).write_text(body)
    lines = [ln for ln in DOC.read_text().splitlines() if ln.startswith("gpuwarden routes test ")]
    assert len(lines) >= 3
    for ln in lines:
        args = shlex.split(ln)[1:]
        args[args.index("--config") + 1] = str(tmp_path / args[args.index("--config") + 1])
        assert main(args) == 0, ln


def test_act_cli_force_is_still_blocked_by_an_open_breaker(tmp_path, fakes, capsys):
    cfg_path = tmp_path / "r.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "state_file": "s.sqlite", "audit": {"kafka": False, "file": "audit.jsonl"},
        "guardrails": {"dry_run": False, "breaker": {"max_nodes": 1}},
        "inventory": {"source": "list", "hosts": ["n1", "n2"]},
        "actions": {"drain": {"type": "slurm_drain"}}, "receivers": [{"name": "d", "actions": ["drain"]}],
        "route": {"receiver": "d"}}))
    for i, host in enumerate(["n1", "n2"]):
        f = tmp_path / f"a{i}.json"
        f.write_bytes(encode(alert(host, id=f"cli-{i}")))
        rc = main(["remediate", "act", "--config", str(cfg_path), "--alert", str(f)])
        assert rc == (0 if i == 0 else 1)
    assert "circuit breaker opened" in capsys.readouterr().out
    # the same alert again, forced: the breaker still says no, and nothing is called
    before = len(fakes.calls())
    assert main(["remediate", "act", "--config", str(cfg_path), "--alert", str(tmp_path / "a1.json"), "--force"]) == 1
    out = capsys.readouterr().out
    assert '"decision":"blocked"' in out and '"forced":true' in out
    assert len(fakes.calls()) == before
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 3
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["remediate", "act", "--config", str(cfg_path), "--alert", str(bad)]) == 3   # unreadable input
    assert load_config(cfg_path).state_file == tmp_path / "s.sqlite"
