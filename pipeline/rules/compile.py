"""Type-check a parsed expression and turn it into vectorised evaluators.

Every node evaluates to a float64 array with one value per sample of the chunk. Booleans are
0/1 with NaN for "unknown" (a field never reported, a window still empty), combined with
Kleene logic, so ``not (gpu_temp > 85)`` is unknown -- not true -- for a GPU that never
reported a temperature. A rule fires only where its condition is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pipeline.catalog import BITMASK, CODE, COUNTER, FIELDS, Field
from pipeline.engine.state import COUNTER_COLS, View
from pipeline.rules import diagnostics as D
from pipeline.rules import expr as E
from pipeline.rules.windows import Baseline, PaneWindow, distinct, group_stat

NUM, BOOL = "number", "boolean"


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
    ts0: float                      # start of the chunk's pane (all rows share it)
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def ent(self) -> np.ndarray:
        return self.view.frame.gpu

    @property
    def ids(self) -> np.ndarray | slice:
        """``ent`` as an index into per-GPU state (``View.ids``)."""
        return self.view.ids

    def cached(self, key: str, compute: Callable[["Chunk"], np.ndarray]) -> np.ndarray:
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = compute(self)
        return hit


class WindowStore:
    """The windows and baselines a rule set needs, shared by rules that ask for the same one."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self.panes: dict[tuple, PaneWindow] = {}
        self.baselines: dict[tuple, Baseline] = {}
        self._pane_sources: dict[tuple, tuple[int, str]] = {}
        self._base_sources: dict[tuple, int] = {}
        self._expr_keys: dict[E.Node, str] = {}

    def key_of(self, node: E.Node) -> str:
        """A short memo key per distinct expression structure (nodes compare without positions)."""
        key = self._expr_keys.get(node)
        if key is None:
            key = self._expr_keys[node] = f"expr|{len(self._expr_keys)}"
        return key

    def pane(self, col: int, window_s: float, source: str, aggs: tuple[str, ...]) -> tuple:
        key = ("pane", col, window_s, source)
        if key in self.panes:
            have = self.panes[key]
            if not set(aggs) <= set(have.aggs):
                self.panes[key] = PaneWindow(window_s, self.tick, tuple(sorted(set(have.aggs) | set(aggs))))
        else:
            self.panes[key] = PaneWindow(window_s, self.tick, tuple(sorted(set(aggs))))
        self._pane_sources[key] = (col, source)
        return key

    def baseline(self, col: int, tau_s: float) -> tuple:
        key = ("ewm", col, tau_s)
        self.baselines.setdefault(key, Baseline(tau_s))
        self._base_sources[key] = col
        return key

    def update(self, view: View, ts0: float, n_ent: int) -> None:
        """Fold a chunk into every pane window (baselines are folded after evaluation)."""
        ent = view.ids
        for key, w in self.panes.items():
            col, source = self._pane_sources[key]
            vals = view.increase[:, int(np.searchsorted(COUNTER_COLS, col))] if source == "inc" \
                else view.frame.values[:, col]
            w.update(ent, ts0, vals, n_ent)

    def adopt(self, old: "WindowStore") -> None:
        """Take over the state of windows an older store already had (hot reload)."""
        for key, w in self.panes.items():
            prev = old.panes.get(key)
            if prev is not None and set(prev.aggs) == set(w.aggs):
                self.panes[key] = prev
        for key in self.baselines:
            if key in old.baselines:
                self.baselines[key] = old.baselines[key]

    def update_baselines(self, view: View, n_ent: int) -> None:
        ent = view.frame.gpu
        if len(self.baselines) > 1 and (isinstance(view.ids, slice) or distinct(ent)[1]):
            # One row per GPU (the usual tick): every baseline in one pass (Baseline.update_many).
            cols = [self._base_sources[k] for k in self.baselines]
            Baseline.update_many(list(self.baselines.values()), view.ids, view.frame.ts, view.frame.values[:, cols],
                                 n_ent)
            return
        for key, b in self.baselines.items():
            b.update(ent, view.frame.ts, view.frame.values[:, self._base_sources[key]], n_ent)

    def to_state(self) -> dict:
        return {"panes": [[list(k), w.to_state(), list(w.aggs)] for k, w in self.panes.items()],
                "baselines": [[list(k), b.to_state()] for k, b in self.baselines.items()]}

    def load_state(self, st: dict) -> None:
        for k, ws, aggs in st.get("panes", []):
            key = tuple(k)
            if key in self.panes and set(self.panes[key].aggs) == set(aggs):
                self.panes[key].load_state(ws)
        for k, bs in st.get("baselines", []):
            key = tuple(k)
            if key in self.baselines:
                self.baselines[key].load_state(bs)


