"""Compiled rules, and the set the engine evaluates each tick (a stage, ``pipeline.engine.stage``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.arrays import from_dict, to_dict
from pipeline.engine.checks import CheckMeta
from pipeline.engine.entities import Entities
from pipeline.engine.stage import MODEL_SCORES, StageBase
from pipeline.engine.state import View
from pipeline.rules.context import Chunk, Compiled
from pipeline.rules.windows import WindowStore
from pipeline.rules.template import render
from pipeline.rules.xids import evidence_text

_XID_COLUMN = FIELDS.require("xid").column


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
    source: str = ""  # file:line

    def definition(self) -> tuple:
        """Everything that changes what the rule does (hot reload keeps state when it is equal)."""
        return (
            self.fault,
            self.severity,
            self.level,
            self.condition,
            self.for_s,
            self.keep_firing_for_s,
            tuple(sorted(self.values.items())),
        )


class Rule:
    """A compiled rule: a row check whose condition is a rule expression."""

    def __init__(
        self, spec: RuleSpec, condition: Compiled, values: dict[str, Compiled], template: list, store: WindowStore
    ) -> None:
        self.spec = spec
        self.meta = CheckMeta(
            spec.name, spec.fault, spec.severity, spec.level, spec.for_s, spec.keep_firing_for_s, dict(spec.labels)
        )
        self.condition = condition
        self.values = values
        self.template = template
        self.store = store
        self.extra_columns: set[int] = set()  # fields only the summary shows
        self._chunk: Chunk | None = None

    def evaluate(self, chunk: Chunk) -> np.ndarray:
        self._chunk = chunk
        return self.condition.fn(chunk)  # Compiled.__call__ without its frame, 23 rules a tick

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        chunk = (
            self._chunk if self._chunk is not None and self._chunk.view is view else Chunk(view, self.store, view.ts0)
        )
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


class RuleSet(StageBase):
    """The rules the engine runs, with the windows they share: the engine's "rules" stage,
    after the models (``score()`` reads what they publish)."""

    kind = "rules"
    state_key = "windows"
    # A rule reads its GPU's windows and baselines and, through peer_*(), its own host's GPUs
    # (by=host is the only grouping): never another host's rows (docs/rules.md).
    host_local = True

    def __init__(self, rules: list[Rule], windows: WindowStore, sources: list[str] | None = None) -> None:
        self.rules = rules
        self.windows = windows
        self.sources = sources or []
        self._by_name = {r.meta.name: r for r in rules}
        self._pending_baseline: tuple[View, int] | None = None  # this tick's, until finish()
        self.columns: set[int] = set()
        for r in rules:
            self.columns |= r.condition.columns
            for v in r.values.values():
                self.columns |= v.columns
            self.columns |= r.extra_columns
        # Rules over fields the fleet has never reported (a PCIe AER or kernel-log counter with
        # no producer for it): ``_unread`` below. Per rule the columns its condition reads, or
        # None where it reads a model's score too (the models publish one for every row).
        self._reads = [None if r.condition.models else frozenset(r.condition.columns) for r in rules]
        # The models' scores the rules read (``Stage.reads_scores``), in conditions or evidence.
        self.reads_scores = frozenset().union(
            *(r.condition.models for r in rules), *(v.models for r in rules for v in r.values.values())
        )
        self._read_cols = np.array(sorted(set().union(*(c for c in self._reads if c))), dtype=np.intp)
        self._unread_value: dict[str, float | None] = {}

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def checks(self) -> list[Rule]:
        """The rules, each a check with its own alert lifecycle."""
        return self.rules

    def unchanged(self, rule: Rule) -> bool:
        old = self._by_name.get(rule.meta.name)
        return old is not None and old.spec.definition() == rule.spec.definition()

    def evaluate(self, view: View, n_gpus: int) -> list[tuple[Rule, np.ndarray]]:
        """Fold the tick into the windows, evaluate every rule, then let baselines learn."""
        if not self.rules or len(view.frame) == 0:
            return []
        self.windows.update(view, view.ts0, n_gpus)
        chunk = Chunk(view, self.windows, view.ts0)
        reported = self._reported(view)
        out = []
        for r, cols in zip(self.rules, self._reads):
            if not cols or not cols.isdisjoint(reported):
                out.append((r, r.evaluate(chunk)))
            else:
                out.append((r, self._unread(r, chunk)))
        # Evidence for alerts that fire on this tick is read before the baselines move on.
        self._pending_baseline = (view, n_gpus)
        return out

    def _reported(self, view: View) -> set[int]:
        """The columns rule conditions read that some row of ``view`` has a value of, now or
        before (``filled``: a GPU's last known value)."""
        cols = self._read_cols
        if not len(cols):
            return set()
        have = (~np.isnan(view.filled[:, cols])).any(axis=0)
        return set(cols[have].tolist())

    def _unread(self, rule: Rule, chunk: Chunk) -> np.ndarray:
        """``rule``'s condition on rows whose GPUs never reported anything it reads: one value
        for every such row and tick, found by evaluating it the first time and not again. Every
        input is then unknown -- the fields, and the GPU's own windows and baselines of them,
        which only its values fill (ids are never reused) -- and every function of unknowns
        answers the same on any row: NaN, or 0 as ``changed()`` does. A rule that answers
        otherwise (not one value) is evaluated each tick."""
        name = rule.meta.name
        if name not in self._unread_value:
            got = rule.evaluate(chunk)
            first = got[:1]
            uniform = len(got) and np.array_equal(got, np.broadcast_to(first, got.shape), equal_nan=True)
            self._unread_value[name] = float(first[0]) if uniform else None
            return got
        value = self._unread_value[name]
        if value is None:
            return rule.evaluate(chunk)
        rule._chunk = chunk  # as evaluate() leaves it, for the evidence of an alert
        return np.full(len(chunk.ent), value)

    def run(self, view: View, entities: Entities, outputs: dict[str, Any]) -> list[tuple[Rule, np.ndarray]]:
        """The stage's tick: ``evaluate`` with the scores the models published for these rows."""
        # score() reads them from the view (compile.py), and so does an alert's evidence later.
        view.model_scores = outputs.get(MODEL_SCORES, {})
        return self.evaluate(view, entities.n_gpus)

    def finish(self) -> None:
        """After the engine has built this tick's alerts: baselines learn from it."""
        pending = self._pending_baseline
        if pending is not None:
            self.windows.update_baselines(*pending)
            self._pending_baseline = None

    def adopt(self, old: Any) -> set[str]:
        """Hot reload: take over ``old``'s windows; the names of the rules whose definition is
        unchanged (they keep their pending and firing alerts)."""
        if not isinstance(old, RuleSet):
            return set()
        kept = {r.meta.name for r in self.rules if old.unchanged(r)}
        self.windows.adopt(old.windows)
        return kept

    def to_state(self) -> dict[str, Any]:
        """The windows and baselines as plain data (the engine snapshot's ``windows``)."""
        if not self.rules:  # {}, as snapshots of an engine with an empty rule set have always had
            return {}
        return windows_to_state(self.windows.to_state())

    def load_state(self, state: Any) -> None:
        """Windows and baselines of a snapshot (``to_state``); a bad array is a ``StateError``."""
        if state is None:  # every snapshot has them ({} without rules): this one is damaged
            raise KeyError("windows")
        self.windows.load_state(windows_from_state(state))


def windows_to_state(st: dict[str, Any]) -> dict[str, Any]:
    """``WindowStore.to_state()`` with its arrays as the snapshot's maps (``arrays.to_dict``)."""
    return {
        "panes": [[k, {n: to_dict(a) for n, a in ws.items()}, aggs] for k, ws, aggs in st["panes"]],
        "baselines": [[k, {n: to_dict(a) for n, a in bs.items()}] for k, bs in st["baselines"]],
    }


def windows_from_state(st: dict[str, Any]) -> dict[str, Any]:
    """What ``WindowStore.load_state`` takes, from ``windows_to_state``'s form."""

    def conv(d: dict[str, Any]) -> dict[str, np.ndarray]:
        return {k: from_dict(v) for k, v in d.items()}

    return {
        "panes": [[k, conv(ws), aggs] for k, ws, aggs in st.get("panes", [])],
        "baselines": [[k, conv(bs)] for k, bs in st.get("baselines", [])],
    }
