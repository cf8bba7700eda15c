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
pipeline.errors.ConfigError: config key 'http.prts': unknown key; did you mean 'ports'? [GW100]

``located`` adds the line and column in the file of the key or value an error is about:

>>> text = "ports: [9108]\\nprts: []\\n"
>>> try:
...     convert(yaml.safe_load(text), Http)
... except ConfigError as e:
...     print(located(e, text, "svc.yaml"))
config key 'prts': svc.yaml:2:1: unknown key; did you mean 'ports'? [GW100]
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec
import msgspec.inspect as mi
import yaml

from pipeline import yamlsafe
from pipeline.errors import ConfigError

T = TypeVar("T")

TOP = "(top level)"  # the key of a mistake in the document as a whole
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")
_AT = re.compile(r" - at `\$(.*)`$")
UNKNOWN_KEY = "unknown key"  # how every typed config's message about an unknown key begins


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
        path, what = f"{path}.{unknown.group(1)}", UNKNOWN_KEY
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
        if what == UNKNOWN_KEY:
            what += _hint(e, typ, data)
        raise ConfigError(key, f"{source}: {what}" if source else what) from None


def closest(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known key nearest ``name``, else the known keys.

    >>> closest("bootstrp", ["bootstrap", "prefix"]), closest("zzz", ["b", "a"])
    ("; did you mean 'bootstrap'?", ' (known: a, b)')
    """
    names = sorted(set(known))
    hint = difflib.get_close_matches(name, names, n=1)
    if hint:
        return f"; did you mean {hint[0]!r}?"
    return f" (known: {', '.join(names)})" if names else ""


_RAW_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+|\.\.\.)\]")


def _hint(err: msgspec.ValidationError, typ: Any, data: Any) -> str:
    """What follows "unknown key" in ``err``'s message: the nearest key the mapping it is in may
    hold (``typ`` walked along msgspec's path; ``data``, to tell a tagged union's members apart)."""
    msg = str(err)
    at = _AT.search(msg)
    unknown = _UNKNOWN.fullmatch(msg[: at.start()] if at else msg)
    if unknown is None:
        return ""
    try:
        types = _members(mi.type_info(typ))
        for m in _RAW_STEP.finditer(at.group(1) if at else ""):
            name, index = m.groups()
            nxt: list[Any] = []
            for t in _struct_of(types, data):
                if name is not None and isinstance(t, mi.StructType):
                    nxt += [f.type for f in t.fields if f.encode_name == name]
                elif index == "..." and isinstance(t, mi.DictType):
                    nxt.append(t.value_type)
                elif index is not None and index != "..." and isinstance(t, (mi.ListType, mi.VarTupleType)):
                    nxt.append(t.item_type)
            types = [u for t in nxt for u in _members(t)]
            if name is not None:
                data = data.get(name) if isinstance(data, dict) else None
            elif index != "..." and isinstance(data, list) and int(index) < len(data):
                data = data[int(index)]
            else:
                data = None
        known = [
            n
            for t in _struct_of(types, data)
            if isinstance(t, mi.StructType)
            for n in [f.encode_name for f in t.fields] + ([t.tag_field] if t.tag_field else [])
        ]
    except Exception:  # noqa: BLE001 - a hint is a nicety: never a crash instead of the error
        return ""
    return closest(unknown.group(1), known) if known else ""


def _members(t: Any) -> list[Any]:
    """A type's alternatives: the members of a union, the type inside ``Annotated``."""
    if isinstance(t, mi.UnionType):
        return [u for m in t.types for u in _members(m)]
    if isinstance(t, mi.Metadata):
        return _members(t.type)
    return [t]


def _struct_of(types: list[Any], data: Any) -> list[Any]:
    """``types`` less the tagged structs whose tag is not the one ``data`` gives."""
    if not isinstance(data, dict):
        return types
    picked = [t for t in types if not (isinstance(t, mi.StructType) and t.tag_field and data.get(t.tag_field) != t.tag)]
    return picked or types


_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def node_at(text: str, key: str, limits: yamlsafe.Limits = yamlsafe.DEFAULT) -> tuple[Any, Any] | None:
    """(the key node, the value node) of the YAML document ``text`` at a config ``key``
    (``route.routes[0].matchers[1]``; the key node is None for a list item), or None when the
    document does not hold that key."""
    try:
        node = yamlsafe.compose(text, limits)
    except yaml.YAMLError:
        return None
    key_node: Any = None
    pos = 0
    while node is not None and pos < len(key):
        m = _STEP.match(key, pos)
        if m is None:
            return None
        pos = m.end()
        if m.group(2) is not None:
            i = int(m.group(2))
            key_node = None
            node = node.value[i] if isinstance(node, yaml.SequenceNode) and i < len(node.value) else None
        elif isinstance(node, yaml.MappingNode):
            key_node, node = next(
                ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == m.group(1)),
                (None, None),
            )
        else:
            node = None
    return None if node is None else (key_node, node)


def locate(
    text: str, key: str, limits: yamlsafe.Limits = yamlsafe.DEFAULT, *, key_only: bool = False
) -> tuple[int, int] | None:
    """(line, column), from 1, of the YAML value at ``key`` (with ``key_only``: of the key itself,
    where the document gives one), or None when the document does not hold that key.

    >>> locate("kafka:\\n  port: x\\n", "kafka.port"), locate("kafka:\\n  port: x\\n", "kafka.port", key_only=True)
    ((2, 9), (2, 3))
    """
    found = node_at(text, key, limits)
    if found is None:
        return None
    node = found[0] if key_only and found[0] is not None else found[1]
    return node.start_mark.line + 1, node.start_mark.column + 1