@dataclass
class Compiled:
    type: str
    fn: Callable[[Chunk], np.ndarray]
    text: str
    evidence: dict[str, Callable[[Chunk], np.ndarray]] = field(default_factory=dict)
    columns: set[int] = field(default_factory=set)   # catalog columns the expression reads

    def __call__(self, chunk: Chunk) -> np.ndarray:
        return self.fn(chunk)


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


# Three-valued results are float arrays over {0, 1, NaN}. A boolean mask store is used below
# rather than np.where: where() with a scalar and a bool operand takes numpy's casting path,
# about twice the time for the same values.

def _kleene_and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # A 0 on either side wins (fmin skips NaN to find it), else an unknown side makes the
    # result unknown (minimum propagates NaN), else 1.
    r = np.minimum(a, b)
    r[np.fmin(a, b) == 0] = 0.0
    return r


def _kleene_or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.maximum(a, b)
    r[np.fmax(a, b) == 1] = 1.0
    return r


def _unknown_where_nan(known: np.ndarray, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """``known`` (bool) as {0, 1}, NaN (unknown) where an operand is NaN."""
    r = known.astype(np.float64)
    r[np.isnan(x) if y is None else np.isnan(x) | np.isnan(y)] = np.nan
    return r


class _Const:
    """A number literal: a scalar to operators that can use one, an array to everything else."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, c: "Chunk") -> np.ndarray:
        return np.full(len(c.ent), self.value)


def _shared(key: str, fn: Callable[["Chunk"], np.ndarray]) -> Callable[["Chunk"], np.ndarray]:
    """``fn`` computed once per tick however many rules hold the same sub-expression.

    ``key`` stands for the node's structure (``WindowStore.key_of``): ``gpu_util >= 50`` in five
    rules is one comparison a tick. Every node is a pure function of the tick, so sharing cannot
    change a value.
    """
    return lambda c: c.cached(key, fn)


def _as_bool(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x), np.nan, (x != 0).astype(float))


_CMP = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
        ">=": np.greater_equal}
_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}

WINDOW_FUNCS = {  # name: (source, aggregate, needs counter)
    "increase": ("inc", "sum", True), "rate": ("inc", "sum", True), "delta": ("val", "first", False),
    "avg_over": ("val", "avg", False), "min_over": ("val", "min", False), "max_over": ("val", "max", False),
}
PEER_FUNCS = {"peer_median": "median", "peer_mean": "mean", "peer_min": "min", "peer_max": "max",
              "peer_count": "count"}
ALL_FUNCS = sorted([*WINDOW_FUNCS, *PEER_FUNCS, "baseline", "absent", "changed", "raised", "xid_severity", "abs", "min",
                    "max", "score"])


class Compiler:
    def __init__(self, src: str, store: WindowStore, models: set[str] | None = None) -> None:
        self.src = src
        self.store = store
        self.models = models or set()
        self.evidence: dict[str, Callable[[Chunk], np.ndarray]] = {}
        self.columns: set[int] = set()

    def compile(self, node: E.Node) -> Compiled:
        c = self.node(node)
        return Compiled(c[0], c[1], self.src, self.evidence, self.columns)

    def _field(self, node: E.Node, what: str) -> Field:
        if not isinstance(node, E.Name):
            raise CompileError(f"{what} takes a field name here", node.pos, D.TYPE)
        f = FIELDS.resolve(node.name)
        if f is None:
            self._unknown(node)
        self.columns.add(f.column)
        return f  # type: ignore[return-value]

    def _unknown(self, node: E.Name) -> None:
        if node.name in FIELDS.bits:
            raise CompileError(f"{node.name} is a clock-event bit: test it with "
                               f"'clocks_event_reasons has {node.name}'", node.pos, D.TYPE)
        hint = FIELDS.suggest(node.name)
        more = f"; did you mean {' or '.join(repr(h) for h in hint)}?" if hint else ""
        raise CompileError(f"unknown metric {node.name!r}{more}", node.pos, D.UNKNOWN_METRIC)

    def expect(self, node: E.Node, typ: str, ctx: str) -> Callable[[Chunk], np.ndarray]:
        t, fn = self.node(node)
        if t != typ:
            raise CompileError(f"{ctx} needs a {typ}, got a {t}", node.pos, D.TYPE)
        return fn

    def node(self, n: E.Node) -> tuple[str, Callable[[Chunk], np.ndarray]]:
        if isinstance(n, E.Num):
            return NUM, _Const(n.value)
        if isinstance(n, E.Dur):
            raise CompileError(f"a duration ({n.text}) only makes sense as a window argument", n.pos, D.TYPE)
        if isinstance(n, E.Name):
            f = FIELDS.resolve(n.name)
            if f is None:
                self._unknown(n)
            col = f.column
            self.columns.add(col)
            self.evidence.setdefault(f.alias, lambda c, col=col: c.view.filled[:, col])
            return NUM, lambda c: c.view.filled[:, col]
        if isinstance(n, E.Neg):
            fn = self.expect(n.operand, NUM, "'-'")
            return NUM, lambda c: -fn(c)
        if isinstance(n, E.Arith):
            a = self.expect(n.left, NUM, f"'{n.op}'")
            b = self.expect(n.right, NUM, f"'{n.op}'")
            op = _ARITH[n.op]
            x_of = (lambda c: a.value) if isinstance(a, _Const) else a
            y_of = (lambda c: b.value) if isinstance(b, _Const) else b

            def arith(c: Chunk) -> np.ndarray:
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    r = np.asarray(op(x_of(c), y_of(c)), dtype=float)
                if r.ndim == 0:
                    r = np.full(len(c.ent), float(r))
                r[np.isinf(r)] = np.nan
                return r
            return NUM, _shared(self.store.key_of(n), arith)
        if isinstance(n, E.Compare):
            lt, a = self.node(n.left)
            rt, b = self.node(n.right)
            if lt != rt:
                raise CompileError(f"cannot compare a {lt} with a {rt}", n.pos, D.TYPE)
            op = _CMP[n.op]
            if isinstance(b, _Const) and not isinstance(a, _Const):
                y = b.value

                # (Comparisons with NaN raise no floating-point flag: no errstate needed.)
                def cmp(c: Chunk) -> np.ndarray:
                    x = a(c)
                    return _unknown_where_nan(op(x, y), x)
            else:
                def cmp(c: Chunk) -> np.ndarray:
                    x, y = a(c), b(c)
                    return _unknown_where_nan(op(x, y), x, y)
            return BOOL, _shared(self.store.key_of(n), cmp)
        if isinstance(n, E.Has):
            f = self._field(n.operand, "'has'") if isinstance(n.operand, E.Name) else None
            if f is None or f.kind != BITMASK:
                what = f"{f.alias} is a {f.kind}" if f else "the left side is not a field"
                raise CompileError(f"'has' tests bits of a bitmask field such as clocks_event_reasons; {what}",
                                   n.pos, D.TYPE)
            mask = 0
            for name, pos in n.bits:
                bit = FIELDS.bits.get(name)
                if bit is None:
                    import difflib
                    hint = difflib.get_close_matches(name, list(FIELDS.bits), n=2)
                    more = f"; did you mean {' or '.join(hint)}?" if hint else f" (known: {', '.join(FIELDS.bits)})"
                    raise CompileError(f"unknown clock-event bit {name!r}{more}", pos, D.UNKNOWN_BIT)
                mask |= bit.mask
            col = f.column
            self.evidence.setdefault(f.alias, lambda c, col=col: c.view.filled[:, col])

            def has(c: Chunk) -> np.ndarray:
                v = c.view.filled[:, col]
                with np.errstate(invalid="ignore"):   # NaN's cast is garbage, masked out below
                    bits = (v.astype(np.int64) & mask) != 0
                return _unknown_where_nan(bits, v)
            return BOOL, has
        if isinstance(n, E.In):
            fn = self.expect(n.operand, NUM, "'in'")
            vals = np.array(n.values)
            return BOOL, lambda c: (lambda x: np.where(np.isnan(x), np.nan, np.isin(x, vals).astype(float)))(fn(c))
        if isinstance(n, E.Not):
            fn = self.expect(n.operand, BOOL, "'not'")
            return BOOL, lambda c: 1.0 - fn(c)
        if isinstance(n, (E.And, E.Or)):
            word = "and" if isinstance(n, E.And) else "or"
            a = self.expect(n.left, BOOL, f"'{word}'")
            b = self.expect(n.right, BOOL, f"'{word}'")
            comb = _kleene_and if word == "and" else _kleene_or
            decided = 0.0 if word == "and" else 1.0

            def logic(c: Chunk) -> np.ndarray:
                x = a(c)
                # Short circuit, vectorised: when the left side alone decides every row (a
                # rare-event gate such as 'changed(xid) and ...'), the right side is not computed.
                if (x == decided).all():
                    return x
                return comb(x, b(c))
            return BOOL, logic
        if isinstance(n, E.Call):
            return self.call(n)
        raise CompileError(f"unsupported expression {type(n).__name__}", n.pos, D.EXPR_SYNTAX)

    def _arity(self, n: E.Call, count: int, sig: str) -> None:
        if len(n.args) != count:
            raise CompileError(f"{n.func}() takes {count} argument{'s' * (count != 1)} ({sig}), got {len(n.args)}",
                               n.pos, D.ARITY)

    def _no_kwargs(self, n: E.Call, allowed: tuple[str, ...] = ()) -> dict[str, str]:
        out = {}
        for k, v, pos in n.kwargs:
            if k not in allowed:
                raise CompileError(f"{n.func}() has no argument {k}=", pos, D.ARITY)
            out[k] = v
        return out

    def _duration(self, n: E.Node, func: str) -> float:
        if not isinstance(n, E.Dur):
            raise CompileError(f"{func}() needs a duration such as 60s or 5m as its window", n.pos, D.BAD_DURATION)
        if n.seconds <= 0:
            raise CompileError(f"{func}() window must be positive", n.pos, D.BAD_DURATION)
        return n.seconds

    def call(self, n: E.Call) -> tuple[str, Callable[[Chunk], np.ndarray]]:
        name = n.func
        label = self.src[n.pos:self._end(n)] if self._end(n) else name
        if name in WINDOW_FUNCS:
            self._arity(n, 2, "field, window")
            self._no_kwargs(n)
            f = self._field(n.args[0], f"{name}()")
            w = self._duration(n.args[1], name)
            source, agg, counter = WINDOW_FUNCS[name]
            if counter and f.kind != COUNTER:
                raise CompileError(f"{name}() needs a counter; {f.alias} is a {f.kind} (use delta() or avg_over())",
                                   n.args[0].pos, D.TYPE)
            if not counter and name == "delta" and f.kind == COUNTER:
                raise CompileError(f"delta() is for gauges; {f.alias} is a counter (use increase(), which knows "
                                   "about resets)", n.args[0].pos, D.TYPE)
            aggs = {"sum": ("sum", "count"), "avg": ("sum", "count"), "first": ("first",), "min": ("min",),
                    "max": ("max",)}[agg]
            key = self.store.pane(f.column, w, source, aggs)
            store, col = self.store, f.column
            if name == "rate":
                raw = lambda c: store.panes[key].query("sum", c.ids, c.ts0) / w  # noqa: E731
            elif name == "delta":
                raw = lambda c: c.view.filled[:, col] - store.panes[key].query("first", c.ids, c.ts0)  # noqa: E731
            else:
                raw = lambda c: store.panes[key].query(agg, c.ids, c.ts0)  # noqa: E731
            memo_key = f"{name}|{key}"
            fn = lambda c: c.cached(memo_key, raw)  # noqa: E731
            self.evidence.setdefault(label, fn)
            return NUM, fn
        if name == "baseline":
            self._arity(n, 2, "field, time constant")
            self._no_kwargs(n)
            f = self._field(n.args[0], "baseline()")
            if f.kind == COUNTER:
                raise CompileError(f"baseline() of a counter is meaningless; use baseline of its rate via a rule on "
                                   f"increase(), not {f.alias}", n.args[0].pos, D.TYPE)
            tau = self._duration(n.args[1], name)
            key = self.store.baseline(f.column, tau)
            store = self.store
            memo_key = f"baseline|{key}"
            fn = lambda c: c.cached(memo_key, lambda c: store.baselines[key].query(c.ids))  # noqa: E731
            self.evidence.setdefault(label, fn)
            return NUM, fn
        if name in PEER_FUNCS:
            self._arity(n, 1, "expression")
            kw = self._no_kwargs(n, ("by",))
            by = kw.get("by", "host")
            if by != "host":
                raise CompileError(f"{name}(by={by}) is not supported: peers are the GPUs of the same host (by=host)",
                                   n.pos, D.UNSUPPORTED)
            inner = self.expect(n.args[0], NUM, f"{name}()")
            stat = PEER_FUNCS[name]
            # Keyed by the call's text: the same text compiles to the same computation.
            memo_key = f"peer|{label}"
            fn = lambda c: c.cached(memo_key, lambda c: group_stat(  # noqa: E731
                c.view.frame.host, inner(c), stat, groups=c.cached("peer|groups", _host_groups)))
            self.evidence.setdefault(label, fn)
            return NUM, fn
        if name == "absent":
            self._arity(n, 2, "field, duration")
            self._no_kwargs(n)
            f = self._field(n.args[0], "absent()")
            w = self._duration(n.args[1], name)
            col = f.column
            return BOOL, lambda c: (c.view.frame.ts - c.view.seen[:, col] > w).astype(float)
        if name == "changed":
            self._arity(n, 1, "field")
            self._no_kwargs(n)
            f = self._field(n.args[0], "changed()")
            col = f.column

            def changed(c: Chunk) -> np.ndarray:
                now, prev = c.view.frame.values[:, col], c.view.prev[:, col]
                known = ~np.isnan(now) & ~np.isnan(prev)
                return np.where(known, (now != prev).astype(float), 0.0)
            return BOOL, changed
        if name == "raised":
            # A sticky code (the XID gauge holds the last XID seen) is an event when it takes a new
            # non-zero value -- and also the first time a GPU is seen with one: the fault happened
            # before we started (or the host rejoined), and only comparing with the previous value
            # would never tell anyone (docs/rules.md#xids).
            self._arity(n, 1, "field")
            self._no_kwargs(n)
            f = self._field(n.args[0], "raised()")
            if f.kind != CODE:
                raise CompileError(f"raised() is for code fields such as xid (a sticky last value); {f.alias} is a "
                                   f"{f.kind} (use changed() or increase())", n.args[0].pos, D.TYPE)
            col = f.column
            self.evidence.setdefault(f.alias, lambda c, col=col: c.view.filled[:, col])

            def raised(c: Chunk) -> np.ndarray:
                now, prev = c.view.frame.values[:, col], c.view.prev[:, col]
                with np.errstate(invalid="ignore"):
                    new = (now != 0) & ~np.isnan(now) & (np.isnan(prev) | (now != prev))
                return new.astype(float)
            return BOOL, raised
        if name == "xid_severity":
            self._arity(n, 1, "xid")
            self._no_kwargs(n)
            f = self._field(n.args[0], "xid_severity()")
            if f.alias != "xid":
                raise CompileError(f"xid_severity() reads the XID catalogue: its argument is xid, not {f.alias}",
                                   n.args[0].pos, D.TYPE)
            col = f.column
            from pipeline.rules.xids import severity_levels
            fn = lambda c: severity_levels(c.view.filled[:, col])  # noqa: E731
            self.evidence.setdefault(label, fn)
            return NUM, fn
        if name == "abs":
            self._arity(n, 1, "number")
            fn = self.expect(n.args[0], NUM, "abs()")
            return NUM, lambda c: np.abs(fn(c))
        if name in ("min", "max"):
            self._arity(n, 2, "number, number")
            a = self.expect(n.args[0], NUM, f"{name}()")
            b = self.expect(n.args[1], NUM, f"{name}()")
            op = np.fmin if name == "min" else np.fmax
            return NUM, lambda c: op(a(c), b(c))
        if name == "score":
            self._arity(n, 1, "model name")
            arg = n.args[0]
            model = arg.name if isinstance(arg, E.Name) else None
            if model not in self.models:
                known = ", ".join(sorted(self.models)) or "none are configured"
                raise CompileError(f"unknown model {model!r} (models: {known})", arg.pos, D.UNKNOWN_MODEL)
            self._no_kwargs(n)

            def score(c: Chunk, model: str = model) -> np.ndarray:
                # The engine evaluates the models first each tick and hangs their per-row
                # scores on the view; NaN (unknown) before a model's warm-up or without models.
                got = c.view.model_scores.get(model)
                return np.full(len(c.ent), np.nan) if got is None or len(got) != len(c.ent) else got
            self.evidence.setdefault(label, score)
            return NUM, score
        import difflib
        hint = difflib.get_close_matches(name, ALL_FUNCS, n=2)
        more = f"; did you mean {' or '.join(h + '()' for h in hint)}?" if hint else ""
        raise CompileError(f"unknown function {name}(){more}", n.pos, D.UNKNOWN_FUNCTION)

    def _end(self, n: E.Call) -> int:
        # The call's text runs to its matching ')'; good enough for an evidence label.
        depth = 0
        for i in range(n.pos, len(self.src)):
            ch = self.src[i]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return i + 1
        return 0


def compile_expr(src: str, store: WindowStore, models: set[str] | None = None) -> Compiled:
    """Parse and type-check ``src``; raises ``ExprSyntaxError`` or ``CompileError`` with an offset."""
    node = E.parse(src)
    return Compiler(src, store, models).compile(node)
