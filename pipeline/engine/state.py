"""Per-entity telemetry state in dense arrays, and what a check sees of a batch.

``GpuState.last`` holds each GPU's last known value of every field; counters' increases are
computed against it (a drop means a reset: the series restarts, never a negative increase).
One GPU's state is a row of ``last`` plus a few scalars: ~0.6 KiB at 67 fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, cast

import numpy as np
import numpy.typing as npt

from pipeline.catalog import FIELDS
from pipeline.errors import StateError
from pipeline.engine.arrays import from_dict, like, to_dict
from pipeline.engine.entities import Entities
from pipeline.engine.frame import N_FIELDS, DcgmFrame
from pipeline.numeric import grow

COUNTER_COLS = np.array([f.column for f in FIELDS if f.is_counter], dtype=np.intp)


class GpuState:
    """Each GPU's last known value and last-reported time of every catalog field.

    The columns in use (``advance``'s ``columns``) live apart, column-major, where every tick
    reads and writes them as whole blocks: a tick of the whole fleet is then views and block
    copies instead of a column gather and scatter on the n x 76 matrices. ``last`` and ``seen``
    give the full matrices (for snapshots); setting them (restore) replaces everything.
    """

    def __init__(self) -> None:
        self._last = np.full((0, N_FIELDS), np.nan)
        self.last_ts = np.full(0, np.nan)  # per GPU
        self.host_last_ts = np.full(0, np.nan)  # per host (any DCGM record)
        # per host: when it came back after a silence (or first reported); see Engine._rows
        self.host_back = np.full(0, np.nan)
        # per host: its latest sampling step among released samples; absence scales with it
        # (checks.absent_after). Kept by Engine._rows, apart from HostClock.step (on arrival).
        self.host_step = np.full(0, np.nan)
        self._seen = np.full((0, N_FIELDS), np.nan)  # per GPU and field: when it was last reported
        self._cols: np.ndarray | None = None  # the columns kept apart, and their blocks:
        self._last_c = np.full((0, 0), np.nan)
        self._seen_c = np.full((0, 0), np.nan)

    def ensure(self, n_gpus: int, n_hosts: int) -> None:
        self._last = grow(self._last, n_gpus, np.nan)
        self.last_ts = grow(self.last_ts, n_gpus, np.nan)
        self.host_last_ts = grow(self.host_last_ts, n_hosts, np.nan)
        self.host_back = grow(self.host_back, n_hosts, np.nan)
        self.host_step = grow(self.host_step, n_hosts, np.nan)
        self._seen = grow(self._seen, n_gpus, np.nan)
        if self._cols is not None:  # grows as the full matrices did: the same number of rows
            self._last_c = grow(self._last_c, len(self._last), np.nan, order="F")
            self._seen_c = grow(self._seen_c, len(self._seen), np.nan, order="F")

    def columns(self, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(last, seen) of ``cols`` for every GPU id, column-major; ``advance`` writes them in place."""
        if self._cols is None or not np.array_equal(self._cols, cols):
            self._write_back()  # new rules read other columns: re-split
            self._cols = np.array(cols, dtype=np.intp)
            self._last_c = np.asfortranarray(self._last[:, self._cols])
            self._seen_c = np.asfortranarray(self._seen[:, self._cols])
        return self._last_c, self._seen_c

    def _write_back(self) -> None:
        if self._cols is not None:
            self._last[: len(self._last_c), self._cols] = self._last_c
            self._seen[: len(self._seen_c), self._cols] = self._seen_c

    @property
    def last(self) -> np.ndarray:
        self._write_back()
        return self._last

    @last.setter
    def last(self, value: np.ndarray) -> None:
        self._write_back()
        self._last, self._cols = value, None

    @property
    def seen(self) -> np.ndarray:
        self._write_back()
        return self._seen

    @seen.setter
    def seen(self, value: np.ndarray) -> None:
        self._write_back()
        self._seen, self._cols = value, None

    def to_state(self) -> dict[str, Any]:
        """The arrays a snapshot keeps, under its keys (``host_step`` as ``released_step``)."""
        return {
            "last": to_dict(self.last),
            "last_ts": to_dict(self.last_ts),
            "host_last_ts": to_dict(self.host_last_ts),
            "host_back": to_dict(self.host_back),
            "released_step": to_dict(self.host_step),
            "seen": to_dict(self.seen),
        }

    def load_state(self, data: Mapping[str, Any], arrival_step: np.ndarray) -> None:
        """Where ``to_state`` left off. ``arrival_step``: each host's step on arrival, which
        stands in for ``host_step`` in a snapshot from before released steps were kept."""
        one, two = np.zeros(0), np.zeros((0, 0))  # what each array must be: floats, 1-d or 2-d
        self.last = _catalog_wide(like(from_dict(data["last"]), "last", two))
        self.last_ts = like(from_dict(data["last_ts"]), "last_ts", one)
        self.host_last_ts = like(from_dict(data["host_last_ts"]), "host_last_ts", one)
        # Before host returns were kept: every host counts as back long ago.
        n = len(self.host_last_ts)
        self.host_back = (
            like(from_dict(data["host_back"]), "host_back", one) if "host_back" in data else np.full(n, -np.inf)
        )
        # Before absence took its step from released samples: the step on arrival, as it was.
        self.host_step = (
            like(from_dict(data["released_step"]), "released_step", one)
            if "released_step" in data
            else arrival_step.copy()
        )
        self.seen = _catalog_wide(like(from_dict(data["seen"]), "seen", two))

    def nbytes_per_gpu(self) -> float:
        n = max(1, len(self.last_ts))
        return (
            self._last.nbytes + self.last_ts.nbytes + self._seen.nbytes + self._last_c.nbytes + self._seen_c.nbytes
        ) / n


@dataclass
class View:
    """A chunk of samples as a check sees it, rows in event-time order within each GPU.

    - ``frame.values``: what each sample reported (NaN: not reported);
    - ``filled``: the GPU's last known value of each field as of that sample;
    - ``prev``: the last known value of each field before that sample;
    - ``seen``: when each field was last reported, as of that sample;
    - ``increase``: per counter field, the increase since the GPU's previous sample (0 at a
      reset, NaN when unknown, e.g. the first sample ever);
    - ``ts0``: start of the tick the chunk belongs to (every row of a chunk shares one tick);
    - ``early``: the rows are some hosts' of the tick, run before the other hosts' rows of it
      (``Engine._release_hosts``): a stage's ``deferred`` checks are judged later.
    """

    frame: DcgmFrame  # its ``values`` a ``Columns``, as are the next three
    filled: np.ndarray
    prev: np.ndarray
    seen: np.ndarray
    increase: np.ndarray  # (n, len(COUNTER_COLS))
    reset: np.ndarray  # (n, len(COUNTER_COLS)) bool
    entities: Entities
    ts0: float = float("nan")
    model_scores: dict[str, np.ndarray] = field(default_factory=dict)  # per-row, set by the models
    index: np.ndarray | slice | None = None  # see ``ids``
    early: bool = False

    @classmethod
    def rows_only(cls, ts: np.ndarray, gpu: np.ndarray, host: np.ndarray, entities: Entities, ts0: float) -> "View":
        """Rows whose samples were folded in already, as who and when alone: what a stage's
        ``deferred`` checks read of rows that ran early (``Stage.run_deferred``).

        >>> v = View.rows_only(np.array([3.5]), np.array([0], np.int32), np.array([0], np.int32), Entities(), 3.0)
        >>> len(v.frame), v.filled.shape, v.early
        (1, (1, 0), True)
        """
        none = np.empty((len(ts), 0))
        frame = DcgmFrame(ts, gpu, host, none)
        return cls(frame, none, none, none, none, none.astype(bool), entities, ts0, early=True)

    @property
    def ids(self) -> np.ndarray | slice:
        """The rows' GPU ids as an index into per-GPU arrays.

        ``slice(0, n)`` when the chunk is every GPU once, in id order (a healthy fleet's tick):
        reading per-GPU state through it is a view instead of a gather, writing it a block
        store instead of a scatter. Otherwise ``frame.gpu``.
        """
        return self.frame.gpu if self.index is None else self.index

    def value(self, alias: str, *, last_known: bool = True) -> np.ndarray:
        col = FIELDS.require(alias).column
        return self.filled[:, col] if last_known else self.frame.values[:, col]

    def inc(self, alias: str) -> np.ndarray:
        col = FIELDS.require(alias).column
        return self.increase[:, int(np.searchsorted(COUNTER_COLS, col))]

    def has_bits(self, alias: str, mask: int) -> np.ndarray:
        v = self.value(alias)
        ok = ~np.isnan(v)
        out = np.zeros(len(v), dtype=bool)
        out[ok] = (v[ok].astype(np.int64) & mask) != 0
        return out


def _catalog_wide(m: np.ndarray) -> np.ndarray:
    """A per-GPU x field matrix from a snapshot, as wide as the catalog: fields added to the
    catalog since take its last columns (pipeline/catalog.py), so a narrower matrix gains them
    empty; anything else is not this engine's state.

    >>> _catalog_wide(np.zeros((2, N_FIELDS - 6))).shape == (2, N_FIELDS)
    True
    """
    if m.ndim != 2 or m.shape[1] > N_FIELDS:
        raise StateError(
            f"snapshot: a per-GPU field matrix of shape {m.shape}, where the catalog has {N_FIELDS} fields"
        )
    if m.shape[1] < N_FIELDS:
        m = np.concatenate([m.astype(np.float64, copy=False), np.full((len(m), N_FIELDS - m.shape[1]), np.nan)], axis=1)
    return m


class Columns:
    """An (n, N_FIELDS) matrix of which only the columns in use are stored.

    Reads like the full matrix (``m[:, col]``, ``m[rows, cols]``); a column nobody reads is
    all NaN. Storing only the used columns spares each tick four n x 76 fills and scatters.

    >>> m = Columns(np.array([[1.0, 2.0]]), _positions(np.array([3, 5])))
    >>> m[:, 5].tolist(), m[:, 4].tolist(), m[0, np.array([3, 4])].tolist()
    ([2.0], [nan], [1.0, nan])
    >>> m[[0, 0]][:, 3].tolist()
    [1.0, 1.0]
    """

    __slots__ = ("data", "pos", "_nan")

    def __init__(self, data: np.ndarray, pos: np.ndarray) -> None:
        self.data, self.pos = data, pos
        self._nan: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.data), N_FIELDS)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):  # rows only (``DcgmFrame.take``): still a Columns
            return Columns(self.data[key], self.pos)
        rows, cols = key
        p = self.pos[cols]
        if p.ndim == 0:
            if p >= 0:
                return self.data[rows, p]
            if self._nan is None:
                self._nan = np.full(len(self.data), np.nan)
            return self._nan[rows]
        out = self.data[rows][..., np.maximum(p, 0)]
        if (p < 0).any():
            out[..., p < 0] = np.nan
        return out

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: object = None) -> np.ndarray:
        full = np.full(self.shape, np.nan)
        used = self.pos >= 0
        full[:, used] = self.data[:, self.pos[used]]
        return full if dtype is None else full.astype(dtype)


