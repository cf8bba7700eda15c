"""Build the engine a driver runs: rule files, plus the online models when configured.

``models="auto"`` uses ``models.yaml`` beside the first rule directory when there is one (the
default packs ship ``rules/models.yaml``); ``None`` or ``"none"`` runs rules only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.engine import Engine, EngineConfig
from pipeline.errors import ConfigError
from pipeline.hang import HangDetector, load_settings
from pipeline.protocols import Detector
from pipeline.rules import load_rules
from pipeline.rules.diagnostics import Diagnostic
from pipeline.rules.portconfig import load_port_config
from pipeline.rules.nicaer import NicAerStage
from pipeline.rules.ports import PortStage
from pipeline.shards import ShardedFleet
from pipeline.topology import Topology


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


def ports_path(rules: list[str]) -> Path | None:
    """``fabric/ports.yaml`` beside the first rule directory (or rule file) that has one: the NIC
    port checks' settings (``pipeline/rules/portconfig.py``); None runs no port checks."""
    for r in rules:
        p = Path(r)
        cand = (p if p.is_dir() else p.parent) / "fabric" / "ports.yaml"
        if cand.is_file():
            return cand
    return None


@dataclass
class Stages:
    """What a driver builds its detector from: the host stage's engine, and the fleet stage's
    engine factory when the models run in a stage of their own (None: everything runs in
    ``host``)."""

    host: Engine
    fleet: Callable[[], Engine] | None = None
    # The fleet stage's hung-collective detector (pipeline/hang.py), when ``hang.yaml`` is there.
    hang: Callable[[], HangDetector] | None = None
    # Rules only with a hang detector: the fleet stage's engine runs nothing, and the host stage
    # forwards it the progress records alone (docs/architecture.md §8).
    progress_only: bool = False

    def detector(self, local_fleet: bool = True, shards: int = 1) -> Detector:
        """The ``Engine``, or the ``Topology`` of both stages (``local_fleet``: see ``Topology``;
        ``shards``: with the models, their work in that many shards by host, pipeline/shards.py)."""
        if self.fleet is None:
            return self.host
        fleet = None
        if shards > 1 and local_fleet and not self.progress_only:
            fleet = ShardedFleet(self.fleet, shards, hang=self.hang() if self.hang is not None else None)
        return Topology(
            self.host,
            self.fleet,
            local_fleet=local_fleet,
            make_hang=self.hang,
            progress_only=self.progress_only,
            fleet=fleet,
        )


def hang_path(rules: list[str]) -> Path | None:
    """``hang.yaml`` beside the first rule directory (or file) that has one."""
    for r in rules:
        p = Path(r)
        cand = p / "hang.yaml" if p.is_dir() else p.parent / "hang.yaml"
        if cand.is_file():
            return cand
    return None


def build_stages(
    rules: list[str], models: str | None = "auto", config: EngineConfig | None = None, stages: str = "two"
) -> tuple[Stages | None, list[Diagnostic]]:
    """The rules in an ``Engine``, and with models (``stages="two"``) the fleet stage's engine
    factory beside it (rules and absence per host, the models across hosts: pipeline/topology.py);
    ``stages="one"``: the models in the rules' engine. Rules only, ``stages="two"`` and a
    ``hang.yaml`` beside the rules: a fleet stage for the hang detector alone, which the host stage
    forwards the progress records only (``Stages.progress_only``). None and the diagnostics when
    the rules do not load. Rules that read ``score()`` keep the models in their engine whatever ``stages``
    says.

    A broken models file raises ``ConfigError`` naming the key, as does a broken ``hang.yaml``
    (the fleet stage's hung-collective thresholds, beside the rules: pipeline/hang.py).
    """
    from pipeline.models import load_models

    config = config or EngineConfig()
    mpath = models_path(rules, models)
    modelset = load_models(mpath, tick=config.tick) if mpath is not None else None
    paths: list[str | Path] = list(rules)
    ruleset, diags = load_rules(paths, tick=config.tick, models=set(modelset.names) if modelset else None)
    if ruleset is None:
        return None, diags
    ports: list[PortStage | NicAerStage] = []
    if (ppath := ports_path(rules)) is not None:
        pconfig, pdiags = load_port_config(ppath)
        diags = diags + pdiags  # its warnings said as the rule files' are
        if pconfig is None:
            return None, diags
        ports += [PortStage(pconfig), NicAerStage(pconfig)]  # the NIC's AER checks share the file
    hang = _hang_factory(rules) if stages == "two" else None
    if modelset is None:
        if stages == "two" and hang is not None:
            # Rules only: a fleet stage for the hang detector alone, fed the progress records.
            def bare_engine() -> Engine:
                return Engine(config, row_checks=[], tick_checks=[], screened=True)

            return Stages(Engine(config, rules=ruleset, stages=ports), bare_engine, hang, progress_only=True), diags
        return Stages(Engine(config, rules=ruleset, stages=ports)), diags
    if stages == "two":
        # The host stage's rules are loaded without models: when they load so, none reads a
        # score and the models can run in their own stage.
        alone, _ = load_rules(paths, tick=config.tick, models=None)
        if alone is not None:
            mp = mpath

            def fleet_engine() -> Engine:
                return Engine(
                    config, row_checks=[], tick_checks=[], models=load_models(mp, tick=config.tick), screened=True
                )

            return Stages(Engine(config, rules=alone, stages=ports), fleet_engine, hang), diags
    return Stages(Engine(config, rules=ruleset, models=modelset, stages=ports)), diags


