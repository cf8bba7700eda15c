"""Type-check a parsed expression and turn it into vectorised evaluators.

Every node evaluates to a float64 array with one value per sample of the chunk. Booleans are
0/1 with NaN for "unknown" (a field never reported, a window still empty), combined with
Kleene logic, so ``not (gpu_temp > 85)`` is unknown -- not true -- for a GPU that never
reported a temperature. A rule fires only where its condition is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, NoReturn, TypeVar, Union, cast

import numpy as np

from pipeline.catalog import BITMASK, CODE, COUNTER, FIELDS, Field
from pipeline.engine.state import COUNTER_COLS, View
from pipeline.numeric import distinct, group_stat
from pipeline.rules import diagnostics as D
from pipeline.rules import expr as E
from pipeline.rules.windows import Baseline, PaneWindow

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


_INC_POS = {int(c): i for i, c in enumerate(COUNTER_COLS)}  # counter column -> its column of View.increase


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
            vals = view.increase[:, _INC_POS[col]] if source == "inc" else view.frame.values[:, col]
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
            Baseline.update_many(
                list(self.baselines.values()), view.ids, view.frame.ts, view.frame.values[:, cols], n_ent
            )
            return
        for key, b in self.baselines.items():
            b.update(ent, view.frame.ts, view.frame.values[:, self._base_sources[key]], n_ent)

    def to_state(self) -> dict:
        return {
            "panes": [[list(k), w.to_state(), list(w.aggs)] for k, w in self.panes.items()],
            "baselines": [[list(k), b.to_state()] for k, b in self.baselines.items()],
        }

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
    columns: set[int] = field(default_factory=set)  # catalog columns the expression reads

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


def _filled(col: int) -> Fn:
    """The column's last known value per sample: a field's evidence."""
    return lambda c: c.view.filled[:, col]


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


_CMP = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}

WINDOW_FUNCS = {  # name: (source, aggregate, needs counter)
    "increase": ("inc", "sum", True),
    "rate": ("inc", "sum", True),
    "delta": ("val", "first", False),
    "avg_over": ("val", "avg", False),
    "min_over": ("val", "min", False),
    "max_over": ("val", "max", False),
}
PEER_FUNCS = {"peer_median": "median", "peer_mean": "mean", "peer_min": "min", "peer_max": "max", "peer_count": "count"}

# What one position of a call must hold (Arg.kind).
ArgKind = Literal["expression", "field", "duration", "model"]
EXPR: ArgKind = "expression"  # any numeric expression
FIELD: ArgKind = "field"  # a catalog field by name: windows and baselines are kept per field
DURATION: ArgKind = "duration"  # a duration literal (5m): a window or a time constant
MODEL: ArgKind = "model"  # a model name from models.yaml

ArgValue = Union[Field, float, Fn, str]  # an argument once read: by kind, Field, seconds, evaluator, name


@dataclass(frozen=True)
class Arg:
    """One positional argument of a rule function."""

    kind: ArgKind
    # Refuses a field the function cannot use (baseline() of a counter, raised() of a gauge),
    # run as soon as the field is read, before the next argument.
    check: Callable[[Field, E.Node], None] | None = None


@dataclass(frozen=True)
class Kwarg:
    """A keyword argument, the values it accepts and why others are refused (E108)."""

    name: str
    values: tuple[str, ...]
    default: str
    why: str


BY_HOST = Kwarg("by", ("host",), "host", "peers are the GPUs of the same host (by=host)")


@dataclass(frozen=True)
class Bound:
    """A call whose arguments passed their kinds' checks, as its function's builder gets it."""

    call: E.Call
    label: str  # the call's text: its evidence name and memo key
    values: tuple[ArgValue, ...]  # one per positional argument, read as its Arg.kind says
    kwargs: dict[str, str]

    def field(self, i: int) -> Field:
        return cast(Field, self.values[i])

    def seconds(self, i: int) -> float:
        return cast(float, self.values[i])

    def fn(self, i: int) -> Fn:
        return cast(Fn, self.values[i])

    def model(self, i: int) -> str:
        return cast(str, self.values[i])


@dataclass(frozen=True)
class Function:
    """One rule function: its signature, checked by ``Compiler.call``, and its builder.

    ``build`` gets the checked arguments and returns the vectorised evaluator; it makes only the
    checks that need several arguments together.
    """

    name: str
    args: tuple[Arg, ...]
    sig: str  # the arguments as the arity diagnostic (E104) names them
    result: str  # NUM or BOOL
    build: Callable[["Compiler", Bound], Fn]
    kwargs: tuple[Kwarg, ...] = ()
    # When keyword arguments are checked: "first" (before the positional ones) or "last" (after
    # them). Of two mistakes in one call the first checked is reported, so each function keeps
    # the order its diagnostics have always had.
    kwargs_checked: Literal["first", "last"] = "first"

    @property
    def arity(self) -> tuple[int, int]:
        """The fewest and the most positional arguments (the same for every function today)."""
        return len(self.args), len(self.args)


class Compiler:
    def __init__(self, src: str, store: WindowStore, models: set[str] | None = None) -> None:
        self.src = src
        self.store = store
        self.models = models or set()
        self.evidence: dict[str, Fn] = {}
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
        return f

    def _unknown(self, node: E.Name) -> NoReturn:
        if node.name in FIELDS.bits:
            raise CompileError(
                f"{node.name} is a clock-event bit: test it with 'clocks_event_reasons has {node.name}'",
                node.pos,
                D.TYPE,
            )
        hint = FIELDS.suggest(node.name)
        more = f"; did you mean {' or '.join(repr(h) for h in hint)}?" if hint else ""
        raise CompileError(f"unknown metric {node.name!r}{more}", node.pos, D.UNKNOWN_METRIC)

    def expect(self, node: E.Node, typ: str, ctx: str) -> Fn:
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
            self.evidence.setdefault(f.alias, _filled(col))
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
                raise CompileError(
                    f"'has' tests bits of a bitmask field such as clocks_event_reasons; {what}", n.pos, D.TYPE
                )
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
            self.evidence.setdefault(f.alias, _filled(col))

            def has(c: Chunk) -> np.ndarray:
                v = c.view.filled[:, col]
                with np.errstate(invalid="ignore"):  # NaN's cast is garbage, masked out below
                    bits = (v.astype(np.int64) & mask) != 0
                return _unknown_where_nan(bits, v)

            return BOOL, _shared(self.store.key_of(n), has)
        if isinstance(n, E.In):
            fn = self.expect(n.operand, NUM, "'in'")
            vals = np.array(n.values)
            return BOOL, _shared(
                self.store.key_of(n),
                lambda c: (lambda x: np.where(np.isnan(x), np.nan, np.isin(x, vals).astype(float)))(fn(c)),
            )
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

    def _duration(self, n: E.Node, func: str) -> float:
        if not isinstance(n, E.Dur):
            raise CompileError(f"{func}() needs a duration such as 60s or 5m as its window", n.pos, D.BAD_DURATION)
        if n.seconds <= 0:
            raise CompileError(f"{func}() window must be positive", n.pos, D.BAD_DURATION)
        return n.seconds

    def _model(self, n: E.Node) -> str:
        model = n.name if isinstance(n, E.Name) else None
        if model is None or model not in self.models:
            known = ", ".join(sorted(self.models)) or "none are configured"
            raise CompileError(f"unknown model {model!r} (models: {known})", n.pos, D.UNKNOWN_MODEL)
        return model

    def _arg(self, n: E.Call, arg: Arg, node: E.Node) -> ArgValue:
        """Read one argument as its kind says, or raise the kind's diagnostic."""
        if arg.kind == FIELD:
            f = self._field(node, f"{n.func}()")
            if arg.check is not None:
                arg.check(f, node)
            return f
        if arg.kind == DURATION:
            return self._duration(node, n.func)
        if arg.kind == EXPR:
            return self.expect(node, NUM, f"{n.func}()")
        return self._model(node)

    def _kwargs(self, n: E.Call, spec: Function) -> dict[str, str]:
        allowed = {k.name for k in spec.kwargs}
        out = {}
        for k, v, pos in n.kwargs:
            if k not in allowed:
                raise CompileError(f"{n.func}() has no argument {k}=", pos, D.ARITY)
            out[k] = v
        for kw in spec.kwargs:
            v = out.setdefault(kw.name, kw.default)
            if v not in kw.values:
                raise CompileError(f"{n.func}({kw.name}={v}) is not supported: {kw.why}", n.pos, D.UNSUPPORTED)
        return out

    def call(self, n: E.Call) -> tuple[str, Fn]:
        """Check a call against its row of ``FUNCTIONS`` and build its evaluator."""
        spec = FUNCTIONS.get(n.func)
        if spec is None:
            self._unknown_function(n)
        end = self._end(n)
        label = self.src[n.pos : end] if end else n.func
        lo, hi = spec.arity
        if not lo <= len(n.args) <= hi:
            count = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise CompileError(
                f"{n.func}() takes {count} argument{'s' * (hi != 1)} ({spec.sig}), got {len(n.args)}", n.pos, D.ARITY
            )
        kwargs = self._kwargs(n, spec) if spec.kwargs_checked == "first" else {}
        values = tuple(self._arg(n, arg, node) for arg, node in zip(spec.args, n.args))
        if spec.kwargs_checked == "last":
            kwargs = self._kwargs(n, spec)
        return spec.result, spec.build(self, Bound(n, label, values, kwargs))

    def _unknown_function(self, n: E.Call) -> NoReturn:
        import difflib

        hint = difflib.get_close_matches(n.func, ALL_FUNCS, n=2)
        more = (
            f"; did you mean {' or '.join(h + '()' for h in hint)}?"
            if hint
            else f" (known: {', '.join(h + '()' for h in ALL_FUNCS)})"
        )
        raise CompileError(f"unknown function {n.func}(){more}", n.pos, D.UNKNOWN_FUNCTION)

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


