"""Bounded JSON for producers (#36): deep nesting, huge integers and NaN cost only the value."""

from __future__ import annotations

import pytest

from producers import jsonsafe


def test_a_line_nested_too_deep_is_a_value_error_not_a_recursion_error():
    with pytest.raises(ValueError, match="nested"):
        jsonsafe.loads("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError):
        jsonsafe.loads(b"{" * 100_000)
    assert jsonsafe.loads('{"s": "' + "[" * 1000 + '"}') == {"s": "[" * 1000}  # brackets in strings do not nest


def test_huge_integers_and_non_standard_constants_read_as_null():
    assert jsonsafe.loads('{"a": ' + "9" * 5000 + ', "b": NaN, "c": -Infinity, "d": -12}') == {
        "a": None, "b": None, "c": None, "d": -12}


def test_a_document_keeps_everything_but_its_too_deep_values():
    doc, n = jsonsafe.loads_pruned('{"r": [1, ' + "[" * 10_000 + "]" * 10_000 + ', 3], "s": "x"}', max_depth=4)
    assert doc == {"r": [1, [[None]], 3], "s": "x"} and n == 1
    with pytest.raises(ValueError):
        jsonsafe.loads_pruned("[" * 10_000)
