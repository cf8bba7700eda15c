"""The rule expression language: tokens, a recursive-descent parser and the syntax tree.

Our own grammar, never Python's ``eval``/``ast``: an expression can only name catalog fields,
numbers, durations, clock-event bits and the functions in ``functions.py``.

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

>>> parse("clocks_event_reasons has HW_THERMAL|SW_THERMAL and sm_clock < 0.7 * baseline(sm_clock, 30m)")
And(left=Has(...), right=Compare(...))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.rules.durations import parse_duration


class ExprSyntaxError(ValueError):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


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
    kwargs: tuple[tuple[str, str, int], ...] = ()   # (key, value, pos)


@dataclass(frozen=True, repr=False)
class Neg(Node):
    operand: Node | None = None


@dataclass(frozen=True, repr=False)
class Arith(Node):
    op: str = "+"
    left: Node | None = None
    right: Node | None = None


@dataclass(frozen=True, repr=False)
class Compare(Node):
    op: str = "=="
    left: Node | None = None
    right: Node | None = None


@dataclass(frozen=True, repr=False)
class Has(Node):
    operand: Node | None = None
    bits: tuple[tuple[str, int], ...] = ()   # (name, pos)


@dataclass(frozen=True, repr=False)
class In(Node):
    operand: Node | None = None
    values: tuple[float, ...] = ()


@dataclass(frozen=True, repr=False)
class Not(Node):
    operand: Node | None = None


@dataclass(frozen=True, repr=False)
class And(Node):
    left: Node | None = None
    right: Node | None = None

    def __repr__(self) -> str:
        return f"And(left={self.left!r}, right={self.right!r})"


@dataclass(frozen=True, repr=False)
class Or(Node):
    left: Node | None = None
    right: Node | None = None


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<dur>\d+(?:\.\d+)?(?:ms|s|m|h|d)(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))*(?![A-Za-z0-9_]))
  | (?P<num>0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|[<>+\-*/(),|=])
""", re.VERBOSE)
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


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks = tokenize(src)
        self.i = 0

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
        return node

    def or_(self) -> Node:
        left = self.and_()
        while self.at("kw", "or"):
            pos = self.take().pos
            left = Or(pos, left, self.and_())
        return left

    def and_(self) -> Node:
        left = self.not_()
        while self.at("kw", "and"):
            pos = self.take().pos
            left = And(pos, left, self.not_())
        return left

    def not_(self) -> Node:
        if self.at("kw", "not"):
            pos = self.take().pos
            return Not(pos, self.not_())
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
        t = self.expect("num", what="a number")
        v = float(int(t.text, 16)) if t.text.lower().startswith("0x") else float(t.text)
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
            return Neg(pos, self.unary())
        return self.atom()

    def atom(self) -> Node:
        t = self.tok
        if t.kind == "num":
            self.take()
            return Num(t.pos, float(int(t.text, 16)) if t.text.lower().startswith("0x") else float(t.text))
        if t.kind == "dur":
            self.take()
            return Dur(t.pos, parse_duration(t.text), t.text)
        if t.kind == "name":
            self.take()
            if self.at("op", "("):
                return self.call(t)
            return Name(t.pos, t.text)
        if self.at("op", "("):
            self.take()
            node = self.or_()
            self.expect("op", ")", what="')'")
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
                    val = self.expect("name", what=f"a value for {key.text}=")
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


def parse(src: str) -> Node:
    """Parse an expression; raises ``ExprSyntaxError`` with the offending offset."""
    return _Parser(src).parse()
