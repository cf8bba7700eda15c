"""The tree is lint-clean (ruff, configured in pyproject.toml): part of `make test`."""

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
