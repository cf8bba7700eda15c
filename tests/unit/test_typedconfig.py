"""YAML -> typed config (pipeline/typedconfig.py): every mistake a ConfigError naming key and file."""

from __future__ import annotations

import msgspec
import pytest

from pipeline import yamlsafe
from pipeline.errors import ConfigError
from pipeline.typedconfig import TOP, convert, load, load_yaml


class Leaf(msgspec.Struct, forbid_unknown_fields=True):
    port: int = 1


class Doc(msgspec.Struct, forbid_unknown_fields=True):
    a: dict[str, Leaf] = {}
    b: list[Leaf] = []
    name: str = "x"


@pytest.mark.parametrize("data, prefix, key, what", [
    ({"b": [{}, {}, {"port": "x"}]}, "", "b[2].port", "Expected `int`, got `str`"),
    ({"b": [{"prt": 1}]}, "", "b[0].prt", "unknown key; did you mean 'port'?"),
    ({"a": {"k": {"port": []}}}, "", "a.port", "Expected `int`, got `array`"),
    ({"nme": 1}, "", "nme", "unknown key; did you mean 'name'?"),
    ({"name": 1}, "svc", "svc.name", "Expected `str`, got `int`"),
    ([1], "", TOP, "Expected `object`, got `array`"),
    ([1], "actions.x", "actions.x", "Expected `object`, got `array`"),
])
def test_validation_errors_name_the_key(data, prefix, key, what):
    with pytest.raises(ConfigError) as e:
        convert(data, Doc, prefix, source="f.yaml")
    assert e.value.key == key and e.value.message.endswith(f"f.yaml: {what}"), str(e.value)


def test_a_file_loads_and_its_mistakes_name_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("b: [{port: 7}]\n")
    assert load(p, Doc).b[0].port == 7
    p.write_text("")
    assert load(p, Doc) == Doc()
    p.write_text("b: [{port: seven}]\n")
    with pytest.raises(ConfigError, match=f"'b\\[0\\].port': {p}: Expected"):
        load(p, Doc)


@pytest.mark.parametrize("text, key, where", [
    ("b: [", "(yaml)", "not valid YAML"),
    ("a: " + "[" * 80 + "]" * 80 + "\n", "(yaml)", ":1:"),
    ("n: " + "9" * 5000 + "\n", "(yaml)", "cannot read a value"),
    ("a: !!python/object/apply:os.system ['true']\n", "(yaml)", "not valid YAML"),
])
def test_bad_yaml_is_a_config_error(tmp_path, text, key, where):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_yaml(p)
    assert e.value.key == key and where in e.value.message and str(p) in e.value.message, str(e.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read") as e:
        load_yaml(tmp_path / "missing.yaml", key="(file)")
    assert e.value.key == "(file)"
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"a: \xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_yaml(p)
    p.write_text("a: b\n" * 100)
    with pytest.raises(ConfigError, match="limit is 64"):
        load_yaml(p, yamlsafe.Limits(max_bytes=64))
