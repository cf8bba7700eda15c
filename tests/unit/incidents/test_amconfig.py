"""`gpuwarden rules alertmanager-config`: the causality of incidents.yaml as Alertmanager
inhibit rules (the real Alertmanager loads and applies them in
tests/integration/test_alertmanager_incidents.py)."""

from __future__ import annotations

import fnmatch
import re

import yaml

from pipeline.cli import main
from pipeline.errors import EXIT_INPUT
from pipeline.incidents import default_config
from pipeline.incidents.amconfig import alertmanager_config, glob_regex, inhibit_rules
from pipeline.incidents.config import Cause


def test_glob_patterns_match_the_same_rule_names_as_the_stage():
    patterns = ["nvlink_*", "gpu_xid_?ritical", "hbm_[rs]*", "a.b", "x[!y]z"]
    names = ["nvlink_xid74", "nvlink_", "gpu_xid_critical", "gpu_xid_warning", "hbm_row", "hbm_sbe", "hbm_dbe",
             "a.b", "axb", "xaz", "xyz"]
    for p in patterns:
        rx = re.compile(glob_regex([p]))
        for n in names:
            assert bool(rx.fullmatch(n)) == fnmatch.fnmatchcase(n, p), (p, n)


def test_each_reach_becomes_its_inhibitions():
    host = inhibit_rules(Cause("link", ("nvlink_*",), ("nccl_comm_busbw",), "host"))
    assert [r["equal"] for r in host] == [["host"]]
    assert host[0]["target_matchers"][-2:] == ['alertname=~"nccl_comm_busbw"', 'alertname!~"nvlink_.*"']
    assert [r["equal"] for r in inhibit_rules(Cause("g", ("a",), ("b",), "gpu"))] == [["host", "gpu"]]
    comm = inhibit_rules(Cause("c", ("gpu_fallen_off_bus",), ("gpu_fallen_off_bus", "nccl_*"), "comm"))
    assert [r["equal"] for r in comm] == [["host", "gpu"], ["host"]]
    assert 'gpu=""' in comm[1]["target_matchers"] and 'gpu=""' not in comm[0]["target_matchers"]
    # the cause itself is never a target: an alert must not inhibit itself
    assert all('alertname=~"nccl_.*"' in r["target_matchers"] for r in comm)
    assert inhibit_rules(Cause("hbm", ("hbm_*",), ("hbm_*",), "gpu")) == []


def test_the_shipped_causality_prints_as_a_complete_config(capsys):
    assert main(["rules", "alertmanager-config", "--receiver", "gpu-team"]) == 0
    out = capsys.readouterr().out
    doc = yaml.safe_load(out)
    assert doc == alertmanager_config(default_config(), "gpu-team")
    assert doc["route"]["receiver"] == "gpu-team" and doc["receivers"] == [{"name": "gpu-team"}]
    assert doc["route"]["group_by"] == ["host", "gpu"]
    assert doc["route"]["routes"] == [{"matchers": ['incident=~".+"'], "group_by": ["incident"]}]
    names = [c.name for c in default_config().causality]
    assert all(f"#   {n}: " in out for n in names)
    assert "#   memory_escalation: grouping only" in out


def test_an_incidents_file_that_does_not_load_prints_its_diagnostics(tmp_path, capsys):
    bad = tmp_path / "incidents.yaml"
    bad.write_text("causality:\n  - name: x\n    cause: [a]\n    explains: [b]\n    reach: galaxy\n")

    assert main(["rules", "alertmanager-config", "--incidents", str(bad)]) == EXIT_INPUT
    cap = capsys.readouterr()
    assert cap.out == "" and f"{bad}:5:" in cap.err and "reach" in cap.err and "no configuration printed" in cap.err
