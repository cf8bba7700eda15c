"""Fixtures of these tests; the helpers they share are in factories.py beside this file."""

import textwrap

import pytest

from pipeline.rules import load_rules


@pytest.fixture
def make_rules(tmp_path):
    """Write YAML rule text to a file and load it; fail the test on any error."""
    def make(text: str, name: str = "r.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        rs, diags = load_rules([path])
        assert rs is not None, [str(d) for d in diags]
        return rs
    return make
