import pytest

from pipeline.rules import expr as E
from pipeline.rules.compile import compile_expr
from pipeline.rules.context import CompileError
from pipeline.rules.diagnostics import (
    ARITY,
    BAD_DURATION,
    TYPE,
    UNKNOWN_BIT,
    UNKNOWN_FUNCTION,
    UNKNOWN_METRIC,
    UNKNOWN_MODEL,
)
from pipeline.rules.durations import parse_duration
from pipeline.rules.windows import WindowStore


def err(src):
    with pytest.raises((CompileError, E.ExprSyntaxError)) as e:
        compile_expr(src, WindowStore(1.0))
    return e.value


def test_precedence_and_shapes():
    n = E.parse("a or b and not c > 1 + 2 * 3")
    assert isinstance(n, E.Or) and isinstance(n.right, E.And) and isinstance(n.right.right, E.Not)
    cmp = n.right.right.operand
    assert isinstance(cmp, E.Compare) and isinstance(cmp.right, E.Arith) and cmp.right.op == "+"
    assert isinstance(E.parse("x has HW_THERMAL|SW_THERMAL"), E.Has)
    assert E.parse("xid in (48, 0x5f)").values == (48.0, 95.0)
    call = E.parse("peer_median(rate(f, 1m30s), by=host)")
    assert call.kwargs[0][:2] == ("by", "host") and call.args[0].args[1].seconds == 90


@pytest.mark.parametrize("src, pos", [("gpu_temp >", 10), ("(gpu_temp", 9), ("gpu_temp @ 3", 9),
                                       ("gpu_temp > 3 4", 13), ("f(a=b, c)", 7)])
def test_syntax_errors_point_at_the_character(src, pos):
    e = err(src)
    assert isinstance(e, E.ExprSyntaxError) and e.pos == pos


@pytest.mark.parametrize("src, code, words", [
    ("gpu_tmp > 85", UNKNOWN_METRIC, "did you mean 'gpu_temp'"),
    ("HW_THERMAL", TYPE, "clocks_event_reasons has HW_THERMAL"),
    ("increase(gpu_temp, 1m) > 1", TYPE, "needs a counter"),
    ("delta(ecc_sbe_volatile, 1m) > 1", TYPE, "increase()"),
    ("increase(ecc_sbe_volatile) > 1", ARITY, "takes 2 arguments"),
    ("increase(ecc_sbe_volatile, 5) > 1", BAD_DURATION, "duration"),
    ("gpu_temp > 1 and 5", TYPE, "needs a boolean"),
    ("gpu_temp > (sm_clock > 3)", TYPE, "cannot compare"),
    ("sm_clock has HW_THERMAL", TYPE, "bitmask"),
    ("clocks_event_reasons has HOT", UNKNOWN_BIT, "unknown clock-event bit"),
    ("inkrease(ecc_sbe_volatile, 1m) > 1", UNKNOWN_FUNCTION, "did you mean increase()"),
    ("score(thermal) > 0.9", UNKNOWN_MODEL, "unknown model"),
    ("gpu_temp + 5m > 3", TYPE, "duration"),
])
def test_type_errors_have_codes_and_helpful_words(src, code, words):
    e = err(src)
    assert isinstance(e, CompileError) and e.code == code and words in e.message


def test_no_python_reaches_the_evaluator():
    for src in ("__import__('os').system('id')", "gpu_temp.__class__", "[1][0]", "lambda: 1"):
        with pytest.raises((CompileError, E.ExprSyntaxError)):
            compile_expr(src, WindowStore(1.0))


def test_durations():
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25
    for bad in ("10 minutes", "", "5x", True):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_an_expression_parsed_again_is_the_same_tree_and_compiles_apart():
    src = "rate(nvlink_crc_flit_errors, 1m) >= 100 and gpu_temp > 80"
    assert E.parse(src) is E.parse(src)
    a, b = WindowStore(1.0), WindowStore(1.0)
    compile_expr(src, a), compile_expr(src, b)     # one rule set per engine: windows of its own
    assert a.panes and a.panes.keys() == b.panes.keys()
    assert all(a.panes[k] is not b.panes[k] for k in a.panes)
    for _ in range(2):                             # a mistake is not kept: it is reported each time
        with pytest.raises(E.ExprSyntaxError):
            E.parse("gpu_temp >")
