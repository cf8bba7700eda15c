"""The rule functions' implementations: for each name of the signature table
(``signatures.FUNCTIONS``) a builder that gets a call whose arguments passed their kinds' checks
and returns its vectorised evaluator, making only the checks that need several arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from pipeline.catalog import COUNTER
from pipeline.numeric import group_stat
from pipeline.rules import diagnostics as D
from pipeline.rules.context import Chunk, CompileError, Fn, filled, shared
from pipeline.rules.signatures import PEER_FUNCS, WINDOW_FUNCS, Bound

if TYPE_CHECKING:
    from pipeline.rules.compile import Compiler

Builder = Callable[["Compiler", Bound], Fn]


def _host_groups(c: "Chunk") -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(host, return_inverse=True)`` of the tick's rows, without its sort when the
    rows already come host by host (GPU ids are given out host by host as hosts first report)."""
    host = c.view.frame.host
    if len(host) > 1 and (host[1:] >= host[:-1]).all():
        start = np.empty(len(host), dtype=bool)
        start[0] = True
        np.not_equal(host[1:], host[:-1], out=start[1:])
        return host[start], np.cumsum(start) - 1
    return np.unique(host, return_inverse=True)


def _window(cp: Compiler, a: Bound) -> Fn:
    name, f, w = a.call.func, a.field(0), a.seconds(1)
    source, agg, counter = WINDOW_FUNCS[name]
    # Checked here, after the window's duration, not as the field's Arg.check: that is the order
    # these diagnostics have always come in.
    if counter and f.kind != COUNTER:
        raise CompileError(
            f"{name}() needs a counter; {f.alias} is a {f.kind} (use delta() or avg_over())", a.call.args[0].pos, D.TYPE
        )
    if not counter and name == "delta" and f.kind == COUNTER:
        raise CompileError(
            f"delta() is for gauges; {f.alias} is a counter (use increase(), which knows about resets)",
            a.call.args[0].pos,
            D.TYPE,
        )
    aggs = {"sum": ("sum", "count"), "avg": ("sum", "count"), "first": ("first",), "min": ("min",), "max": ("max",)}[
        agg
    ]
    key = cp.store.pane(f.column, w, source, aggs)
    store, col = cp.store, f.column
    raw: Fn
    if name == "rate":
        raw = lambda c: store.panes[key].query("sum", c.ids, c.ts0) / w  # noqa: E731
    elif name == "delta":
        raw = lambda c: c.view.filled[:, col] - store.panes[key].query("first", c.ids, c.ts0)  # noqa: E731
    else:
        raw = lambda c: store.panes[key].query(agg, c.ids, c.ts0)  # noqa: E731
    memo_key = f"{name}|{key}"
    fn: Fn = lambda c: c.cached(memo_key, raw)  # noqa: E731
    cp.evidence.setdefault(a.label, fn)
    return fn


def _baseline(cp: Compiler, a: Bound) -> Fn:
    key = cp.store.baseline(a.field(0).column, a.seconds(1))
    store = cp.store
    memo_key = f"baseline|{key}"
    fn: Fn = lambda c: c.cached(memo_key, lambda c: store.baselines[key].query(c.ids))  # noqa: E731
    cp.evidence.setdefault(a.label, fn)
    return fn


def _peer(cp: Compiler, a: Bound) -> Fn:
    inner, stat = a.fn(0), PEER_FUNCS[a.call.func]
    # Keyed by the call's text: the same text compiles to the same computation.
    memo_key = f"peer|{a.label}"
    fn: Fn = lambda c: c.cached(
        memo_key,
        lambda c: group_stat(  # noqa: E731
            c.view.frame.host, inner(c), stat, groups=c.cached("peer|groups", _host_groups)
        ),
    )
    cp.evidence.setdefault(a.label, fn)
    return fn


def _absent(cp: Compiler, a: Bound) -> Fn:
    col, w = a.field(0).column, a.seconds(1)
    return shared(cp.store.key_of(a.call), lambda c: (c.view.frame.ts - c.view.seen[:, col] > w).astype(float))


def _changed(cp: Compiler, a: Bound) -> Fn:
    col = a.field(0).column

    def changed(c: Chunk) -> np.ndarray:
        now, prev = c.view.frame.values[:, col], c.view.prev[:, col]
        known = ~np.isnan(now) & ~np.isnan(prev)
        return np.where(known, (now != prev).astype(float), 0.0)

    return shared(cp.store.key_of(a.call), changed)


def _raised(cp: Compiler, a: Bound) -> Fn:
    # A sticky code (the XID gauge holds the last XID seen) is an event when it takes a new
    # non-zero value -- and also the first time a GPU is seen with one: the fault happened
    # before we started (or the host rejoined), and only comparing with the previous value
    # would never tell anyone (docs/rules.md#xids).
    f = a.field(0)
    col = f.column
    cp.evidence.setdefault(f.alias, filled(col))

    def raised(c: Chunk) -> np.ndarray:
        now, prev = c.view.frame.values[:, col], c.view.prev[:, col]
        with np.errstate(invalid="ignore"):
            new = (now != 0) & ~np.isnan(now) & (np.isnan(prev) | (now != prev))
        return new.astype(float)

    # Several rules gate on raised(xid): once a tick for all of them.
    return shared(cp.store.key_of(a.call), raised)


def _xid_severity(cp: Compiler, a: Bound) -> Fn:
    col = a.field(0).column
    from pipeline.rules.xids import severity_levels

    fn: Fn = shared(cp.store.key_of(a.call), lambda c: severity_levels(c.view.filled[:, col]))
    cp.evidence.setdefault(a.label, fn)
    return fn


def _abs(cp: Compiler, a: Bound) -> Fn:
    fn = a.fn(0)
    return lambda c: np.abs(fn(c))


def _min_max(cp: Compiler, a: Bound) -> Fn:
    x, y = a.fn(0), a.fn(1)
    op = np.fmin if a.call.func == "min" else np.fmax
    return lambda c: op(x(c), y(c))


def _score(cp: Compiler, a: Bound) -> Fn:
    model = a.model(0)

    def score(c: Chunk) -> np.ndarray:
        # The engine evaluates the models first each tick and hangs their per-row
        # scores on the view; NaN (unknown) before a model's warm-up or without models.
        got = c.view.model_scores.get(model)
        return np.full(len(c.ent), np.nan) if got is None or len(got) != len(c.ent) else got

    cp.evidence.setdefault(a.label, score)
    return score


BUILDERS: dict[str, Builder] = {
    **dict.fromkeys(WINDOW_FUNCS, _window),
    "baseline": _baseline,
    **dict.fromkeys(PEER_FUNCS, _peer),
    "absent": _absent,
    "changed": _changed,
    "raised": _raised,
    "xid_severity": _xid_severity,
    "abs": _abs,
    "min": _min_max,
    "max": _min_max,
    "score": _score,
}
