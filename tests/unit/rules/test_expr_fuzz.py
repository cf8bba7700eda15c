"""Fuzzing the rule expression parser and compiler: any string gives a compiled expression or a
coded error with a position inside the string, never another exception (RecursionError,
OverflowError, IndexError, ...).

Each test runs ``GPUWARDEN_FUZZ_EXAMPLES`` examples (300 by default: a few seconds in `make
test`). A longer hunt, for example after a grammar change::

    GPUWARDEN_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/unit/rules/test_expr_fuzz.py -p no:cacheprovider
"""

from __future__ import annotations

import os
import re

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.catalog import FIELDS
from pipeline.rules import diagnostics as D
from pipeline.rules import expr as E
from pipeline.rules import load_rules
from pipeline.rules.compile import compile_expr
from pipeline.rules.context import CompileError
from pipeline.rules.signatures import ALL_FUNCS
from pipeline.rules.windows import WindowStore

EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300"))
# No example database: every run draws afresh, so a long hunt and `make test` never share examples.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CODES = {v for k, v in vars(D).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[REW]\d{3}", v)}

FIELD_NAMES = [f.alias for f in FIELDS.fields][:40] + ["gpu_tmp", "xid", "clocks_event_reasons", "nope"]
BITS = list(FIELDS.bits) + ["HW_HOT"]
FUNCS = ALL_FUNCS + ["inkrease", "eval", "__import__"]
NUMBERS = st.one_of(
    st.integers(0, 10 ** 6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, min_value=0).map(repr),
    st.sampled_from(["1e400", "0x" + "f" * 300, "9" * 400, ".5", "1.", "0xFF", "1e-400", "0x0"]),
)
DURATIONS = st.one_of(
    st.tuples(st.integers(0, 10 ** 4), st.sampled_from(["ms", "s", "m", "h", "d"])).map(lambda t: f"{t[0]}{t[1]}"),
    st.sampled_from(["9" * 400 + "s", "1m30s", "0s", "367d", "1.5h", "0.0001ms"]),
)


def check(src: str) -> None:
    try:
        compile_expr(src, WindowStore(1.0), {"thermal"})
    except (E.ExprSyntaxError, CompileError) as e:
        assert e.code in CODES, e.code
        assert isinstance(e.pos, int) and 0 <= e.pos <= max(len(src), E.MAX_CHARS), (e.pos, len(src))
        assert isinstance(e.message, str) and e.message


def expressions() -> st.SearchStrategy[str]:
    """Expressions built from the grammar, mostly well-formed, some very deep or very long."""
    leaf = st.one_of(st.sampled_from(FIELD_NAMES), NUMBERS, DURATIONS)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "==", "!=", "<", "<=", ">", ">=", "and", "or"]),
                      inner).map(" ".join),
            inner.map(lambda x: f"not {x}"),
            inner.map(lambda x: f"-{x}"),
            inner.map(lambda x: f"({x})"),
            st.tuples(st.sampled_from(FUNCS), st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
            st.tuples(st.sampled_from(FUNCS), inner).map(lambda t: f"{t[0]}({t[1]}, by=host)"),
            st.tuples(inner, st.lists(st.sampled_from(BITS), min_size=1, max_size=4))
              .map(lambda t: f"{t[0]} has {'|'.join(t[1])}"),
            st.tuples(inner, st.lists(NUMBERS, min_size=1, max_size=4)).map(lambda t: f"{t[0]} in ({', '.join(t[1])})"),
        )

    tree = st.recursive(leaf, extend, max_leaves=40)
    # Shapes that broke the old parser: very deep nesting and very long chains.
    deep = st.tuples(st.integers(0, 400), st.sampled_from(["(", "not ", "-", "abs(", "- "]), tree).map(
        lambda t: t[1] * t[0] + t[2] + (")" * t[0] if "(" in t[1] else ""))
    chain = st.tuples(tree, st.sampled_from([" or ", " and ", " + ", " * "]), st.integers(1, 700)).map(
        lambda t: t[1].join([t[0]] * t[2]))
    return st.one_of(tree, deep, chain)


@FUZZ
@given(st.one_of(st.text(max_size=200),
                 st.text(alphabet="()+-*/<>=!,|. \t\n0123456789abcdefxsmhd_ORANDNOT", max_size=300)))
def test_any_text_compiles_or_is_a_coded_error(src):
    check(src)


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(["(", ")", ",", "|", "=", "==", "<", ">=", "+", "-", "*", "/", "and",
                                           "or", "not", "has", "in", "by=host"]),
                          st.sampled_from(FIELD_NAMES + BITS + FUNCS), NUMBERS, DURATIONS), max_size=80))
def test_any_token_soup_compiles_or_is_a_coded_error(tokens):
    check(" ".join(tokens))


@FUZZ
@given(expressions())
def test_grammar_built_expressions_compile_or_are_coded_errors(src):
    check(src)


@settings(FUZZ, max_examples=max(20, EXAMPLES // 5))
@given(expressions())
def test_a_fuzzed_condition_in_a_rule_file_is_a_diagnostic_never_an_exception(tmp_path_factory, src):
    path = tmp_path_factory.getbasetemp() / "fuzz.yaml"
    path.write_text(yaml.safe_dump({"rules": [{"name": "fuzz", "fault": "thermal_fuzz", "severity": "info",
                                               "condition": src}]}))
    rs, diags = load_rules([path])
    assert all(d.code in CODES and d.code != D.INTERNAL for d in diags), [str(d) for d in diags]
    assert (rs is None) == any(d.is_error for d in diags)
