"""The rule functions' signatures: what each takes and returns, checked by the compiler before
anything is built. The implementations are in ``functions.py``, one per name, as Prometheus
keeps its functions' signatures apart from their implementations.

>>> FUNCTIONS["increase"].sig
'field, window'
>>> FUNCTIONS["raised"].result
'boolean'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Union, cast

from pipeline.catalog import CODE, COUNTER, Field
from pipeline.rules import diagnostics as D
from pipeline.rules import expr as E
from pipeline.rules.context import BOOL, NUM, CompileError, Fn

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
    """One rule function's signature, checked by ``Compiler.call`` before its implementation
    (``functions.BUILDERS[name]``) builds the evaluator."""

    name: str
    args: tuple[Arg, ...]
    sig: str  # the arguments as the arity diagnostic (E104) names them
    result: str  # NUM or BOOL
    kwargs: tuple[Kwarg, ...] = ()
    # When keyword arguments are checked: "first" (before the positional ones) or "last" (after
    # them). Of two mistakes in one call the first checked is reported, so each function keeps
    # the order its diagnostics have always had.
    kwargs_checked: Literal["first", "last"] = "first"

    @property
    def arity(self) -> tuple[int, int]:
        """The fewest and the most positional arguments (the same for every function today)."""
        return len(self.args), len(self.args)


# The checks of one field argument (Arg.check), run as soon as the field is read.


def not_a_counter(f: Field, node: E.Node) -> None:
    """baseline() learns a level: a counter only grows."""
    if f.kind == COUNTER:
        raise CompileError(
            f"baseline() of a counter is meaningless; use baseline of its rate via a rule on increase(), not {f.alias}",
            node.pos,
            D.TYPE,
        )


def a_code(f: Field, node: E.Node) -> None:
    """raised() reads a sticky code such as the XID gauge."""
    if f.kind != CODE:
        raise CompileError(
            f"raised() is for code fields such as xid (a sticky last value); {f.alias} is a "
            f"{f.kind} (use changed() or increase())",
            node.pos,
            D.TYPE,
        )


def the_xid(f: Field, node: E.Node) -> None:
    """xid_severity() looks its argument up in the XID catalogue."""
    if f.alias != "xid":
        raise CompileError(
            f"xid_severity() reads the XID catalogue: its argument is xid, not {f.alias}", node.pos, D.TYPE
        )


# Every rule function's signature, the table Compiler.call reads (docs/rules.md, "Functions", lists
# the same names; tests/unit/rules/test_functions_table.py keeps them equal, and each name to
# one implementation).
FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in [
        *(Function(name, (Arg(FIELD), Arg(DURATION)), "field, window", NUM) for name in WINDOW_FUNCS),
        Function("baseline", (Arg(FIELD, not_a_counter), Arg(DURATION)), "field, time constant", NUM),
        *(Function(name, (Arg(EXPR),), "expression", NUM, kwargs=(BY_HOST,)) for name in PEER_FUNCS),
        Function("absent", (Arg(FIELD), Arg(DURATION)), "field, duration", BOOL),
        Function("changed", (Arg(FIELD),), "field", BOOL),
        Function("raised", (Arg(FIELD, a_code),), "field", BOOL),
        Function("xid_severity", (Arg(FIELD, the_xid),), "xid", NUM),
        Function("abs", (Arg(EXPR),), "number", NUM, kwargs_checked="last"),
        Function("min", (Arg(EXPR), Arg(EXPR)), "number, number", NUM, kwargs_checked="last"),
        Function("max", (Arg(EXPR), Arg(EXPR)), "number, number", NUM, kwargs_checked="last"),
        # The model is looked up before the keyword arguments are: its diagnostics' order.
        Function("score", (Arg(MODEL),), "model name", NUM, kwargs_checked="last"),
    ]
}
ALL_FUNCS = sorted(FUNCTIONS)