_POSITIONS: dict[bytes, np.ndarray] = {}


def _positions(cols: np.ndarray) -> np.ndarray:
    """Catalog column -> index in ``cols`` (-1: not in use), made once per column set."""
    key = cols.tobytes()
    pos = _POSITIONS.get(key)
    if pos is None:
        pos = np.full(N_FIELDS, -1, dtype=np.intp)
        pos[cols] = np.arange(len(cols))
        _POSITIONS[key] = pos
    return pos


def advance(
    state: GpuState, frame: DcgmFrame, entities: Entities, ts0: float = float("nan"), columns: np.ndarray | None = None
) -> View:
    """Fold a chunk (rows sorted by GPU, event time within GPU) into the state; return its view.

    ``columns``: the catalog columns anything reads (the engine's ``Columnizer.columns``). Only
    those are carried forward and in the view (``Columns``); the others are never read into
    ``frame.values``, so working on them would be ~4x the numpy work for nothing.
    """
    n = len(frame)
    state.ensure(entities.n_gpus, entities.n_hosts)
    if n == 0:
        empty = np.empty((0, len(COUNTER_COLS)))
        m = np.empty((0, N_FIELDS))
        return View(frame, m, m, m, empty, empty.astype(bool), entities, ts0)
    cols = _ALL if columns is None else np.asarray(columns, dtype=np.intp)
    k = len(cols)
    ent = frame.gpu
    # The engine hands over the compact matrix (``Columnizer.compact``): one column per entry of cols.
    vals = frame.values if frame.values.shape[1] == k else frame.values[:, cols]
    start = np.ones(n, dtype=bool)
    start[1:] = ent[1:] != ent[:-1]
    # Every GPU once, in id order (the usual tick of a healthy fleet): the state's rows as they
    # are, no gather or scatter by id.
    one_each = bool(start.all())
    whole = one_each and n == entities.n_gpus and int(ent[0]) == 0 and int(ent[-1]) == n - 1
    last_all, seen_all = state.columns(cols)
    if whole:
        last_c, seen_state = last_all[:n], seen_all[:n]  # views: written back below
    else:
        last_c, seen_state = last_all.take(ent, axis=0), seen_all.take(ent, axis=0)
    # Column-major from here on, like the state and the view: checks read whole columns.
    vals = np.asfortranarray(vals)
    missing = np.isnan(vals)
    if one_each:
        # One row per GPU (the usual tick): a sample's "before" is the stored state.
        filled_c = np.where(missing, last_c, vals)
        seen_c = np.where(missing, seen_state, frame.ts[:, None])
        prev_c = last_c.copy(order="F") if whole else last_c
    else:
        gstart = np.maximum.accumulate(np.where(start, np.arange(n), 0))
        # Forward-fill each column within its GPU's run of rows; fall back to the stored state.
        idx = np.where(missing, -1, np.arange(n)[:, None])
        acc = np.maximum.accumulate(idx, axis=0)
        have = acc >= gstart[:, None]
        src = np.maximum(acc, 0)
        filled_c = np.where(have, vals[src, np.arange(k)], last_c)
        seen_c = np.where(have, frame.ts[src], seen_state)
        # Previous known value of each field: the row above within the GPU, else the state.
        prev_c = np.empty((n, k))
        prev_c[start] = last_c[start]
        notstart = np.flatnonzero(~start)
        prev_c[notstart] = filled_c[notstart - 1]
    inc = np.full((n, len(COUNTER_COLS)), np.nan, order="F")
    ccols, cpos = _counter_positions(cols)
    with np.errstate(invalid="ignore"):
        inc[:, ccols] = vals[:, cpos] - prev_c[:, cpos]
        reset = inc < 0
    inc[reset] = 0.0
    # Store the last row of each GPU's run.
    if whole:
        last_all[:n] = filled_c
        seen_all[:n] = seen_c
        state.last_ts[:n] = frame.ts
    else:
        end = np.ones(n, dtype=bool)
        end[:-1] = ent[1:] != ent[:-1]
        last_ent = ent[end]
        last_all[last_ent] = filled_c[end]
        seen_all[last_ent] = seen_c[end]
        state.last_ts[last_ent] = frame.ts[end]
    np.fmax.at(state.host_last_ts, frame.host, frame.ts)
    # Column-major where checks read whole columns most (values, filled): contiguous reads.
    pos = _positions(cols)
    frame = DcgmFrame(frame.ts, frame.gpu, frame.host, _matrix(vals, pos))
    return View(
        frame,
        _matrix(np.asfortranarray(filled_c), pos),
        _matrix(prev_c, pos),
        _matrix(seen_c, pos),
        inc,
        reset,
        entities,
        ts0,
        index=slice(0, n) if whole else None,
    )


def _matrix(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """A ``Columns`` where a check expects the full matrix: it reads like one (``[:, col]``,
    ``[rows, cols]``, ``len``, ``np.asarray``), which the type checker cannot be told otherwise."""
    return cast(np.ndarray, Columns(data, pos))


_ALL = np.arange(N_FIELDS)
_COUNTER_POS = {int(c): i for i, c in enumerate(COUNTER_COLS)}


_COUNTER_POSITIONS: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}


def _counter_positions(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the counter columns among ``cols``: their index in COUNTER_COLS and in ``cols`` (made
    once per column set, like ``_positions``: every tick asks with the same one)."""
    key = cols.tobytes()
    got = _COUNTER_POSITIONS.get(key)
    if got is None:
        got = _COUNTER_POSITIONS[key] = _find_counter_positions(cols)
    return got


def _find_counter_positions(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(_COUNTER_POS[int(c)], j) for j, c in enumerate(cols) if int(c) in _COUNTER_POS]
    if not pairs:
        return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.intp)
    a, b = zip(*pairs)
    return np.array(a, dtype=np.intp), np.array(b, dtype=np.intp)
