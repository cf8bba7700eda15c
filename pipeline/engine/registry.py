"""The stage registry: which stages an engine runs, in what order, and their checks' names.

Stages run in order each tick, each seeing what the earlier ones published: the models first
(the rules' ``score()`` reads them), then the built-in row checks, any stage added later, and
the rules. One stage of each kind; check names are unique across stages and tick checks.
"""

from __future__ import annotations

from typing import Sequence

from pipeline.engine.checks import TickCheck
from pipeline.engine.stage import Stage


def arrange(models: Stage | None, checks: Stage, rules: Stage | None, more: Sequence[Stage]) -> list[Stage]:
    """The stages in the order they run, or ValueError on two of one kind."""
    stages = [s for s in (models, checks, rules) if s is not None] + list(more)
    kinds = [s.kind for s in stages]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"two stages of one kind: {sorted(k for k in kinds if kinds.count(k) > 1)}")
    return stages


def find(stages: Sequence[Stage], kind: str) -> Stage | None:
    """The stage of ``kind``, or None."""
    return next((s for s in stages if s.kind == kind), None)


def place(stages: Sequence[Stage], stage: Stage) -> list[Stage]:
    """``stages`` with ``stage`` in place of the one of its kind, or, without one, right after
    the built-in row checks."""
    old = find(stages, stage.kind)
    if old is not None:
        return [stage if s is old else s for s in stages]
    at = next(i for i, s in enumerate(stages) if s.kind == "checks") + 1
    return [*stages[:at], stage, *stages[at:]]


def check_names(stages: Sequence[Stage], tick_checks: Sequence[TickCheck]) -> list[str]:
    """Every check's name, or ValueError on a duplicate. In the order snapshots have always
    listed the lifecycles: row checks, tick checks, rules, models, then any other stage's."""
    rows = [s for s in stages if s.kind == "checks"]
    rest = sorted((s for s in stages if s.kind != "checks"), key=lambda s: s.kind != "rules")
    names = (
        [c.meta.name for s in rows for c in s.checks]
        + [c.meta.name for c in tick_checks]
        + [c.meta.name for s in rest for c in s.checks]
    )
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate check names: {sorted(n for n in names if names.count(n) > 1)}")
    return names


def columns(stages: Sequence[Stage]) -> list[int]:
    """The catalogue columns any of ``stages`` reads, sorted."""
    cols: set[int] = set()
    for s in stages:
        cols.update(s.columns)
    return sorted(cols)
