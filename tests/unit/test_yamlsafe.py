"""Bounded YAML: aliases, nesting, strings and size stop at a limit with a position, quickly."""

from __future__ import annotations

import time

import pytest
import yaml

from pipeline import yamlsafe


def laughs(levels: int = 9) -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for p, q in zip("abcdefghijk"[:levels - 1], "bcdefghijkl"[:levels - 1]):
        text += f"{q}: &{q} [" + ",".join([f"*{p}"] * 9) + "]\n"
    return text


@pytest.mark.parametrize("text, kind, line, col", [
    (laughs(), yamlsafe.ALIAS, 6, 8),
    ("a: &a [*a]\n", yamlsafe.ALIAS, 1, 8),
    ("a: &a {b: [1, *a]}\n", yamlsafe.ALIAS, 1, 15),
    ("x: &x 1\ny: [" + ", ".join(["*x"] * 101) + "]\n", yamlsafe.ALIAS, 2, 5 + 4 * 100),
    ("[" * 5000 + "]" * 5000, yamlsafe.DEPTH, 1, 65),
    ("k: " + "v" * 70_000, yamlsafe.STRING, 1, 4),
    ("# x\n" * 300_000, yamlsafe.SIZE, 1, 1),
])
def test_limits_stop_with_the_kind_and_position(text, kind, line, col):
    t0 = time.monotonic()
    with pytest.raises(yamlsafe.YamlLimitError) as e:
        yamlsafe.load(text)
    assert time.monotonic() - t0 < 2
    assert (e.value.kind, e.value.line, e.value.col) == (kind, line, col), str(e.value)
    assert isinstance(e.value, yaml.YAMLError)   # handlers of bad YAML handle these too


def test_plain_yaml_and_fair_aliases_load_as_safe_load_does():
    text = "base: &b {team: ml, tier: 1}\nrules:\n  - labels: *b\n  - labels: *b\n"
    assert yamlsafe.load(text) == yaml.safe_load(text)
    assert yamlsafe.compose("") is None
    with pytest.raises(yaml.YAMLError):
        yamlsafe.load("!!python/object/apply:os.system ['true']")


def test_expanded_nodes_count_what_aliases_stand_for():
    small = yamlsafe.Limits(max_nodes=50)
    yamlsafe.load("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\nb: [*a, *a, *a]\n", small)   # 10 + 3 x 10 + keys
    with pytest.raises(yamlsafe.YamlLimitError):
        yamlsafe.load("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\nb: [*a, *a, *a, *a, *a]\n", small)


def test_the_base_loader_can_be_chosen():
    assert yamlsafe.load("x: 0x10", base=yaml.BaseLoader) == {"x": "0x10"}