def located(
    err: ConfigError,
    text: str,
    source: str,
    limits: yamlsafe.Limits = yamlsafe.DEFAULT,
    *,
    key_only: bool | None = None,
) -> ConfigError:
    """``err`` with ``source:line:col`` of the value its key names (of the key itself for an
    unknown key, or with ``key_only``), when the file holds that key and the message does not
    already give a place in the file. ``err`` itself otherwise."""
    message = getattr(err, "reason", None)
    if not isinstance(message, str):
        prefix = f"config key {err.key!r}: "
        message = err.message[len(prefix) :] if err.message.startswith(prefix) else err.message
    if message.startswith(f"{source}: "):  # the file, but not where in it (``convert``'s ``source``)
        message = message[len(source) + 2 :]
    elif message.startswith(source):
        return err
    if key_only is None:
        key_only = message.startswith(UNKNOWN_KEY)
    where = locate(text, err.key, limits, key_only=key_only)
    if where is None:
        return err
    return ConfigError(err.key, f"{source}:{where[0]}:{where[1]}: {message}")


def read_text(
    path: str | Path, limits: yamlsafe.Limits = yamlsafe.DEFAULT, *, key: str = "--config", yaml_key: str = "(yaml)"
) -> str:
    """A config file's text, reading no more than ``limits`` allows into memory; ``ConfigError``
    under ``key`` when it cannot be read, under ``yaml_key`` when it is not UTF-8."""
    p = Path(path)
    try:
        # Opened without blocking and checked for a regular file: open() of a FIFO waits for a
        # writer, so ``serve --config FIFO`` would hang before saying anything.
        with os.fdopen(yamlsafe.open_regular(p), "rb") as fh:
            raw = fh.read(limits.max_bytes + 1)  # one byte over: yamlsafe then says it is too big
    except OSError as e:
        raise ConfigError(key, f"cannot read {p}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(yaml_key, f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None


# Numbers YAML 1.1 reads other than a reviewer does: octal ``010`` (8), sexagesimal ``1:30`` (90,
# or was it 1h30m?). A typed config refuses them where they stand, so ``group_wait: 1:30`` is not
# 90 s without a word and ``job: 0123`` is not job 83; quoted, they are the text written.
_NOT_AS_READ = re.compile(r"[-+]?0[0-9_]+|[^:]*:.*")
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _NotAsRead(yaml.constructor.ConstructorError):
    """An octal or sexagesimal number; ``key``: the mapping key it is the value of, if any."""

    def __init__(self, node: Any, read: Any, key: str | None) -> None:
        self.key = key
        self.reason = (
            f"YAML 1.1 reads {node.value[:40]} as {read!r}: write the number meant, a duration with its"
            " units (1m30s, 1h30m), or quote it as text"
        )
        super().__init__(None, None, self.reason, node.start_mark)


class _UniqueKeys(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping (PyYAML keeps the last, so the
    value a reviewer read first would silently not be the one used) and an octal or sexagesimal
    number (``_NOT_AS_READ``). Keys a merge (``<<: *base``) brings in may still be overridden."""

    def _number(self, node: Any, key: str | None = None) -> Any:
        build = super().construct_yaml_int if node.tag == _NUMBER_TAGS[0] else super().construct_yaml_float
        value = build(node)
        if _NOT_AS_READ.fullmatch(node.value):
            raise _NotAsRead(node, value, key)
        return value

    construct_yaml_int = construct_yaml_float = _number

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for k, v in node.value:
                if (
                    isinstance(v, yaml.ScalarNode)
                    and v.tag in _NUMBER_TAGS
                    and isinstance(k, yaml.ScalarNode)
                    and _NOT_AS_READ.fullmatch(v.value)
                ):
                    self._number(v, str(k.value)[:60])  # refused naming its key, as a value's mistakes are
                if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(k)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {str(key)[:60]!r} given twice in one mapping", k.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


_UniqueKeys.add_constructor("tag:yaml.org,2002:int", _UniqueKeys.construct_yaml_int)
_UniqueKeys.add_constructor("tag:yaml.org,2002:float", _UniqueKeys.construct_yaml_float)


def parse_yaml(
    text: str, limits: yamlsafe.Limits = yamlsafe.DEFAULT, *, source: str = "<config>", key: str = "(yaml)"
) -> Any:
    """One YAML document through ``pipeline.yamlsafe``; every problem a ``ConfigError`` under
    ``key`` naming ``source`` and the line and column (a limit crossed, a syntax error, a value
    its tag cannot build: ``!!bool maybe``, a key given twice, an octal or sexagesimal number).

    >>> parse_yaml("a: !!bool maybe", source="c.yaml")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: config key '(yaml)': c.yaml:1:4: not valid YAML: cannot read a value: 'maybe' is not a YAML bool [GW100]
    >>> parse_yaml("wait: 1:30", source="c.yaml")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: config key 'wait': c.yaml:1:7: YAML 1.1 reads 1:30 as 90: write the number meant, a duration with its units (1m30s, 1h30m), or quote it as text [GW100]
    """
    try:
        return yamlsafe.load(text, limits, base=_UniqueKeys)
    except yamlsafe.YamlLimitError as e:
        raise ConfigError(key, f"{source}:{e.line}:{e.col}: {e.message}") from None
    except _NotAsRead as e:
        _, line, col = yamlsafe.syntax_error(e, text)
        raise ConfigError(e.key or key, f"{source}:{line}:{col}: {e.reason}") from None
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
