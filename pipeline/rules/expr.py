"""The rule expression language: tokens, a recursive-descent parser and the syntax tree.

Our own grammar, never Python's ``eval``/``ast``: an expression can only name catalog fields,
numbers, durations, clock-event bits and the functions of ``compile.FUNCTIONS``.

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | cmp
    cmp     := sum [("=="|"!="|"<"|"<="|">"|">=") sum | "has" BIT ("|" BIT)* | "in" "(" num ("," num)* ")"]
    sum     := product (("+"|"-") product)*
    product := unary (("*"|"/") unary)*
    unary   := "-" unary | atom
    atom    := NUMBER | DURATION | NAME | NAME "(" [arg ("," arg)*] ")" | "(" expr ")"
    arg     := NAME "=" NAME | expr

A chain of ``and`` (or of ``or``) is built as a balanced tree: Kleene and/or are associative, so
the value is the same, and 200 terms nest 8 levels deep instead of 200.

Expressions come from files anyone may edit, so their size is bounded before anything recurses
over them (the parser, the type checker, the evaluator's closures): length, nesting depth and
number of terms, and every number must be finite. Each limit has its own diagnostic code
(docs/rules.md, "Limits").

>>> parse("clocks_event_reasons has HW_THERMAL|SW_THERMAL and sm_clock < 0.7 * baseline(sm_clock, 30m)")
And(left=Has(...), right=Compare(...))
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

from pipeline.rules import diagnostics as D
from pipeline.rules.durations import parse_duration

MAX_CHARS = 4096  # characters in one expression
MAX_DEPTH = 32  # nested operators, parentheses and calls (each level costs Python frames)
MAX_TERMS = 256  # operands: fields, numbers, durations, bit names, `in` values
MAX_NUMBER = 2.0**64  # a literal's magnitude: room for any 64-bit bitmask


class ExprSyntaxError(ValueError):
    def __init__(self, message: str, pos: int, code: str = D.EXPR_SYNTAX) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.code = code


@dataclass(frozen=True)
class Node:
    pos: int = field(compare=False, repr=False)

    def __repr__(self) -> str:  # keep doctest output short
        return f"{type(self).__name__}(...)"


@dataclass(frozen=True, repr=False)
class Num(Node):
    value: float = 0.0


@dataclass(frozen=True, repr=False)
class Dur(Node):
    seconds: float = 0.0
    text: str = ""


@dataclass(frozen=True, repr=False)
class Name(Node):
    name: str = ""


@dataclass(frozen=True, repr=False)
class Call(Node):
    func: str = ""
    args: tuple[Node, ...] = ()
    kwargs: tuple[tuple[str, str, int], ...] = ()  # (key, value, pos)


@dataclass(frozen=True, repr=False)
class Neg(Node):
    operand: Node


@dataclass(frozen=True, repr=False)
class Arith(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, repr=False)
class Compare(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, repr=False)
class Has(Node):
    operand: Node
    bits: tuple[tuple[str, int], ...] = ()  # (name, pos)


@dataclass(frozen=True, repr=False)
class In(Node):
    operand: Node
    values: tuple[float, ...] = ()


@dataclass(frozen=True, repr=False)
class Not(Node):
    operand: Node


@dataclass(frozen=True, repr=False)
class And(Node):
    left: Node
    right: Node

    def __repr__(self) -> str:
        return f"And(left={self.left!r}, right={self.right!r})"


@dataclass(frozen=True, repr=False)
class Or(Node):
    left: Node
    right: Node


# Digits are ASCII only: Python reads every script's digits as numbers, and some look like
# others (Bengali '৪' is a 4 that reads as an 8), so "gpu_temp > ৪5" would compare with 45.
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<dur>[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h|d)(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h|d))*(?![A-Za-z0-9_]))
  | (?P<num>0[xX][0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|[<>+\-*/(),|=])
""",
    re.VERBOSE,
)
KEYWORDS = {"and", "or", "not", "has", "in"}


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    pos: int


def tokenize(src: str) -> list[Tok]:
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise ExprSyntaxError(f"unexpected character {src[pos]!r}", pos)
        kind = m.lastgroup or ""
        if kind != "ws":
            text = m.group()
            if kind == "name" and text in KEYWORDS:
                kind = "kw"
            out.append(Tok(kind, text, pos))
        pos = m.end()
    out.append(Tok("end", "", len(src)))
    return out


