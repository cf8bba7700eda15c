"""The examples in docstrings run (and stay true): every module of the package, the producers
and the benchmarks."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for top in ("pipeline", "producers", "bench") for p in (ROOT / top).rglob("*.py")
                 if p.name != "__main__.py")


def _with_examples() -> list[str]:
    out = []
    for name in MODULES:
        text = (ROOT / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8") \
            if (ROOT / (name.replace(".", "/") + ".py")).exists() else \
            (ROOT / name.replace(".", "/") / "__init__.py").read_text(encoding="utf-8")
        if ">>> " in text:
            out.append(name)
    return out


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has '>>> ' but no example ran"
    assert result.failed == 0
