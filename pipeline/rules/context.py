"""What a rule expression is evaluated on, and what compiling one gives.

Every node evaluates to a float64 array with one value per sample of the chunk. Booleans are
0/1 with NaN for "unknown" (a field never reported, a window still empty), combined with
Kleene logic, so ``not (gpu_temp > 85)`` is unknown -- not true -- for a GPU that never
reported a temperature. A rule fires only where its condition is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np

from pipeline.engine.state import View

if TYPE_CHECKING:
    from pipeline.rules.windows import WindowStore

NUM, BOOL = "number", "boolean"
_T = TypeVar("_T")

Fn = Callable[["Chunk"], np.ndarray]  # a node's evaluator: one value per sample of the chunk


class CompileError(Exception):
    def __init__(self, message: str, pos: int, code: str) -> None:
        super().__init__(message)
        self.message, self.pos, self.code = message, pos, code


@dataclass
class Chunk:
    """What an expression sees: one tick of samples plus the rule set's windows.

    ``memo`` holds this tick's value of every window and peer function by its text, so a
    sub-expression that several rules (or one rule twice) use is computed once per tick.
    """

    view: View
    windows: "WindowStore"
    ts0: float  # start of the chunk's pane (all rows share it)
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def ent(self) -> np.ndarray:
        return self.view.frame.gpu

    @property
    def ids(self) -> np.ndarray | slice:
        """``ent`` as an index into per-GPU state (``View.ids``)."""
        return self.view.ids

    def cached(self, key: str, compute: Callable[["Chunk"], _T]) -> _T:
        """``compute(self)``, once per tick and ``key``."""
        hit: _T | None = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = compute(self)
        return hit


@dataclass
class Compiled:
    type: str
    fn: Callable[[Chunk], np.ndarray]
    text: str
    evidence: dict[str, Callable[[Chunk], np.ndarray]] = field(default_factory=dict)
    columns: set[int] = field(default_factory=set)  # catalog columns the expression reads
    models: set[str] = field(default_factory=set)  # models whose scores it reads (score())

    def __call__(self, chunk: Chunk) -> np.ndarray:
        return self.fn(chunk)


def filled(col: int) -> Fn:
    """The column's last known value per sample: a field's evidence."""
    return lambda c: c.view.filled[:, col]


def shared(key: str, fn: Callable[["Chunk"], np.ndarray]) -> Callable[["Chunk"], np.ndarray]:
    """``fn`` computed once per tick however many rules hold the same sub-expression.

    ``key`` stands for the node's structure (``WindowStore.key_of``): ``gpu_util >= 50`` in five
    rules is one comparison a tick. Every node is a pure function of the tick, so sharing cannot
    change a value.
    """
    return lambda c: c.cached(key, fn)