def _hang_factory(rules: list[str]) -> Callable[[], HangDetector] | None:
    """Fresh hang detectors with the thresholds of the ``hang.yaml`` beside the rules (read
    once: a broken one is a ``ConfigError`` now), or None without one."""
    hpath = hang_path(rules)
    if hpath is None:
        return None
    hs = load_settings(hpath)
    return lambda: HangDetector(hs)


def build_engine(
    rules: list[str],
    models: str | None = "auto",
    config: EngineConfig | None = None,
    stages: str = "one",
    shards: int = 1,
) -> tuple[Detector | None, list[Diagnostic]]:
    """An engine with the rules and models (``stages="one"``), or what the product's drivers
    feed (``stages="two"``, ``build_detector``; ``shards``: ``Stages.detector``); None and the
    diagnostics when the rules do not load (``build_stages``)."""
    built, diags = build_stages(rules, models, config, stages)
    return (built.detector(shards=shards) if built is not None else None), diags


def build_detector(
    rules: list[str], models: str | None = "auto", config: EngineConfig | None = None, shards: int = 1
) -> tuple[Detector | None, list[Diagnostic]]:
    """What replay, the demo, the evaluation and the service run: ``build_engine(stages="two")``."""
    return build_engine(rules, models, config, stages="two", shards=shards)


__all__ = ["ConfigError", "Stages", "build_detector", "build_engine", "build_stages", "hang_path", "models_path"]


@functools.cache
def shipped_faults() -> frozenset[str]:
    """Every fault gpuwarden's shipped detectors raise: the ``fault:`` values of the default packs
    (rules, models, kernel-log signatures; not their tests), the NIC/PCIe port checks', the
    engine's built-in checks' (absence, NCCL wrong results) and the hang detector's. A broken pack file is passed over.

    >>> {"gpu_lost", "hang_collective", "hbm_uncorrectable_error"} <= shipped_faults()
    True
    """
    import yaml

    from pipeline import yamlsafe
    from pipeline.engine.checks import builtin_checks
    from pipeline.engine.wrongresults import FAULT as WRONG_RESULTS
    from pipeline.hang import FAULT as HANG_FAULT
    from pipeline.resources import rules_dir
    from pipeline.rules.portconfig import DEFAULTS as PORT_CHECKS

    found: set[str] = {HANG_FAULT, WRONG_RESULTS, *(c.fault for c in PORT_CHECKS.values())}
    rows, ticks = builtin_checks()
    found |= {c.meta.fault for c in rows} | {c.meta.fault for c in ticks}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "fault" and isinstance(v, str):
                    found.add(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    packs = rules_dir()
    for f in sorted(packs.rglob("*.yaml")):
        if "tests" in f.relative_to(packs).parts:
            continue
        try:
            walk(yamlsafe.load(f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError):
            continue
    return frozenset(found)
