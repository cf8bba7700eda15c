"""The one build step pyproject.toml cannot say: the wheel carries the rule packs.

``rules/`` (rule packs, ``models.yaml``, ``routes.yaml``, the baselines and the rule tests) is
edited in place at the top of the repository; a wheel gets a copy of it as the package data
``pipeline/packs/``, where an installed gpuwarden finds it (``pipeline/resources.py``). An
editable install has no copy and reads ``rules/`` itself.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RULES = Path(__file__).resolve().parent / "rules"


class BuildWithPacks(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "pipeline" / "packs"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(RULES, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        dest = Path(self.build_lib) / "pipeline" / "packs"
        return outputs + [str(dest / p.relative_to(RULES)) for p in RULES.rglob("*") if p.is_file()]


setup(cmdclass={"build_py": BuildWithPacks})
