"""The layer rules of CONTRIBUTING.md, checked: which package may import which.

Read from the source (ast), so a forbidden import fails here before it can make a cycle or let
the engine reach up into the rule language. Imports under ``if TYPE_CHECKING:`` are type
annotations only and do not count, except in the engine: it knows the rules and models only
as stages (``pipeline/engine/stage.py``), so it does not name them even for the type checker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FOUNDATION = {"pipeline.catalog", "pipeline.errors", "pipeline.schema", "pipeline.gpu_models", "pipeline.resources",
              "pipeline.yamlsafe", "pipeline.decode", "pipeline.scoring", "pipeline.progress", "pipeline.numeric",
              "pipeline.durations", "pipeline.typedconfig", "pipeline.deadletters", "pipeline.httpendpoint",
              "pipeline.colwire", "pipeline.rows"}

# package -> the packages it must never import (at run time)
FORBIDDEN = {
    **{f: {"pipeline.bus", "pipeline.engine", "pipeline.rules", "pipeline.models", "pipeline.service",
           "pipeline.remediation", "pipeline.detection", "pipeline.runner", "pipeline.cli", "producers"}
       for f in FOUNDATION},
    "pipeline.bus": {"pipeline.engine", "pipeline.rules", "pipeline.models", "pipeline.service",
                     "pipeline.remediation", "pipeline.detection", "pipeline.runner", "pipeline.cli", "producers"},
    "pipeline.engine": {"pipeline.rules", "pipeline.models", "pipeline.service", "pipeline.remediation",
                        "pipeline.bus", "pipeline.detection", "pipeline.runner", "pipeline.cli", "producers"},
    "pipeline.rules": {"pipeline.models", "pipeline.service", "pipeline.remediation", "pipeline.detection",
                       "pipeline.runner", "pipeline.cli", "producers"},
    "pipeline.models": {"pipeline.service", "pipeline.remediation", "pipeline.detection", "pipeline.runner",
                        "pipeline.cli", "producers"},
    "pipeline.remediation": {"pipeline.engine", "pipeline.rules", "pipeline.models", "pipeline.service",
                             "pipeline.detection", "pipeline.runner", "pipeline.cli", "producers"},
    # Incidents read alert events: nothing of detection, the bus or the drivers above them.
    "pipeline.incidents": {"pipeline.bus", "pipeline.engine", "pipeline.rules", "pipeline.models",
                           "pipeline.service", "pipeline.remediation", "pipeline.detection", "pipeline.runner",
                           "pipeline.cli", "producers"},
    "producers": {"pipeline.engine", "pipeline.rules", "pipeline.models", "pipeline.remediation",
                  "pipeline.service", "pipeline.detection", "pipeline.runner", "pipeline.cli"},
}


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "producers":
        return "producers"
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


# package -> the packages it may not import even under ``if TYPE_CHECKING:``
FORBIDDEN_FOR_TYPES = {"pipeline.engine": {"pipeline.rules", "pipeline.models"}}


def _runtime_imports(path: Path, typing_too: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = set() if typing_too else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING" for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "pipeline" else [node.module]
            out.update(names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.split(".")[0] in ("pipeline", "producers", "tests", "bench")}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for top in ("pipeline", "producers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found.append((mod.removesuffix(".__init__"), path))
    return found


def violations(modules: list[tuple[str, Path]], typing_too: bool = False) -> list[str]:
    out = []
    for mod, path in modules:
        own = _package(mod)
        banned = (FORBIDDEN_FOR_TYPES if typing_too else FORBIDDEN).get(own, set())
        for imp in sorted(_runtime_imports(path, typing_too)):
            target = _package(imp)
            if imp.split(".")[0] in ("tests", "bench"):
                out.append(f"{mod} imports {imp}: the product never imports its tests or benchmarks")
            elif target != own and any(target == b or target.startswith(b + ".") for b in banned):
                out.append(f"{mod} imports {imp} ({own} may not import {target}; CONTRIBUTING.md)")
    return out


def test_every_import_keeps_to_the_layers() -> None:
    assert violations(_modules()) == []


def test_the_contract_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "engine_bad.py"
    bad.write_text("from typing import TYPE_CHECKING\nfrom pipeline.rules.ruleset import RuleSet\n"
                   "if TYPE_CHECKING:\n    from pipeline.models.modelset import ModelSet\n")
    found = violations([("pipeline.engine.bad", bad)])
    assert found == ["pipeline.engine.bad imports pipeline.rules.ruleset (pipeline.engine may not import "
                     "pipeline.rules; CONTRIBUTING.md)"]


def test_the_engine_names_no_rules_or_models_even_for_types() -> None:
    assert violations(_modules(), typing_too=True) == []


def test_the_type_only_contract_catches_a_type_only_import(tmp_path: Path) -> None:
    bad = tmp_path / "engine_bad.py"
    bad.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.models.modelset import ModelSet\n")
    assert violations([("pipeline.engine.bad", bad)]) == []
    assert violations([("pipeline.engine.bad", bad)], typing_too=True) == [
        "pipeline.engine.bad imports pipeline.models.modelset (pipeline.engine may not import pipeline.models; "
        "CONTRIBUTING.md)"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_package_of_the_table_exists(package: str) -> None:
    assert (ROOT / package.replace(".", "/")).exists() or (ROOT / (package.replace(".", "/") + ".py")).exists()
