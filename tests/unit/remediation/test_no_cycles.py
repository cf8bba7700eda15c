"""Remediation's modules import one another only at module top, and each imports on its own.

An import inside a function hides a cycle (config -> presets -> config) until the function runs;
the typed specs (``specs``) and durations (``pipeline.durations``) are where the modules meet.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.remediation.config import parse_duration
from tests.unit.remediation.factories import config

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "pipeline" / "remediation"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _nested_sibling_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if id(node) in top or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline":
            names = [f"pipeline.{a.name}" for a in node.names]
        out += [f"{path.name}:{node.lineno}: {n}" for n in names if n.startswith("pipeline.remediation")]
    return out


def test_no_function_level_imports_of_sibling_modules():
    found = [hit for m in MODULES for hit in _nested_sibling_imports(PACKAGE / f"{m}.py")]
    assert found == []


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    # First in a fresh process: a cycle shows as an ImportError of a partly initialised module.
    run = subprocess.run([sys.executable, "-c", f"import pipeline.remediation.{module}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]


def test_cooldown_takes_the_rules_duration_dialect(tmp_path, harness):
    # 1m30s was refused ("expected a duration such as 30s, 10m, 4h") before the one dialect.
    cfg = config(tmp_path, actions={"log": {"type": "log"}}, receivers=[{"name": "r", "actions": ["log"]}],
                 route={"receiver": "r", "group_wait": "1m30s"}, guardrails={"cooldown": "1m30s"})
    assert harness(cfg).rem.limits.cooldown == 90.0
    assert parse_duration("1h30m", "k") == 5400 and parse_duration(" 10 m ", "k") == 600
    assert parse_duration("90", "k") == 90   # a quoted number is seconds, as before


def test_bad_durations_still_name_their_key():
    with pytest.raises(ConfigError) as e:
        parse_duration("1m30", "guardrails.cooldown")
    assert e.value.key == "guardrails.cooldown" and "1m30" in str(e.value)
