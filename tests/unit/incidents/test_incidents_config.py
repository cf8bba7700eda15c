"""incidents.yaml: the shipped file loads, and a bad one gets file:line:col diagnostics with codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.incidents import default_config, load_config, parse_config
from pipeline.incidents.config import IncidentConfigError
from pipeline.resources import rules_dir
from pipeline.rules.loader import load_rules, rule_files

SHIPPED = rules_dir() / "incidents.yaml"


def test_the_shipped_file_loads_with_its_policies() -> None:
    cfg, diags = load_config(SHIPPED)
    assert diags == [] and cfg is not None
    assert {p.name for p in cfg.policies} == {"xid79_repeat", "lemon_host", "nvlink_flaps"}
    assert {13, 31, 43, 45} <= cfg.application_xids.xids and 79 not in cfg.application_xids.xids
    assert cfg.action_for("hbm_dbe", "critical") == "drain_node"
    # No catch-all pattern hides default_action: a critical rule the file does not name (a pack
    # of one's own, the critical NVLink rate rules) calls for a drain, a warning for a watch.
    assert cfg.action_for("anything_else", "critical") == "drain_node"
    assert cfg.action_for("nvlink_crc_error_rate_high", "critical") == "drain_node"
    assert cfg.action_for("anything_else", "warning") == "watch"
    assert cfg.action_for("nvlink_recoveries", "critical") == "watch"  # nvlink_flaps escalates it


def test_the_rule_loader_leaves_incidents_yaml_to_the_incident_stage() -> None:
    # A rule directory holding incidents.yaml still loads: the file is not a rule pack.
    assert SHIPPED not in rule_files([rules_dir()])
    rs, diags = load_rules([rules_dir()])
    assert rs is not None and not [d for d in diags if d.is_error]


def test_a_config_beside_a_custom_rule_directory_wins(tmp_path: Path) -> None:
    (tmp_path / "incidents.yaml").write_text("quiet: 1m\nactions: [watch]\n")
    assert default_config(tmp_path).quiet == 60.0
    (tmp_path / "bare").mkdir()
    assert default_config(tmp_path / "bare").quiet == default_config().quiet


def test_a_broken_config_beside_the_rules_is_an_error_naming_the_problem(tmp_path: Path) -> None:
    (tmp_path / "incidents.yaml").write_text("quiet: soon\n")
    with pytest.raises(IncidentConfigError, match=r"incidents.yaml:1:8: quiet: 'soon' is not a duration .*\[I007\]"):
        default_config(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("joinwindow: 5m\n", "1:1: the incidents file: unknown key 'joinwindow'"),
        ("quiet: -5m\n", "1:8: quiet:"),
        ("actions: [watch, watch]\n", "1:10: actions: an action is named twice [I008]"),
        ("actions: [watch]\ndefault_action: {critical: reboot}\n", "2:28: default_action.critical: 'reboot' is not one of watch [I006]"),
        ("causality:\n  - name: a\n    cause: [x]\n", "2:5: causality[0]: missing key 'explains' [I005]"),
        ("causality:\n  - {name: a, cause: [x], explains: [y], reach: fleet}\n", "reach: 'fleet' is not one of gpu, host, comm [I006]"),
        ("causality:\n  - {name: a, cause: ['$(rm)'], explains: [y]}\n", "is not a rule name or pattern"),
        ("policies:\n  - {name: p, count: xid, per: gpu, threshold: 5, window: 1h, action: watch}\n",
         "policy p: count xid needs the xids it counts [I005]"),
        ("policies:\n  - {name: p, count: incidents, per: gpu, threshold: 5, window: 1h, action: watch}\n",
         "policy p: incidents are counted per host [I006]"),
        ("policies:\n  - {name: p, count: xid, xids: [79], per: gpu, threshold: 1, window: 1h, action: watch}\n",
         "threshold: 1 is not a whole number from 2 to 10000"),
        ("application_xids: {rules: [x], buckets: [NOPE], repeat: 3, window: 1h}\n", "bucket 'NOPE' is not in the XID catalogue"),
        ("quiet: !!python/object:os.system echo\n", "1:8: YAML tag 'tag:yaml.org,2002:python/object:os.system' is not allowed"),
        ("quiet: [\n", "YAML syntax"),
        ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(f"b{i}: &b{i} [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" for i in range(8)),
         "[I011]"),
        ("x:\n" + "".join("  " * i + "- \n" for i in range(1, 40)), "[I012]"),
        ("description: " + "x" * 300_000 + "\n", "[I010]"),
        ("- just a list\n", "1:1: the incidents file must be a mapping [I003]"),
        # Plain tags whose constructors raised KeyError and IndexError: a crash, not a diagnostic.
        ("quiet: !!bool maybe\n", "1:8: cannot read a value: 'maybe' is not a YAML bool [I006]"),
        ("policies:\n  - {name: p, count: xid, xids: [!!int ''], per: gpu, threshold: 2, window: 1h, action: watch}\n",
         "2:34: cannot read a value: '' is not a YAML int [I006]"),
        ('description: "\\ud800"\n', "1:14: YAML syntax: a string with a lone surrogate (U+D800)"),
    ],
)
def test_a_bad_config_is_refused_with_a_positioned_diagnostic(text: str, expected: str) -> None:
    cfg, diags = parse_config(text, "inc.yaml")
    assert cfg is None
    shown = "\n".join(map(str, diags))
    assert all(str(d).startswith("inc.yaml:") for d in diags)
    assert expected in shown, shown


def test_every_problem_is_reported_at_once() -> None:
    _, diags = parse_config("quiet: soon\njoin_window: never\nextra: 1\n", "inc.yaml")
    assert [d.code for d in diags] == ["I004", "I007", "I007"] or sorted(d.code for d in diags) == ["I004", "I007", "I007"]


def test_an_unreadable_file_is_a_diagnostic(tmp_path: Path) -> None:
    p = tmp_path / "incidents.yaml"
    p.write_bytes(b"\xff\xfe\x00bad")
    cfg, diags = load_config(p)
    assert cfg is None and diags[0].code == "I013"
