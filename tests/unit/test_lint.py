"""The tree is lint-clean and formatted (ruff, configured in pyproject.toml): part of `make test`."""

from __future__ import annotations

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
