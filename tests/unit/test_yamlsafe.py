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


def test_a_text_read_again_is_not_scanned_again(monkeypatch):
    text = "rules:\n  - name: a\n    severity: warning\n"
    tree, doc = yamlsafe.compose(text), yamlsafe.load(text)
    monkeypatch.setattr(yamlsafe, "_loader", lambda *a: pytest.fail("scanned again"))
    assert yamlsafe.compose(text) is tree                   # the one tree, which callers only read
    assert yamlsafe.load(text) == doc == yaml.safe_load(text)


def test_a_document_read_again_is_a_copy_the_caller_may_change():
    text = "base: &b {team: ml}\nrules: [{labels: *b}, {labels: *b}]\n"
    for _ in range(3):   # read first, then kept: each time the caller's own to change
        got = yamlsafe.load(text)
        assert got == yaml.safe_load(text)
        assert got["rules"][0]["labels"] is got["rules"][1]["labels"]   # an alias shares, as in safe_load
        got["rules"][0]["labels"]["team"] = "changed"


def test_other_limits_or_loaders_read_a_text_anew():
    text = "x: 0x10\n"
    assert yamlsafe.load(text) == {"x": 16} and yamlsafe.load(text, base=yaml.BaseLoader) == {"x": "0x10"}
    small = yamlsafe.Limits(max_nodes=2)
    yamlsafe.compose(text)
    with pytest.raises(yamlsafe.YamlLimitError):            # kept under the default limits, not these
        yamlsafe.compose(text, small)


def test_what_failed_is_not_kept_and_fails_again():
    for _ in range(2):
        with pytest.raises(yaml.YAMLError):
            yamlsafe.compose("a: [1, 2")
        with pytest.raises(yamlsafe.YamlLimitError):
            yamlsafe.load("a: &a [*a]\n")


def test_what_is_kept_stays_within_its_node_budget(monkeypatch):
    monkeypatch.setattr(yamlsafe, "CACHE_NODES", 100)
    monkeypatch.setattr(yamlsafe, "_cache", type(yamlsafe._cache)())
    monkeypatch.setattr(yamlsafe, "_cached_nodes", 0)
    texts = [f"k{i}: [{', '.join(str(j) for j in range(20))}]\n" for i in range(10)]   # 24 nodes each
    for t in texts:
        yamlsafe.compose(t)
        assert yamlsafe._cached_nodes == sum(n for _, n in yamlsafe._cache.values()) <= 100
    kept = [t for t in texts if yamlsafe._cached("tree", t, yamlsafe.DEFAULT, yaml.SafeLoader)[1]]
    assert kept == texts[-4:]                                # the most recently read
    big = "[" + ", ".join(["1"] * 200) + "]"
    yamlsafe.compose(big)                                    # over the whole budget: never kept
    assert not yamlsafe._cached("tree", big, yamlsafe.DEFAULT, yaml.SafeLoader)[1]
    assert yamlsafe._cached("tree", texts[-1], yamlsafe.DEFAULT, yaml.SafeLoader)[1]


@pytest.mark.parametrize("text, line, col, words", [
    ("a: !!bool maybe\n", 1, 4, "'maybe' is not a YAML bool"),          # was KeyError
    ("a: [1, !!int '']\n", 1, 8, "'' is not a YAML int"),                # was IndexError
    ("a: !!float ''\n", 1, 4, "is not a YAML float"),                    # was IndexError
    ("a: !!timestamp soon\n", 1, 4, "is not a YAML timestamp"),          # was AttributeError
    ("a:\n  b: " + "9" * 5000 + "\n", 2, 6, "4300 digits"),                # was ValueError
])
def test_a_scalar_its_tag_cannot_build_is_a_yaml_error_with_its_position(text, line, col, words):
    with pytest.raises(yaml.YAMLError) as e:
        yamlsafe.load(text)
    assert words in str(e.value) and yamlsafe.syntax_error(e.value)[1:] == (line, col), str(e.value)


@pytest.mark.parametrize("text, line, col", [('a: "x\\ud800"\n', 1, 4), ('["ok", {"\\udfff": 1}]\n', 1, 9)])
def test_a_lone_surrogate_is_a_yaml_error_not_a_string_no_writer_can_encode(text, line, col):
    for read in (yamlsafe.load, yamlsafe.compose):
        with pytest.raises(yaml.YAMLError, match="lone surrogate") as e:
            read(text)
        assert yamlsafe.syntax_error(e.value)[1:] == (line, col)
    assert yamlsafe.load('a: "\\U0001F600 é"\n') == {"a": "\U0001F600 é"}


@pytest.mark.parametrize("read", [yamlsafe.load, lambda t: yamlsafe.compose(t).value[0][1].value])
def test_an_escaped_surrogate_pair_is_the_one_character_it_spells(read):
    # YAML 1.2 reads JSON, whose only spelling of a character past U+FFFF in \\u escapes is a
    # UTF-16 surrogate pair: "\\ud83d\\ude00" is U+1F600, not two lone surrogates.
    got = read('a: "x \\ud83d\\ude00 y"\n')
    assert (got["a"] if isinstance(got, dict) else got) == "x \U0001F600 y"
    assert yamlsafe.load('{"\\ud83d\\ude00": 1}\n') == {"\U0001F600": 1}


@pytest.mark.parametrize("text", ['a: "\\ude00\\ud83d"\n', 'a: "\\ud83d x \\ude00"\n', 'a: "\\ud83d\\ud83d"\n'])
def test_surrogates_that_do_not_pair_stay_refused(text):
    with pytest.raises(yaml.YAMLError, match="lone surrogate"):
        yamlsafe.load(text)
