"""Half-Space Trees (Tan, Ting & Liu, IJCAI 2011) with its whole state in numpy arrays.

The same model, seeded the same way, as river's ``anomaly.HalfSpaceTrees`` (river 0.26's
``river/anomaly/hst.py`` and ``river/tree/padded.py``): the same trees are drawn from
``random.Random(seed)`` in the same order, the same masses are counted and the score is the same
number -- the conformance suite (tests/unit/models/test_conformance.py) checks both side by side.
What differs is the representation: each tree is a complete binary tree of ``height`` in heap
order (node ``i`` has children ``2i+1`` and ``2i+2``), so the forest is four arrays

* ``feature[t, i]``, ``threshold[t, i]`` -- the split of internal node ``i`` of tree ``t``;
* ``l_mass[t, j]``, ``r_mass[t, j]`` -- the masses of every node (the current window's, the
  last complete window's),

plus the window ``counter`` and ``first_window``. That is what the engine snapshot holds (plain
numbers: docs/models.md#model-state), and a batch of samples is scored or learnt in one pass
over the levels instead of one Python tree walk per sample and tree.

Inputs are dense rows (one column per feature, the features in sorted-name order, as river
draws them): the detector fills missing features before they get here, so river's branch for
an absent feature (follow the heavier child) is not needed.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np

from pipeline.errors import StateError

PADDING = 0.15  # river's make_padded_tree: no split within 15% of a node's range edges
# Up to this many rows a call walks the trees in Python (as river does, over flat lists); more
# rows are walked level by level in numpy, whose fixed cost per call then pays off.
SMALL = 8
# Nodes of a whole forest (trees x nodes a tree): river's default, 10 trees of height 8, has 5,110.
MAX_NODES = 1 << 20


def _draw_tree(rng: random.Random, n_features: int, height: int, feature: np.ndarray, threshold: np.ndarray) -> None:
    """River's ``make_padded_tree`` (pre-order: the node, then its left, then its right subtree),
    writing the splits into heap-ordered arrays. The rng calls are river's, in river's order."""
    limits = {i: (0.0, 1.0) for i in range(n_features)}
    population = list(limits)

    def node(i: int, depth_left: int) -> None:
        if depth_left == 0:
            return
        on = rng.choices(population=population, weights=[limits[k][1] - limits[k][0] for k in population])[0]
        a, b = limits[on]
        at = rng.uniform(a + PADDING * (b - a), b - PADDING * (b - a))
        feature[i], threshold[i] = on, at
        limits[on] = (a, at)
        node(2 * i + 1, depth_left - 1)
        limits[on] = (at, b)
        node(2 * i + 2, depth_left - 1)
        limits[on] = (a, b)

    node(0, height)


def _draw_forest(seed: int | None, n_features: int, n_trees: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """The splits of ``n_trees`` trees drawn from ``random.Random(seed)``, one after the other:
    (feature, threshold), a row per tree."""
    rng = random.Random(seed)
    n_internal = 2**height - 1
    feature = np.zeros((n_trees, n_internal), dtype=np.int8)
    threshold = np.zeros((n_trees, n_internal), dtype=np.float64)
    for t in range(n_trees):
        _draw_tree(rng, n_features, height, feature[t], threshold[t])
    return feature, threshold


# Every partition's engine draws the same seeded forests (~18 ms each, in Python): once a process,
# for forests of up to CACHED_SPLITS splits (the default models' have 2,550).
CACHED_SPLITS = 1 << 16
_seeded_forest = functools.lru_cache(maxsize=64)(_draw_forest)


class HalfSpaceForest:
    """``n_trees`` half-space trees of ``height`` over ``n_features`` features in [0, 1]."""

    def __init__(
        self, n_features: int, n_trees: int = 10, height: int = 8, window_size: int = 250, seed: int | None = None
    ) -> None:
        self.n_features, self.n_trees, self.height = int(n_features), int(n_trees), int(height)
        self.window_size = int(window_size)
        if not (0 < self.n_features <= 127 and self.n_trees > 0 and 0 < self.height <= 20 and self.window_size > 0):
            raise ValueError("HalfSpaceForest: n_features in 1..127, n_trees > 0, height in 1..20, window_size > 0")
        # Each node is drawn in Python and held per window: bounded, so a config cannot stall start-up.
        if self.n_trees * (2 ** (self.height + 1) - 1) > MAX_NODES:
            raise ValueError(f"HalfSpaceForest: n_trees x (2^(height+1) - 1) nodes at most {MAX_NODES}")
        self.n_internal = 2**self.height - 1
        self.n_nodes = 2 ** (self.height + 1) - 1
        self.size_limit = 0.1 * self.window_size  # the paper's magic constant, as river
        self.max_score = self.n_trees * self.window_size * self.n_nodes
        if seed is None or self.n_trees * self.n_internal > CACHED_SPLITS:
            self.feature, self.threshold = _draw_forest(seed, self.n_features, self.n_trees, self.height)
        else:  # a seeded forest is the same every time: drawn once a process, copied
            feature, threshold = _seeded_forest(int(seed), self.n_features, self.n_trees, self.height)
            self.feature, self.threshold = feature.copy(), threshold.copy()
        self.l_mass = np.zeros((self.n_trees, self.n_nodes), dtype=np.int32)
        self.r_mass = np.zeros((self.n_trees, self.n_nodes), dtype=np.int32)
        self.counter = 0
        self.first_window = True
        self._offsets()

    def _offsets(self) -> None:
        # Flat indices: tree t's node i is t * n_nodes + i in the raveled mass arrays, its split
        # t * n_internal + i in the raveled split arrays.
        self._node0 = (np.arange(self.n_trees, dtype=np.intp) * self.n_nodes)[:, None]
        self._split0 = (np.arange(self.n_trees, dtype=np.intp) * self.n_internal)[:, None]
        # The same forest as flat lists by flat node index, for the Python walk: split feature and
        # threshold (0 for leaves, never read), left and right child.
        i = np.arange(self.n_nodes)
        inner = i < self.n_internal
        pad = ((0, 0), (0, self.n_nodes - self.n_internal))
        self._feat_l: list[int] = np.pad(self.feature, pad).ravel().tolist()
        self._thr_l: list[float] = np.pad(self.threshold, pad).ravel().tolist()
        self._left_l: list[int] = (np.where(inner, 2 * i + 1, 0) + self._node0).ravel().tolist()
        self._right_l: list[int] = (np.where(inner, 2 * i + 2, 0) + self._node0).ravel().tolist()
        self._roots: list[int] = self._node0.ravel().tolist()
        self._r_l: list[int] | None = None
        # Paths the Python walk learnt, not yet counted into l_mass: one bincount per window (or
        # state export) instead of one per call. Scoring reads r_mass only, so nothing waits on it.
        self._unc: list[int] = []

    def _descend(self, X: np.ndarray, node: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The child each (tree, sample) goes to: left when the value is below the split (a NaN
        goes right: ``value < threshold`` is false in river too)."""
        k = node + self._split0
        left = X[cols, self.feature.ravel()[k]] < self.threshold.ravel()[k]
        node = node * 2 + 2
        node -= left
        return node

    def score(self, X: np.ndarray) -> np.ndarray:
        """Anomaly score in [0, 1] of each row of ``X`` (n, n_features); 0 in the first window."""
        n = len(X)
        if self.first_window or n == 0:
            return np.zeros(n)
        if n <= SMALL:
            return self._score_rows(X.tolist())
        cols = np.arange(n)[None, :]
        r_flat = self.r_mass.ravel()
        node = np.zeros((self.n_trees, n), dtype=np.intp)
        total = np.zeros((self.n_trees, n), dtype=np.int64)
        alive = np.ones((self.n_trees, n), dtype=bool)
        for depth in range(self.height):
            # int64 before the shift: an int32 mass times 2**depth passes 2**31 (a window of
            # 2**16 rows in one leaf at depth 16), where the walk's Python ints do not wrap.
            r = r_flat[node + self._node0].astype(np.int64)
            # A walk adds r_mass * 2**depth, then stops below the size limit (river's _walk_score).
            total += (r * alive) << depth
            alive &= r >= self.size_limit
            if not alive.any():
                break
            node = self._descend(X, node, cols)
        else:
            total += (r_flat[node + self._node0].astype(np.int64) * alive) << self.height
        # Integer sums are exact, so this is river's float result to the last bit.
        return 1.0 - total.sum(axis=0) / self.max_score

    def _score_rows(self, rows: list[list[float]]) -> np.ndarray:
        """``score`` for a few rows: river's walk over flat lists beats numpy's per-call overhead."""
        feat, thr, left, right = self._feat_l, self._thr_l, self._left_l, self._right_l
        if self._r_l is None:
            self._r_l = self.r_mass.ravel().tolist()
        r_l, lim, height = self._r_l, self.size_limit, self.height
        out = []
        for x in rows:
            total = 0
            for g in self._roots:
                pw = 1
                for _ in range(height):
                    m = r_l[g]
                    total += m * pw
                    if m < lim:
                        break
                    g = left[g] if x[feat[g]] < thr[g] else right[g]
                    pw <<= 1
                else:
                    total += r_l[g] * pw
            out.append(1.0 - total / self.max_score)
        return np.array(out)

    def learn(self, X: np.ndarray) -> None:
        """Count each row into the current window, in order; a full window becomes the reference."""
        i, n = 0, len(X)
        while i < n:
            take = min(n - i, self.window_size - self.counter)
            self._count(X[i : i + take])
            self.counter += take
            i += take
            if self.counter == self.window_size:
                self._flush()
                self.r_mass, self.l_mass = self.l_mass, np.zeros_like(self.l_mass)
                self._r_l = None
                self.first_window = False
                self.counter = 0

    def masses(self, X: np.ndarray) -> np.ndarray:
        """The mass every node would gain from learning ``X``'s rows (int64, ``l_mass``'s
        shape), without learning them: a shard's part of a window (``add_window``)."""
        if not len(X):
            return np.zeros(self.l_mass.shape, dtype=np.int64)
        return np.bincount(self._path_nodes(X), minlength=self.l_mass.size).reshape(self.l_mass.shape)

    def paths(self, X: np.ndarray) -> np.ndarray:
        """Every row's path in every tree, root to leaf: flat node indices, (rows, trees,
        height + 1). A few rows are walked in Python, more level by level in numpy. The splits
        never change while learning, so one walk serves ``score_paths`` and ``path_masses``."""
        n = len(X)
        if n > SMALL:
            return self._path_nodes(X).reshape(self.height + 1, self.n_trees, n).transpose(2, 1, 0)
        feat, thr, left, right, height = self._feat_l, self._thr_l, self._left_l, self._right_l, self.height
        out: list[int] = []
        add = out.append
        for x in X.tolist():
            for g in self._roots:
                add(g)
                for _ in range(height):
                    g = left[g] if x[feat[g]] < thr[g] else right[g]
                    add(g)
        return np.array(out, dtype=np.intp).reshape(n, self.n_trees, height + 1)

    def score_paths(self, P: np.ndarray) -> np.ndarray:
        """``score`` of the rows whose ``paths`` are ``P``: the same integer sums, so the same
        numbers (a walk adds r_mass * 2**depth and stops below the size limit)."""
        n = len(P)
        if self.first_window or n == 0:
            return np.zeros(n)
        r = self.r_mass.ravel()[P].astype(np.int64)
        alive = np.empty(r.shape, dtype=bool)
        alive[..., 0] = True
        np.logical_and.accumulate(r[..., :-1] >= self.size_limit, axis=-1, out=alive[..., 1:])
        total = ((r * alive) << np.arange(self.height + 1)).sum(axis=(1, 2))
        return 1.0 - total / self.max_score

    def path_masses(self, P: np.ndarray) -> np.ndarray:
        """``masses`` of the rows whose ``paths`` are ``P``."""
        if not len(P):
            return np.zeros(self.l_mass.shape, dtype=np.int64)
        return np.bincount(P.ravel(), minlength=self.l_mass.size).reshape(self.l_mass.shape)

    def add_window(self, mass: np.ndarray, count: int) -> None:
        """Count ``count`` learnt rows, whose masses are ``mass``, into the current window. A
        window of ``window_size`` or more becomes the reference, scaled to ``window_size`` rows
        (rows come an epoch at a time here, not one by one), so scores keep their scale.

        >>> f = HalfSpaceForest(2, n_trees=1, height=2, window_size=4, seed=1)
        >>> f.add_window(f.masses(np.full((6, 2), 0.5)), 6)
        >>> int(f.r_mass[0, 0]), f.first_window
        (4, False)
        """
        self._flush()
        total = self.l_mass.astype(np.int64) + mass
        self.counter += int(count)
        if self.counter >= self.window_size:
            self.r_mass = (total * self.window_size // self.counter).astype(np.int32)
            self.l_mass = np.zeros_like(self.l_mass)
            self._r_l = None
            self.first_window = False
            self.counter = 0
        else:
            self.l_mass = total.astype(np.int32)

    def _count(self, X: np.ndarray) -> None:
        """Add one to the mass of every node on each row's path (river's _walk_learn)."""
        n = len(X)
        if n == 0:
            return
        if n <= SMALL:
            self._paths(X.tolist())
            return
        self._add(self._path_nodes(X))

    def _path_nodes(self, X: np.ndarray) -> np.ndarray:
        """The flat index of every node on each row's path in every tree, level by level."""
        cols = np.arange(len(X))[None, :]
        node = np.zeros((self.n_trees, len(X)), dtype=np.intp)
        path = [node + self._node0]
        for _ in range(self.height):
            node = self._descend(X, node, cols)
            path.append(node + self._node0)
        return np.concatenate(path, axis=None)

    def _add(self, idx: Any) -> None:
        self.l_mass += np.bincount(idx, minlength=self.l_mass.size).reshape(self.l_mass.shape).astype(np.int32)

    def _flush(self) -> None:
        if self._unc:
            self._add(np.array(self._unc, dtype=np.intp))
            self._unc = []

    def _paths(self, rows: list[list[float]]) -> None:
        feat, thr, left, right, height = self._feat_l, self._thr_l, self._left_l, self._right_l, self.height
        add = self._unc.append
        for x in rows:
            for g in self._roots:
                add(g)
                for _ in range(height):
                    g = left[g] if x[feat[g]] < thr[g] else right[g]
                    add(g)

    # -- state: plain arrays and numbers (docs/models.md#model-state) ----------------------------

    def to_state(self) -> dict[str, Any]:
        self._flush()
        return {
            "feature": self.feature,
            "threshold": self.threshold,
            "l_mass": self.l_mass,
            "r_mass": self.r_mass,
            "counter": self.counter,
            "first_window": self.first_window,
        }

    def load_state(self, st: dict[str, Any]) -> None:
        """Take a saved forest, after checking it is one this forest's parameters could have made."""
        try:
            feature = _array(st["feature"], "feature", (self.n_trees, self.n_internal), np.int8)
            threshold = _array(st["threshold"], "threshold", (self.n_trees, self.n_internal), np.float64)
            l_mass = _array(st["l_mass"], "l_mass", (self.n_trees, self.n_nodes), np.int32)
            r_mass = _array(st["r_mass"], "r_mass", (self.n_trees, self.n_nodes), np.int32)
            counter, first = st["counter"], st["first_window"]
        except KeyError as e:
            raise StateError(f"half-space trees state lacks {e}") from e
        if ((feature < 0) | (feature >= self.n_features)).any():
            raise StateError("half-space trees state: a split on a feature the model does not have")
        if not np.isfinite(threshold).all():
            raise StateError("half-space trees state: a non-finite split")
        if (l_mass < 0).any() or (r_mass < 0).any():
            raise StateError("half-space trees state: negative mass")
        if type(counter) is not int or not 0 <= counter < self.window_size or type(first) is not bool:
            raise StateError("half-space trees state: window counter or flag out of range")
        self.feature, self.threshold, self.l_mass, self.r_mass = feature, threshold, l_mass, r_mass
        self.counter, self.first_window = counter, first
        self._offsets()


def _array(a: Any, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype) or a.shape != shape:
        got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
        raise StateError(f"half-space trees state: {name} is {got}, expected {np.dtype(dtype)}{list(shape)}")
    return a.copy()