# The builders of FUNCTIONS: each gets a call whose arguments passed their kinds' checks.


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


def _not_a_counter(f: Field, node: E.Node) -> None:
    if f.kind == COUNTER:
        raise CompileError(
            f"baseline() of a counter is meaningless; use baseline of its rate via a rule on increase(), not {f.alias}",
            node.pos,
            D.TYPE,
        )


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
    return _shared(cp.store.key_of(a.call), lambda c: (c.view.frame.ts - c.view.seen[:, col] > w).astype(float))


def _changed(cp: Compiler, a: Bound) -> Fn:
    col = a.field(0).column

    def changed(c: Chunk) -> np.ndarray:
        now, prev = c.view.frame.values[:, col], c.view.prev[:, col]
        known = ~np.isnan(now) & ~np.isnan(prev)
        return np.where(known, (now != prev).astype(float), 0.0)

    return _shared(cp.store.key_of(a.call), changed)


def _a_code(f: Field, node: E.Node) -> None:
    if f.kind != CODE:
        raise CompileError(
            f"raised() is for code fields such as xid (a sticky last value); {f.alias} is a "
            f"{f.kind} (use changed() or increase())",
            node.pos,
            D.TYPE,
        )


def _raised(cp: Compiler, a: Bound) -> Fn:
    # A sticky code (the XID gauge holds the last XID seen) is an event when it takes a new
    # non-zero value -- and also the first time a GPU is seen with one: the fault happened
    # before we started (or the host rejoined), and only comparing with the previous value
    # would never tell anyone (docs/rules.md#xids).
    f = a.field(0)
    col = f.column
    cp.evidence.setdefault(f.alias, _filled(col))

    def raised(c: Chunk) -> np.ndarray:
        now, prev = c.view.frame.values[:, col], c.view.prev[:, col]
        with np.errstate(invalid="ignore"):
            new = (now != 0) & ~np.isnan(now) & (np.isnan(prev) | (now != prev))
        return new.astype(float)

    # Several rules gate on raised(xid): once a tick for all of them.
    return _shared(cp.store.key_of(a.call), raised)


