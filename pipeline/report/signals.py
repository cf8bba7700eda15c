"""Which signals an alert's detector reads, so its report section plots exactly those.

A rule reads the catalog columns its condition and values compile to; a model reads its
detector's features. Both are found by loading the rule packs and models the alerts came from.
When an alert names a check that is not loaded (another rule directory, a renamed rule), the
field names in its evidence keys stand in: ``increase(ecc_sbe_volatile, 1m)`` still says which
field mattered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pipeline.catalog import FIELDS
from pipeline.errors import GpuwardenError
from pipeline.schema import AlertEvent

DCGM, NCCL, PRESENCE = "dcgm", "nccl", "presence"
# NCCL record attributes a detector may read (pipeline.schema.NcclRecord).
NCCL_FIELDS = ("exec_time_us", "busbw_gbs", "algbw_gbs")
MAX_SIGNALS = 8  # panels per alert: more than this and none of them is readable

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Signal:
    """One plotted series: a catalog field alias (dcgm), an NCCL attribute, or sample arrival."""

    name: str
    source: str = DCGM


PRESENCE_SIGNAL = Signal("samples", PRESENCE)


@dataclass
class CheckInfo:
    """What the report says about the rule or model behind an alert."""

    name: str
    kind: str  # rule | model | builtin
    signals: tuple[Signal, ...]
    definition: str = ""  # the rule's condition, or the model's detector and description
    source: str = ""  # file:line of a rule, the models file of a model


@dataclass
class CheckCatalog:
    checks: dict[str, CheckInfo] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # why some checks could not be loaded

    def signals_for(self, ev: AlertEvent) -> tuple[list[Signal], CheckInfo | None]:
        """The signals to plot for an alert (at most ``MAX_SIGNALS``) and its check, when known."""
        info = self.checks.get(ev.rule)
        if info is not None and info.signals:
            sigs = list(info.signals)
        elif ev.rule.startswith("builtin_"):
            sigs = [PRESENCE_SIGNAL]
        else:
            sigs = evidence_signals(ev.evidence) or [PRESENCE_SIGNAL]
        return sigs[:MAX_SIGNALS], info


def _field_alias(name: str) -> str | None:
    f = FIELDS.resolve(name)
    return f.alias if f is not None else None


def evidence_signals(evidence: dict[str, Any]) -> list[Signal]:
    """Signals named by an evidence dict's keys (and nested keys), in the order they appear."""
    out: list[Signal] = []

    def add(sig: Signal) -> None:
        if sig not in out:
            out.append(sig)

    def walk(d: dict[str, Any]) -> None:
        for key, val in d.items():
            names = [key] if _field_alias(key) or key in NCCL_FIELDS else _IDENT.findall(key)
            for n in names:
                alias = _field_alias(n)
                if alias:
                    add(Signal(alias))
                elif n in NCCL_FIELDS:
                    add(Signal(n, NCCL))
            if isinstance(val, dict):
                walk(val)

    walk(evidence)
    return out


def _order_by_mention(aliases: Iterable[str], text: str) -> list[str]:
    """Aliases in the order the rule text first mentions them (any spelling); unmentioned last."""

    def first(alias: str) -> int:
        f = FIELDS.by_alias(alias)
        names = [alias, *(f.names if f else ())]
        hits = [m.start() for n in names for m in re.finditer(rf"\b{re.escape(n)}\b", text)]
        return min(hits) if hits else len(text) + 1

    return sorted(aliases, key=lambda a: (first(a), a))


def _base_feature(feature: str) -> str:
    """``inc:ecc_sbe_volatile`` / ``hostmean:gpu_temp`` -> the field they are computed from."""
    return feature.split(":", 1)[1] if ":" in feature else feature


def load_checks(rules: list[str | Path], models: str | None = "auto") -> CheckCatalog:
    """The rules and models under ``rules`` (as ``replay --rules`` / ``--models`` take them)."""
    from pipeline.detection import models_path
    from pipeline.models import load_models
    from pipeline.models.registry import NCCL as NCCL_SOURCE
    from pipeline.rules import load_rules

    cat = CheckCatalog()
    modelset = None
    try:
        mpath = models_path([str(r) for r in rules], models)
        modelset = load_models(mpath) if mpath is not None else None
    except (GpuwardenError, OSError) as e:
        cat.problems.append(f"models not loaded ({e}); model alerts fall back to their evidence")
    if modelset is not None:
        for name, m in modelset.models.items():
            src = NCCL if m.info.source == NCCL_SOURCE else DCGM
            sigs: list[Signal] = []
            for feat in m.proto.features:
                base = _base_feature(feat)
                sig = Signal(base, NCCL) if src == NCCL else Signal(_field_alias(base) or base)
                if sig not in sigs:
                    sigs.append(sig)
            desc = " ".join(m.spec.description.split())
            cat.checks[name] = CheckInfo(
                name, "model", tuple(sigs), f"{m.spec.detector}: {desc}".rstrip(": "), modelset.source
            )
    ruleset, diags = load_rules([str(r) for r in rules], models=set(modelset.names) if modelset else None)
    if ruleset is None:
        errors = [str(d) for d in diags if d.is_error]
        cat.problems.append(
            f"rules in {', '.join(map(str, rules))} do not load ({len(errors)} error(s), first: "
            f"{errors[0] if errors else '?'}); rule alerts fall back to their evidence"
        )
        return cat
    for r in ruleset.rules:
        cols = set(r.condition.columns) | set(r.extra_columns)
        for v in r.values.values():
            cols |= v.columns
        text = " ".join([r.spec.condition, *r.spec.values.values(), r.spec.summary])
        aliases = _order_by_mention({FIELDS.fields[c].alias for c in cols}, text)
        cat.checks[r.meta.name] = CheckInfo(
            r.meta.name, "rule", tuple(Signal(a) for a in aliases), " ".join(r.spec.condition.split()), r.spec.source
        )
    return cat
