"""What a model reads of a tick's view: its features (catalog fields, counter increases, host
means), computed once per tick whichever models ask (``ModelSet.evaluate``)."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.state import COUNTER_COLS, View


@functools.lru_cache(maxsize=None)
def _column(name: str) -> int:
    """The catalog column of a feature's field (looked up once per name, not once a tick)."""
    return FIELDS.require(name).column


@functools.lru_cache(maxsize=None)
def _counter_index(name: str) -> int:
    """The column of ``View.increase`` that holds counter ``name``'s increase."""
    return int(np.searchsorted(COUNTER_COLS, _column(name)))


class Features:
    """Per-tick feature arrays, computed once per tick whichever models ask; ``phase``: each
    row's GPU's turn (a hash of its host and index, the same in every shard)."""

    def __init__(self, view: View, phase: np.ndarray | None = None) -> None:
        self.view = view
        self.memo: dict[str, np.ndarray] = {}
        if phase is not None:
            self.memo["phase"] = phase
        self._inv: tuple[np.ndarray, np.ndarray] | None = None

    def _host_inv(self) -> tuple[np.ndarray, np.ndarray]:
        if self._inv is None:
            uniq, inv = np.unique(self.view.frame.host, return_inverse=True)
            self._inv = (uniq, inv)
        return self._inv

    def get(self, name: str) -> np.ndarray:
        hit = self.memo.get(name)
        if hit is not None:
            return hit
        if name.startswith("inc:"):
            v = self.view.increase[:, _counter_index(name[4:])]
        elif name.startswith("hostmean:"):
            x = self.get(name[9:])
            uniq, inv = self._host_inv()
            ok = ~np.isnan(x)
            s = np.bincount(inv, weights=np.where(ok, x, 0.0), minlength=len(uniq))
            c = np.bincount(inv, weights=ok.astype(float), minlength=len(uniq))
            with np.errstate(invalid="ignore", divide="ignore"):
                v = np.where(c > 0, s / c, np.nan)[inv]
        else:
            v = self.view.filled[:, _column(name)]
        self.memo[name] = v
        return v

    def subset(self, names: Sequence[str], rows: np.ndarray | None) -> dict[str, np.ndarray]:
        if rows is None:
            return {n: self.get(n) for n in names}
        return {n: self.get(n)[rows] for n in names}


def feature_columns(names: Sequence[str]) -> set[int]:
    """The catalog columns of the fields that features ``names`` read.

    >>> feature_columns(["inc:ecc_sbe_volatile", "hostmean:gpu_temp"]) == feature_columns(["ecc_sbe_volatile", "gpu_temp"])
    True
    """
    cols = set()
    for n in names:
        base = n.split(":", 1)[1] if ":" in n else n
        cols.add(FIELDS.require(base).column)
    return cols
