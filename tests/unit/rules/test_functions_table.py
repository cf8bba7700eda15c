"""The rule functions' table (pipeline.rules.signatures.FUNCTIONS) against docs/rules.md and the compiler."""

import re
from pathlib import Path

import pytest

from pipeline.rules.compile import compile_expr
from pipeline.rules.context import BOOL, NUM, CompileError
from pipeline.rules.diagnostics import ARITY, UNKNOWN_FUNCTION
from pipeline.rules.signatures import ALL_FUNCS, FUNCTIONS
from pipeline.rules.windows import WindowStore

DOC = Path(__file__).resolve().parents[3] / "docs" / "rules.md"


def documented_functions() -> set[str]:
    """The names in the first column of docs/rules.md's "### Functions" table."""
    text = DOC.read_text()
    section = text.split("### Functions", 1)[1].split("\n#", 1)[0]
    names = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names |= {m.group(1) for m in re.finditer(r"`([a-z_]+)\b[^`]*`", first)}
    return names


def test_the_table_and_the_docs_list_the_same_functions():
    assert documented_functions() == set(FUNCTIONS)


def test_all_funcs_is_the_table():
    assert ALL_FUNCS == sorted(FUNCTIONS)
    assert all(name == spec.name for name, spec in FUNCTIONS.items())
    assert {spec.result for spec in FUNCTIONS.values()} <= {NUM, BOOL}


def test_every_signature_has_one_implementation():
    from pipeline.rules.functions import BUILDERS

    assert set(BUILDERS) == set(FUNCTIONS)


def test_an_unknown_function_lists_the_known_names():
    with pytest.raises(CompileError) as e:
        compile_expr("frobnicate(gpu_temp) > 1", WindowStore(1.0))
    assert e.value.code == UNKNOWN_FUNCTION and e.value.pos == 0
    for name in FUNCTIONS:
        assert f"{name}()" in e.value.message


def test_a_near_miss_suggests_a_name_from_the_table():
    with pytest.raises(CompileError) as e:
        compile_expr("peer_medain(gpu_temp) > 1", WindowStore(1.0))
    assert e.value.code == UNKNOWN_FUNCTION and "did you mean peer_median()" in e.value.message
    assert "known:" not in e.value.message


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_arity_comes_from_the_table(name):
    spec = FUNCTIONS[name]
    lo, hi = spec.arity
    args = ", ".join(["gpu_temp"] * (hi + 1))
    with pytest.raises(CompileError) as e:
        compile_expr(f"{name}({args}) > 1", WindowStore(1.0), {"thermal"})
    assert e.value.code == ARITY and e.value.pos == 0
    assert e.value.message == (f"{name}() takes {lo} argument{'s' * (hi != 1)} ({spec.sig}), got {hi + 1}")


@pytest.mark.parametrize("expr", ["abs(gpu_temp, by=host)", "min(gpu_temp, power, by=host)",
                                  "max(gpu_temp, power, by=gpu)"])
def test_a_keyword_a_function_does_not_take_is_an_error_not_ignored(expr):
    # abs/min/max once accepted any keyword and ignored it: `abs(x, by=host)` read as a peer
    # comparison and was none.
    with pytest.raises(CompileError) as e:
        compile_expr(expr, WindowStore(1.0))
    assert e.value.code == ARITY and "has no argument" in str(e.value)
