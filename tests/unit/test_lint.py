"""The tree is lint-clean and formatted (ruff, configured in pyproject.toml): part of `make test`."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: make test installs it"
    res = subprocess.run([ruff, "check", "--no-cache", "pipeline", "producers", "tests", "bench", "scripts"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_has_nothing_to_change() -> None:
    # The formatter's layout (pyproject.toml [tool.ruff]) on the package code.
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: make test installs it"
    res = subprocess.run([ruff, "format", "--check", "--no-cache", "pipeline", "producers"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_two_test_modules_share_a_name() -> None:
    # The test folders are not packages: pytest imports each test module by its basename, and a
    # second file of the same name stops the whole collection.
    root = Path(__file__).resolve().parents[2] / "tests"
    names = [p.name for p in root.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def _test_module_imports(root: Path) -> list[str]:
    """``file:line`` of each import, in a module under ``root``, of a test module (``test_*``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            if any(part.startswith("test_") for m in modules for part in m.split(".")):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    # House style: a helper or constant two test modules share lives in a factories module beside
    # them (tests/**/*factories.py), never imported from a test module or a conftest.
    found = _test_module_imports(ROOT / "tests")
    assert found == [], "move what these take from a test module into a factories module:\n" + "\n".join(found)