def _number(t: Tok) -> float:
    """A number token's value; out-of-range literals (``0x`` + 300 digits, ``1e400``) are errors."""
    big = ExprSyntaxError(
        f"number {t.text[:20]}{'...' if len(t.text) > 20 else ''} is out of range (at most {MAX_NUMBER:.3g})",
        t.pos,
        D.BAD_NUMBER,
    )
    if t.text[:2].lower() == "0x":
        n = int(t.text, 16)  # exact for any length: no float overflow here
        if n > MAX_NUMBER:
            raise big
        return float(n)
    v = float(t.text)
    if not math.isfinite(v) or abs(v) > MAX_NUMBER:
        raise big
    return v


def _children(n: "Node") -> tuple["Node", ...]:
    if isinstance(n, (Arith, Compare, And, Or)):
        return (n.left, n.right)
    if isinstance(n, (Neg, Not, Has, In)):
        return (n.operand,)
    if isinstance(n, Call):
        return n.args
    return ()


def _terms(n: "Node") -> int:
    if isinstance(n, Has):
        return len(n.bits)
    if isinstance(n, In):
        return len(n.values)
    return 1 if isinstance(n, (Num, Dur, Name)) else 0


def check_size(root: "Node") -> None:
    """Refuse a tree deeper than ``MAX_DEPTH`` or with more than ``MAX_TERMS`` operands.

    Iterative, so it is safe on any tree; what compiles afterwards recurses at most
    ``MAX_DEPTH`` levels.
    """
    stack, terms = [(root, 1)], 0
    while stack:
        n, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExprSyntaxError(
                f"expression nests more than {MAX_DEPTH} levels deep (operators inside operators, "
                "parentheses, calls); split it into named values",
                n.pos,
                D.EXPR_TOO_DEEP,
            )
        terms += _terms(n)
        if terms > MAX_TERMS:
            raise ExprSyntaxError(
                f"expression has more than {MAX_TERMS} terms; use 'in (...)' for lists of values, or split the rule",
                n.pos,
                D.EXPR_TOO_MANY_TERMS,
            )
        stack += [(c, depth + 1) for c in _children(n)]