def _the_xid(f: Field, node: E.Node) -> None:
    if f.alias != "xid":
        raise CompileError(
            f"xid_severity() reads the XID catalogue: its argument is xid, not {f.alias}", node.pos, D.TYPE
        )


def _xid_severity(cp: Compiler, a: Bound) -> Fn:
    col = a.field(0).column
    from pipeline.rules.xids import severity_levels

    fn: Fn = _shared(cp.store.key_of(a.call), lambda c: severity_levels(c.view.filled[:, col]))
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


# Every rule function, the table Compiler.call reads (docs/rules.md, "Functions", lists the same
# names; tests/unit/rules/test_functions_table.py keeps them equal).
FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in [
        *(Function(name, (Arg(FIELD), Arg(DURATION)), "field, window", NUM, _window) for name in WINDOW_FUNCS),
        Function("baseline", (Arg(FIELD, _not_a_counter), Arg(DURATION)), "field, time constant", NUM, _baseline),
        *(Function(name, (Arg(EXPR),), "expression", NUM, _peer, kwargs=(BY_HOST,)) for name in PEER_FUNCS),
        Function("absent", (Arg(FIELD), Arg(DURATION)), "field, duration", BOOL, _absent),
        Function("changed", (Arg(FIELD),), "field", BOOL, _changed),
        Function("raised", (Arg(FIELD, _a_code),), "field", BOOL, _raised),
        Function("xid_severity", (Arg(FIELD, _the_xid),), "xid", NUM, _xid_severity),
        Function("abs", (Arg(EXPR),), "number", NUM, _abs, kwargs_checked="last"),
        Function("min", (Arg(EXPR), Arg(EXPR)), "number, number", NUM, _min_max, kwargs_checked="last"),
        Function("max", (Arg(EXPR), Arg(EXPR)), "number, number", NUM, _min_max, kwargs_checked="last"),
        # The model is looked up before the keyword arguments are: its diagnostics' order.
        Function("score", (Arg(MODEL),), "model name", NUM, _score, kwargs_checked="last"),
    ]
}
ALL_FUNCS = sorted(FUNCTIONS)


def compile_expr(src: str, store: WindowStore, models: set[str] | None = None) -> Compiled:
    """Parse and type-check ``src``; raises ``ExprSyntaxError`` or ``CompileError`` with an offset."""
    node = E.parse(src)
    return Compiler(src, store, models).compile(node)
