"""Numbers every layer shares: growing per-entity arrays, id bounds, per-group statistics, and
numbers read from text others wrote (ASCII digits only, bounded length).

Foundation: imports nothing of the project, so the engine, the rules and the models use one
definition each without borrowing from one another.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import numpy as np


def id_bound(ids: np.ndarray | slice) -> int:
    """One past the largest id of ``ids`` (ids as an array, or ``slice(0, n)``; see ``View.ids``)."""
    if isinstance(ids, slice):
        return ids.stop
    return int(ids.max()) + 1 if len(ids) else 0


def grow(arr: np.ndarray, n: int, fill: object, order: Literal["C", "F"] = "C") -> np.ndarray:
    """``arr`` with at least ``n`` rows (amortised doubling), new rows set to ``fill``; a grown
    copy is laid out in ``order`` ("F": column-major)."""
    if len(arr) >= n:
        return arr
    size = max(n, 2 * len(arr), 16)
    out = np.full((size,) + arr.shape[1:], fill, dtype=arr.dtype, order=order)
    out[: len(arr)] = arr
    return out


def distinct(ent: np.ndarray) -> tuple[np.ndarray, bool]:
    """The entities of a chunk, sorted and unique, and whether each appears in one row only.

    Chunks arrive sorted by entity, so this is a linear scan instead of ``np.unique``'s sort.
    """
    if len(ent) < 2:
        return ent, True
    step = ent[1:] != ent[:-1]
    if not (ent[1:] >= ent[:-1]).all():
        u = np.unique(ent)
        return u, len(u) == len(ent)
    if step.all():
        return ent, True
    first = np.ones(len(ent), dtype=bool)
    first[1:] = step
    return ent[first], False


@overload
def groups(keys: np.ndarray, first: Literal[False] = False) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def groups(keys: np.ndarray, first: Literal[True]) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def groups(keys: np.ndarray, first: bool = False) -> tuple[np.ndarray, ...]:
    """``np.unique(keys, return_inverse=True)`` of 1-D integer ``keys`` (with ``first``,
    ``return_index=True`` too: each key's first row): the same arrays, without its wrappers (a
    tick's few dozen rows pay those more than the sort), and without the sort when the keys
    come in order.

    >>> u, inv = groups(np.array([7, 3, 7, 5]))
    >>> u.tolist(), inv.tolist()
    ([3, 5, 7], [2, 0, 2, 1])
    >>> [a.tolist() for a in groups(np.array([7, 3, 7, 5]), first=True)]
    [[3, 5, 7], [1, 3, 0], [2, 0, 2, 1]]
    """
    n = len(keys)
    if n < 2 or keys.ndim != 1 or keys.dtype.kind not in "iu":
        if first:
            return np.unique(keys, return_index=True, return_inverse=True)
        return np.unique(keys, return_inverse=True)
    if (keys[1:] >= keys[:-1]).all():
        perm, aux = None, keys
    else:
        perm = keys.argsort(kind="stable")  # stable: a key's first row leads its run
        aux = keys[perm]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(aux[1:], aux[:-1], out=new[1:])
    at = np.add.accumulate(new.astype(np.intp))  # (a cumsum that casts as it goes is slower)
    at -= 1
    if perm is None:
        inv = at
    else:
        inv = np.empty(n, dtype=np.intp)
        inv[perm] = at
    if not first:
        return aux[new], inv
    return aux[new], new.nonzero()[0] if perm is None else perm[new], inv


def combine(*cols: np.ndarray) -> np.ndarray:
    """One int64 key per row, shared by two rows exactly when they agree in every column of
    ``cols`` (1-D integer arrays of one length): each column's group codes in mixed radix, so no
    arithmetic of the values can make two different rows meet (8 ranks x 1,048,576 bytes and 9 x
    48,573 do under ``nranks * 1,000,003 + bytes``).

    >>> k = combine(np.array([8, 9, 8]), np.array([1_048_576, 48_573, 1_048_576]))
    >>> bool(k[0] == k[2]), bool(k[0] == k[1])
    (True, False)
    """
    n = len(cols[0]) if cols else 0
    out = np.zeros(n, dtype=np.int64)
    card = 1
    for c in cols:
        u, inv = groups(np.asarray(c, dtype=np.int64))
        k = max(len(u), 1)
        if card * k > 1 << 62:  # renumber densely first: at most n codes
            u0, out = groups(out)
            out, card = out.astype(np.int64), len(u0)
        out = out * k + inv
        card *= k
    return out


def group_stat(
    keys: np.ndarray, values: np.ndarray, stat: str, groups: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Per row, ``stat`` (median/mean/min/max/count) of ``values`` over rows with the same key; NaN ignored.

    ``groups``: ``np.unique(keys, return_inverse=True)`` when the caller already has it (every
    peer function of a tick groups the same rows by host).
    """
    return group_stats(keys, values, (stat,), groups)[0]


def group_stats(
    keys: np.ndarray, values: np.ndarray, stats: tuple[str, ...], groups: tuple[np.ndarray, np.ndarray] | None = None
) -> list[np.ndarray]:
    """``[group_stat(keys, values, s, groups) for s in stats]``, with what they share (the
    grouping, the known values and their count per group) worked out once."""
    n = len(keys)
    if n == 0:
        return [np.empty(0) for _ in stats]
    uniq, inv = groups if groups is not None else np.unique(keys, return_inverse=True)
    ok = ~np.isnan(values)
    cnt = np.bincount(inv, weights=ok.astype(float), minlength=len(uniq))
    return [_group_stat(n, len(uniq), inv, values, ok, cnt, stat) for stat in stats]


def _group_stat(
    n: int, m: int, inv: np.ndarray, values: np.ndarray, ok: np.ndarray, cnt: np.ndarray, stat: str
) -> np.ndarray:
    """One of ``group_stats``: ``m`` groups, ``cnt`` known values in each."""
    if stat == "count":
        return cnt[inv]
    if stat == "mean":
        s = np.bincount(inv, weights=np.where(ok, values, 0.0), minlength=m)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, s / cnt, np.nan)[inv]
    if stat in ("min", "max"):
        fill = np.inf if stat == "min" else -np.inf
        out = np.full(m, fill)
        (np.minimum if stat == "min" else np.maximum).at(out, inv[ok], values[ok])
        return np.where(np.isinf(out), np.nan, out)[inv]
    if stat == "median":
        g = n // m
        if g * m == n and ok.all() and (cnt == g).all() and (inv[1:] >= inv[:-1]).all():
            # Every host reporting the same number of GPUs, in consecutive rows, all known (the
            # usual tick): a partition per host row instead of a sort of the whole tick. The
            # counts, not the row count, say the groups are equal (1 + 3 rows is 2 x 2).
            # np.median's arithmetic (the mean of the two middle values) on a sort of 8-wide rows:
            # the same numbers at half the cost of its partition and wrappers.
            s = np.sort(values.reshape(m, g), axis=1)
            med = s[:, g // 2] if g % 2 else (s[:, g // 2 - 1] + s[:, g // 2]) / 2.0
            return np.repeat(med, g)
        order = np.lexsort((np.where(ok, values, np.inf), inv))
        sorted_inv = inv[order]
        starts = np.searchsorted(sorted_inv, np.arange(m))
        c = cnt.astype(np.int64)
        lo = starts + np.maximum(c - 1, 0) // 2
        hi = starts + c // 2
        sv = np.where(ok, values, np.inf)[order]
        med = np.where(c > 0, (sv[np.minimum(lo, n - 1)] + sv[np.minimum(hi, n - 1)]) / 2.0, np.nan)
        return med[inv]
    raise ValueError(stat)


# Numbers read from text others wrote (tool output, logs, JSON): ASCII only and of bounded
# length, because ``str.isdigit``/``int``/``float`` accept Unicode digits ("²", "٣") and
# ``int`` raises past 4,300 digits; a number that fails is the caller's counted drop.
_ASCII_DIGITS = frozenset("0123456789")


def ascii_int(text: object, max_digits: int = 19) -> int | None:
    """``text`` as a non-negative int when it is 1..``max_digits`` ASCII digits, else ``None``
    (``max_digits`` itself at most 4,000: ``int`` refuses longer)."""
    if not isinstance(text, str) or not 0 < len(text) <= min(max_digits, 4000) or not _ASCII_DIGITS.issuperset(text):
        return None
    return int(text)


def ascii_float(text: object, max_len: int = 64) -> float | None:
    """A finite float from ASCII ``text`` of at most ``max_len`` characters (``1.5``, ``0e+00``,
    ``-3``), else ``None`` (``nan``, ``inf``, ``N/A``, Unicode digits, too long)."""
    if not isinstance(text, str) or len(text) > max_len or not text.isascii():
        return None
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def finite(value: object, limit: float = 2.0**63) -> float | None:
    """A JSON-decoded number (int or float, not bool) as a finite float with ``|x| < limit``,
    ASCII text read by ``ascii_float``, else ``None``."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        x = ascii_float(value)
    elif isinstance(value, (int, float)):
        try:
            x = float(value)
        except OverflowError:  # an int past float's range
            return None
    else:
        return None
    return x if x is not None and math.isfinite(x) and abs(x) < limit else None
