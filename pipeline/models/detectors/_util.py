"""Small vectorised helpers the detectors share."""

from __future__ import annotations

import numpy as np


def last_per_entity(ent: np.ndarray) -> np.ndarray:
    """Indices of the last row of each entity (rows of an entity in time order)."""
    if len(ent) == 0:
        return np.empty(0, dtype=np.intp)
    if len(ent) == 1 or bool((ent[1:] > ent[:-1]).all()):
        return np.arange(len(ent), dtype=np.intp)  # the usual tick: one row per GPU, sorted
    rev = ent[::-1]
    _, first = np.unique(rev, return_index=True)
    return (len(ent) - 1 - first).astype(np.intp)


def decay(dt: np.ndarray, tau: float) -> np.ndarray:
    """exp(-dt/tau) with unknown (NaN) or negative gaps treated as a fresh start (weight 0)."""
    with np.errstate(invalid="ignore"):
        w = np.exp(-np.maximum(dt, 0.0) / tau)
    return np.where(np.isnan(w), 0.0, w)


def nan_to_num(x: np.ndarray, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> np.ndarray:
    """``np.nan_to_num(x, nan=..., posinf=..., neginf=...)``, without its ~15 us of work on a
    small array that holds nothing to replace (every tick's usual case): then the answer is a
    copy of ``x``."""
    if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.ndim and np.isfinite(x).all():
        return x.copy()
    return np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


def repeats(ent: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """For rows where an entity comes more than once (a GPU record and its per-link records, two
    samples in one tick): per row the index of the entity's row before it (-1: its first), and
    the rows by their place among their entity's rows, first rows first. A layer holds an entity
    at most once, so it updates per-entity state in one vectorised step after the layer before.
    None when every entity has one row (the usual tick).

    >>> prev, by_place = repeats(np.array([3, 1, 3, 3]))
    >>> prev.tolist(), [x.tolist() for x in by_place]
    ([-1, -1, 0, 2], [[0, 1], [2], [3]])
    """
    n = len(ent)
    if n < 2 or bool((ent[1:] > ent[:-1]).all()):
        return None
    order = np.argsort(ent, kind="stable")  # stable: an entity's rows stay in time order
    e = ent[order]
    first = np.ones(n, dtype=bool)
    first[1:] = e[1:] != e[:-1]
    if first.all():
        return None
    pos = np.arange(n)
    place = np.empty(n, dtype=np.intp)
    place[order] = pos - np.maximum.accumulate(np.where(first, pos, 0))
    prev = np.full(n, -1, dtype=np.intp)
    prev[order[~first]] = order[pos[~first] - 1]
    return prev, [np.flatnonzero(place == k) for k in range(int(place.max()) + 1)]