class _Parser:
    def __init__(self, src: str) -> None:
        if len(src) > MAX_CHARS:
            raise ExprSyntaxError(
                f"expression is {len(src)} characters long; the limit is {MAX_CHARS}", MAX_CHARS, D.EXPR_TOO_LONG
            )
        self.toks = tokenize(src)
        self.i = 0
        self.depth = 0

    def nest(self, pos: int) -> None:
        """Count one level of the parser's own recursion, which stops well before Python's."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprSyntaxError(
                f"expression nests more than {MAX_DEPTH} levels deep (parentheses, 'not', '-', calls)",
                pos,
                D.EXPR_TOO_DEEP,
            )

    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def take(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (text is None or t.text == text)

    def expect(self, kind: str, text: str | None = None, what: str = "") -> Tok:
        if not self.at(kind, text):
            t = self.tok
            found = "end of expression" if t.kind == "end" else repr(t.text)
            raise ExprSyntaxError(f"expected {what or text or kind}, found {found}", t.pos)
        return self.take()

    def parse(self) -> Node:
        node = self.or_()
        if not self.at("end"):
            raise ExprSyntaxError(f"unexpected {self.tok.text!r} (missing 'and'/'or' or an operator?)", self.tok.pos)
        check_size(node)
        return node

    def _chain(self, word: str, cls: type, operand) -> Node:
        items, ops = [operand()], []
        while self.at("kw", word):
            ops.append(self.take().pos)
            items.append(operand())

        def build(lo: int, hi: int) -> Node:
            # Left-heavy split: chains of two or three terms keep their usual left-nested shape.
            if hi - lo == 1:
                return items[lo]
            mid = (lo + hi + 1) // 2
            return cls(ops[mid - 1], build(lo, mid), build(mid, hi))

        return build(0, len(items))

    def or_(self) -> Node:
        return self._chain("or", Or, self.and_)

    def and_(self) -> Node:
        return self._chain("and", And, self.not_)

    def not_(self) -> Node:
        if self.at("kw", "not"):
            pos = self.take().pos
            self.nest(pos)
            node = Not(pos, self.not_())
            self.depth -= 1
            return node
        return self.cmp()

    def cmp(self) -> Node:
        left = self.sum()
        t = self.tok
        if t.kind == "op" and t.text in ("==", "!=", "<", "<=", ">", ">="):
            self.take()
            return Compare(t.pos, t.text, left, self.sum())
        if self.at("kw", "has"):
            self.take()
            bits = [self.expect("name", what="a clock-event bit name such as HW_THERMAL")]
            while self.at("op", "|"):
                self.take()
                bits.append(self.expect("name", what="a clock-event bit name"))
            return Has(t.pos, left, tuple((b.text, b.pos) for b in bits))
        if self.at("kw", "in"):
            self.take()
            self.expect("op", "(")
            vals = [self._number()]
            while self.at("op", ","):
                self.take()
                vals.append(self._number())
            self.expect("op", ")")
            return In(t.pos, left, tuple(vals))
        return left

    def _number(self) -> float:
        neg = False
        if self.at("op", "-"):
            self.take()
            neg = True
        v = _number(self.expect("num", what="a number"))
        return -v if neg else v

    def sum(self) -> Node:
        left = self.product()
        while self.tok.kind == "op" and self.tok.text in "+-" and self.tok.text:
            t = self.take()
            left = Arith(t.pos, t.text, left, self.product())
        return left

    def product(self) -> Node:
        left = self.unary()
        while self.tok.kind == "op" and self.tok.text in ("*", "/"):
            t = self.take()
            left = Arith(t.pos, t.text, left, self.unary())
        return left

    def unary(self) -> Node:
        if self.at("op", "-"):
            pos = self.take().pos
            self.nest(pos)
            node = Neg(pos, self.unary())
            self.depth -= 1
            return node
        return self.atom()

    def atom(self) -> Node:
        t = self.tok
        if t.kind == "num":
            self.take()
            return Num(t.pos, _number(t))
        if t.kind == "dur":
            self.take()
            try:
                return Dur(t.pos, parse_duration(t.text), t.text)
            except ValueError as e:
                raise ExprSyntaxError(str(e), t.pos, D.BAD_DURATION) from None
        if t.kind == "name":
            self.take()
            if self.at("op", "("):
                self.nest(t.pos)
                node: Node = self.call(t)
                self.depth -= 1
                return node
            return Name(t.pos, t.text)
        if self.at("op", "("):
            self.nest(self.take().pos)
            node = self.or_()
            self.expect("op", ")", what="')'")
            self.depth -= 1
            return node
        found = "end of expression" if t.kind == "end" else repr(t.text)
        raise ExprSyntaxError(f"expected a number, a field or a function, found {found}", t.pos)

    def call(self, name: Tok) -> Call:
        self.expect("op", "(")
        args: list[Node] = []
        kwargs: list[tuple[str, str, int]] = []
        if not self.at("op", ")"):
            while True:
                if self.tok.kind == "name" and self.toks[self.i + 1].kind == "op" and self.toks[self.i + 1].text == "=":
                    key = self.take()
                    self.take()
                    # A number or duration is taken as the value too: the compiler then names
                    # an unknown keyword (``w=1m``) instead of this saying the value is wrong.
                    val = self.take() if self.tok.kind in ("num", "dur") else None
                    val = val or self.expect("name", what=f"a value for {key.text}=")
                    kwargs.append((key.text, val.text, key.pos))
                else:
                    if kwargs:
                        raise ExprSyntaxError("positional argument after a keyword argument", self.tok.pos)
                    args.append(self.or_())
                if not self.at("op", ","):
                    break
                self.take()
        self.expect("op", ")", what="')' or ','")
        return Call(name.pos, name.text, tuple(args), tuple(kwargs))


@functools.lru_cache(maxsize=1024)
def parse(src: str) -> Node:
    """Parse an expression; raises ``ExprSyntaxError`` with the offending offset. The tree is
    immutable, so an expression parsed before gives the same one (every partition's engine
    compiles the same rules).

    >>> parse("gpu_temp > 85") is parse("gpu_temp > 85")
    True
    """
    return _Parser(src).parse()
