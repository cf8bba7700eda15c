"""Type-check a parsed rule expression and turn it into a vectorised evaluator (``Compiled``).

The operators are built here; each function call is checked against its signature
(``signatures.py``) and built by its implementation (``functions.py``).

>>> from pipeline.rules.windows import WindowStore
>>> compile_expr("gpu_temp > 85 and increase(ecc_sbe_volatile, 5m) > 0", WindowStore(1.0)).type
'boolean'
"""

from __future__ import annotations

from typing import Callable, NoReturn

import numpy as np

from pipeline.catalog import BITMASK, FIELDS, Field
from pipeline.rules import diagnostics as D
from pipeline.rules import expr as E
from pipeline.rules.context import BOOL, NUM, Chunk, CompileError, Compiled, Fn, filled, shared
from pipeline.rules.functions import BUILDERS
from pipeline.rules.signatures import ALL_FUNCS, DURATION, EXPR, FIELD, FUNCTIONS, Arg, ArgValue, Bound, Function
from pipeline.rules.windows import WindowStore

__all__ = ["CompileError", "CompileErrors", "Compiler", "compile_expr"]

# The type of a sub-expression that did not compile (its error is recorded): accepted wherever
# a number or a condition is, so one mistake is not reported again by every operator above it.
_FAILED = "failed"


def _failed(c: Chunk) -> np.ndarray:  # never evaluated: an expression with an error is refused
    raise AssertionError("an expression that did not compile was evaluated")


class CompileErrors(CompileError):
    """Every problem of one expression (``errors``, in the order of the text's traversal); as a
    ``CompileError`` it is the first of them, so a caller that wants one still gets it."""

    def __init__(self, errors: list[CompileError]) -> None:
        first = errors[0]
        super().__init__(first.message, first.pos, first.code)
        self.errors = errors


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


_CMP = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


class Compiler:
    def __init__(self, src: str, store: WindowStore, models: set[str] | None = None) -> None:
        self.src = src
        self.store = store
        self.models = models or set()
        self.evidence: dict[str, Fn] = {}
        self.columns: set[int] = set()
        self.models_read: set[str] = set()
        self.errors: list[CompileError] = []  # every problem found so far, reported at once

    def compile(self, node: E.Node) -> Compiled:
        c = self.sub(node)
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise CompileErrors(self.errors)
        return Compiled(c[0], c[1], self.src, self.evidence, self.columns, self.models_read)

    def sub(self, node: E.Node) -> tuple[str, Fn]:
        """``node`` compiled, or, when it has an error, the error recorded and a placeholder of
        type ``_FAILED`` so the rest of the expression is still checked (docs/rules.md,
        "Errors": every problem at once)."""
        try:
            return self.node(node)
        except CompileError as e:
            self.errors.append(e)
            return _FAILED, _failed

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
        t, fn = self.sub(node)
        if t != typ and t != _FAILED:
            self.errors.append(CompileError(f"{ctx} needs a {typ}, got a {t}", node.pos, D.TYPE))
            return _failed
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
            self.evidence.setdefault(f.alias, filled(col))
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

            return NUM, shared(self.store.key_of(n), arith)
        if isinstance(n, E.Compare):
            lt, a = self.sub(n.left)
            rt, b = self.sub(n.right)
            if _FAILED in (lt, rt):
                return BOOL, _failed
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

            return BOOL, shared(self.store.key_of(n), cmp)
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
            self.evidence.setdefault(f.alias, filled(col))

            def has(c: Chunk) -> np.ndarray:
                v = c.view.filled[:, col]
                with np.errstate(invalid="ignore"):  # NaN's cast is garbage, masked out below
                    bits = (v.astype(np.int64) & mask) != 0
                return _unknown_where_nan(bits, v)

            return BOOL, shared(self.store.key_of(n), has)
        if isinstance(n, E.In):
            fn = self.expect(n.operand, NUM, "'in'")
            vals = np.array(n.values)
            return BOOL, shared(
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
        self.models_read.add(model)
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
        allowed = {k.name for k in spec.kwargs}
        for k, _, pos in n.kwargs:
            if k not in allowed:  # ``increase(x, w=1m)``: the keyword is the mistake, not the count
                raise CompileError(f"{n.func}() has no argument {k}= ({n.func}({spec.sig}))", pos, D.ARITY)
        if not lo <= len(n.args) <= hi:
            count = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise CompileError(
                f"{n.func}() takes {count} argument{'s' * (hi != 1)} ({spec.sig}), got {len(n.args)}", n.pos, D.ARITY
            )
        # Each argument is checked even when one before it is wrong (every problem at once); the
        # call's type is its signature's whatever its arguments, so the checks above it go on.
        errors = len(self.errors)
        kwargs = self._kwargs_or_none(n, spec) if spec.kwargs_checked == "first" else {}
        values: list[ArgValue] = []
        for arg, node in zip(spec.args, n.args):
            try:
                values.append(self._arg(n, arg, node))
            except CompileError as e:
                self.errors.append(e)
        if spec.kwargs_checked == "last":
            kwargs = self._kwargs_or_none(n, spec)
        if len(self.errors) > errors or kwargs is None:
            return spec.result, _failed
        return spec.result, BUILDERS[spec.name](self, Bound(n, label, tuple(values), kwargs))

    def _kwargs_or_none(self, n: E.Call, spec: Function) -> dict[str, str] | None:
        """``_kwargs``, or None with its error recorded."""
        try:
            return self._kwargs(n, spec)
        except CompileError as e:
            self.errors.append(e)
            return None

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


def compile_expr(src: str, store: WindowStore, models: set[str] | None = None) -> Compiled:
    """Parse and type-check ``src``; raises ``ExprSyntaxError`` or ``CompileError`` with an offset."""
    node = E.parse(src)
    return Compiler(src, store, models).compile(node)
