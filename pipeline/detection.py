"""Build the engine a driver runs: rule files, plus the online models when configured.

``models="auto"`` uses ``models.yaml`` beside the first rule directory when there is one (the
default packs ship ``rules/models.yaml``); ``None`` or ``"none"`` runs rules only.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.engine import Engine, EngineConfig
from pipeline.errors import ConfigError
from pipeline.rules import load_rules
from pipeline.rules.diagnostics import Diagnostic


def models_path(rules: list[str], models: str | None) -> Path | None:
    if not models or models == "none":
        return None
    if models == "auto":
        for r in rules:
            p = Path(r)
            cand = p / "models.yaml" if p.is_dir() else p.parent / "models.yaml"
            if cand.is_file():
                return cand
        return None
    return Path(models)


def build_engine(rules: list[str], models: str | None = "auto", config: EngineConfig | None = None
                 ) -> tuple[Engine | None, list[Diagnostic]]:
    """An engine with the rules (and models), or None and the diagnostics when rules do not load.

    A broken models file raises ``ConfigError`` naming the key.
    """
    from pipeline.models import load_models

    config = config or EngineConfig()
    mpath = models_path(rules, models)
    modelset = load_models(mpath, tick=config.tick) if mpath is not None else None
    paths: list[str | Path] = list(rules)
    ruleset, diags = load_rules(paths, tick=config.tick, models=set(modelset.names) if modelset else None)
    if ruleset is None:
        return None, diags
    return Engine(config, rules=ruleset, models=modelset), diags


__all__ = ["ConfigError", "build_engine", "models_path"]
