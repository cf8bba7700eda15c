"""YAML config files -> typed msgspec Structs, every mistake a ``ConfigError`` naming its key.

Foundation: the service, remediation and model configs share this one reading of a file
(bounded, through ``pipeline.yamlsafe``) and one translation of msgspec's validation errors
into the config key they are about (``kafka.port``, ``route.routes[2].group_wait``).

>>> import msgspec
>>> class Http(msgspec.Struct, forbid_unknown_fields=True):
...     ports: list[int] = []
>>> convert({"ports": [9108]}, Http).ports
[9108]
>>> convert({"ports": [9108, "eighty"]}, Http, "http", source="svc.yaml")
Traceback (most recent call last):
...
pipeline.errors.ConfigError: config key 'http.ports[1]': svc.yaml: Expected `int`, got `str` [GW100]
>>> convert({"prts": []}, Http, "http")
Traceback (most recent call last):
...
pipeline.errors.ConfigError: config key 'http.prts': unknown key [GW100]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec
import yaml

from pipeline import yamlsafe
from pipeline.errors import ConfigError

T = TypeVar("T")

TOP = "(top level)"  # the key of a mistake in the document as a whole
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")
_AT = re.compile(r" - at `\$(.*)`$")


def key_of(err: msgspec.ValidationError, prefix: str = "") -> tuple[str, str]:
    """The config key a validation error is about (under ``prefix``), and what is wrong there.

    msgspec writes the place as ``$.a.b[2].c``; a dict value's place as ``[...]``, which names
    no key, so it is left out (the key is that of the dict).
    """
    msg = str(err)
    at = _AT.search(msg)
    path = at.group(1).replace("[...]", "") if at else ""
    what = msg[: at.start()] if at else msg
    unknown = _UNKNOWN.fullmatch(what)
    if unknown:
        path, what = f"{path}.{unknown.group(1)}", "unknown key"
    path = path.lstrip(".")
    if prefix and path and not path.startswith("["):
        path = f"{prefix}.{path}"
    elif prefix:
        path = prefix + path
    return path or TOP, what


@overload
def convert(data: Any, typ: type[T], prefix: str = "", *, source: str | None = None) -> T: ...
@overload
def convert(data: Any, typ: Any, prefix: str = "", *, source: str | None = None) -> Any: ...


def convert(data: Any, typ: Any, prefix: str = "", *, source: str | None = None) -> Any:
    """``msgspec.convert(data, typ)``; a ``ConfigError`` naming the key (under ``prefix``) and,
    when given, the file (``source``) instead of msgspec's error."""
    try:
        return msgspec.convert(data, typ)
    except msgspec.ValidationError as e:
        key, what = key_of(e, prefix)
        raise ConfigError(key, f"{source}: {what}" if source else what) from None


def read_text(
    path: str | Path, limits: yamlsafe.Limits = yamlsafe.DEFAULT, *, key: str = "--config", yaml_key: str = "(yaml)"
) -> str:
    """A config file's text, reading no more than ``limits`` allows into memory; ``ConfigError``
    under ``key`` when it cannot be read, under ``yaml_key`` when it is not UTF-8."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(limits.max_bytes + 1)  # one byte over: yamlsafe then says it is too big
    except OSError as e:
        raise ConfigError(key, f"cannot read {p}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(yaml_key, f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None


class _UniqueKeys(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping: PyYAML keeps the last, so the
    value a reviewer read first would silently not be the one used. Keys a merge (``<<: *base``)
    brings in may still be overridden."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for k, _ in node.value:
                if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(k)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {str(key)[:60]!r} given twice in one mapping", k.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(
    text: str, limits: yamlsafe.Limits = yamlsafe.DEFAULT, *, source: str = "<config>", key: str = "(yaml)"
) -> Any:
    """One YAML document through ``pipeline.yamlsafe``; every problem a ``ConfigError`` under
    ``key`` naming ``source`` and the line and column (a limit crossed, a syntax error, a value
    its tag cannot build: ``!!bool maybe``, a key given twice).

    >>> parse_yaml("a: !!bool maybe", source="c.yaml")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: config key '(yaml)': c.yaml:1:4: not valid YAML: cannot read a value: 'maybe' is not a YAML bool [GW100]
    """
    try:
        return yamlsafe.load(text, limits, base=_UniqueKeys)
    except yamlsafe.YamlLimitError as e:
        raise ConfigError(key, f"{source}:{e.line}:{e.col}: {e.message}") from None
    except yaml.YAMLError as e:
        problem, line, col = yamlsafe.syntax_error(e, text)
        raise ConfigError(key, f"{source}:{line}:{col}: not valid YAML: {problem}") from None
    except (ValueError, OverflowError) as e:  # a scalar PyYAML cannot build: an int of 5000 digits
        raise ConfigError(key, f"{source}: cannot read a value ({str(e).split(':')[0]})") from None


def load_yaml(
    path: str | Path, limits: yamlsafe.Limits = yamlsafe.DEFAULT, *, key: str = "--config", yaml_key: str = "(yaml)"
) -> Any:
    """A YAML file's document (``read_text`` and ``parse_yaml``)."""
    return parse_yaml(read_text(path, limits, key=key, yaml_key=yaml_key), limits, source=str(path), key=yaml_key)


def load(path: str | Path, typ: type[T], limits: yamlsafe.Limits = yamlsafe.DEFAULT) -> T:
    """A YAML file as ``typ`` (an empty file is an empty mapping); ``ConfigError`` naming the
    key and the file on any mistake."""
    data = load_yaml(path, limits)
    return convert({} if data is None else data, typ, source=str(path))
