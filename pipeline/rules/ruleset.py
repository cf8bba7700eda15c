"""Compiled rules and the set the engine evaluates each tick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.checks import CheckMeta
from pipeline.engine.state import View
from pipeline.rules.compile import Chunk, Compiled, WindowStore
from pipeline.rules.template import render
from pipeline.rules.xids import evidence_text

_XID_COLUMN = FIELDS.by_alias("xid").column


@dataclass
class RuleSpec:
    """A rule as written (after validation); ``source`` says where it came from."""

    name: str
    fault: str
    severity: str
    level: str
    condition: str
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    summary: str = ""
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)
    source: str = ""          # file:line

    def definition(self) -> tuple:
        """Everything that changes what the rule does (hot reload keeps state when it is equal)."""
        return (self.fault, self.severity, self.level, self.condition, self.for_s, self.keep_firing_for_s,
                tuple(sorted(self.values.items())))


class Rule:
    """A compiled rule: a row check whose condition is a rule expression."""

    def __init__(self, spec: RuleSpec, condition: Compiled, values: dict[str, Compiled],
                 template: list, store: WindowStore) -> None:
        self.spec = spec
        self.meta = CheckMeta(spec.name, spec.fault, spec.severity, spec.level, spec.for_s,
                              spec.keep_firing_for_s, dict(spec.labels))
        self.condition = condition
        self.values = values
        self.template = template
        self.store = store
        self.extra_columns: set[int] = set()   # fields only the summary shows
        self._chunk: Chunk | None = None

    def evaluate(self, chunk: Chunk) -> np.ndarray:
        self._chunk = chunk
        return self.condition(chunk)

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        chunk = self._chunk if self._chunk is not None and self._chunk.view is view else \
            Chunk(view, self.store, view.ts0)
        ev: dict[str, Any] = {}
        for name, fn in {**self.condition.evidence, **{k: v.fn for k, v in self.values.items()}}.items():
            x = float(fn(chunk)[row])
            ev[name] = None if x != x else round(x, 4)
        if _XID_COLUMN in self.condition.columns:
            # What the XID means and what to do, from NVIDIA's catalogue (docs/rules.md#xids).
            ev.update(evidence_text(float(view.filled[row, _XID_COLUMN])))
        return ev

    def summary(self, host: str, gpu: int | None, evidence: dict[str, Any]) -> str:
        return render(self.template, {"host": host, "gpu": gpu, **evidence})


class RuleSet:
    """The rules the engine runs, with the windows they share."""

    def __init__(self, rules: list[Rule], windows: WindowStore, sources: list[str] | None = None) -> None:
        self.rules = rules
        self.windows = windows
        self.sources = sources or []
        self._by_name = {r.meta.name: r for r in rules}
        self.columns: set[int] = set()
        for r in rules:
            self.columns |= r.condition.columns
            for v in r.values.values():
                self.columns |= v.columns
            self.columns |= r.extra_columns

    def __len__(self) -> int:
        return len(self.rules)

    def unchanged(self, rule: Rule) -> bool:
        old = self._by_name.get(rule.meta.name)
        return old is not None and old.spec.definition() == rule.spec.definition()

    def evaluate(self, view: View, n_gpus: int) -> list[tuple[Rule, np.ndarray]]:
        """Fold the tick into the windows, evaluate every rule, then let baselines learn."""
        if not self.rules or len(view.frame) == 0:
            return []
        self.windows.update(view, view.ts0, n_gpus)
        chunk = Chunk(view, self.windows, view.ts0)
        out = [(r, r.evaluate(chunk)) for r in self.rules]
        # Evidence for alerts that fire on this tick is read before the baselines move on.
        self._pending_baseline = (view, n_gpus)
        return out

    def finish(self) -> None:
        """After the engine has built this tick's alerts: baselines learn from it."""
        pending = getattr(self, "_pending_baseline", None)
        if pending is not None:
            self.windows.update_baselines(*pending)
            self._pending_baseline = None
