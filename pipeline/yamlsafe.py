"""Reading YAML that someone else wrote: bounded size, nesting, strings and aliases.

PyYAML's safe loader already refuses tags that build objects, but not input that is merely
huge. A few hundred bytes of anchors and aliases ("billion laughs") compose to a graph whose
expansion has billions of nodes: anything that walks it as a tree, or converts it into typed
objects, hangs or eats memory. An alias may also refer to the node that contains it, which
makes the "tree" a cycle. Deep nesting recurses in PyYAML's composer. So the loader here counts
while it composes and stops at the first limit crossed, naming its line and column: the caller
reports that as a diagnostic instead of hanging. The limits and the diagnostic codes that rule
and route files use for them are listed in docs/rules.md and docs/remediation.md ("Limits").

Aliases stay allowed (sharing a block of labels is a fair use), but each one counts the full
size of what it expands to, so what the caller later walks or converts is bounded.

Two more things a document may hold that PyYAML passes on are refused as YAML errors with their
line and column: a scalar its own constructor cannot build (for ``!!bool maybe`` PyYAML raises
KeyError, for ``!!int ""`` IndexError, for an int of 5000 digits ValueError: none a ``YAMLError``),
and a string with a lone surrogate (``"\\ud800"``), which no UTF-8 writer (a log, Kafka, an argv)
can encode (an escaped pair, ``"\\ud83d\\ude00"``, is the one character it spells, as in JSON).
"""

from __future__ import annotations

import copy
import os
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 1 << 20  # the file, in UTF-8 bytes
    max_depth: int = 64  # mappings and lists nested in each other
    max_aliases: int = 100  # ``*name`` uses in one document
    max_nodes: int = 100_000  # every scalar, list and mapping, aliases expanded
    max_string: int = 64 << 10  # one scalar's characters


DEFAULT = Limits()

# What crossed a limit, for callers that map it onto their own diagnostic codes.
SIZE, DEPTH, ALIAS, STRING = "size", "depth", "alias", "string"

# What PyYAML's safe constructors raise for a scalar they cannot build (``!!bool maybe``: KeyError,
# ``!!float ""``: IndexError, ``!!timestamp x``: AttributeError, 5000 digits: ValueError).
BAD_SCALAR = (ValueError, OverflowError, LookupError, AttributeError, TypeError)


class YamlLimitError(yaml.YAMLError):
    """Input that crosses a limit. A ``YAMLError``, so code that reports bad YAML reports this too."""

    def __init__(self, kind: str, message: str, line: int = 1, col: int = 1) -> None:
        super().__init__(message)
        self.kind, self.message, self.line, self.col = kind, message, line, col

    def __str__(self) -> str:
        return f"line {self.line}, column {self.col}: {self.message}"


def _bounded(base: type) -> type:
    class Bounded(base):
        def __init__(self, stream: str, limits: Limits) -> None:
            super().__init__(stream)
            self._limits = limits
            self._open: list[Any] = []  # the containers being composed, outermost first
            self._size: dict[int, int] = {}  # id(node) -> nodes it expands to
            self._aliases = 0
            self._nodes = 0

        def _fail(self, kind: str, message: str, mark: Any) -> None:
            raise YamlLimitError(kind, message, mark.line + 1 if mark else 1, mark.column + 1 if mark else 1)

        def compose_node(self, parent: Any, index: Any) -> Any:
            lim = self._limits
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                self._aliases += 1
                if self._aliases > lim.max_aliases:
                    self._fail(ALIAS, f"more than {lim.max_aliases} aliases (*name) in one document", event.start_mark)
                node = super().compose_node(parent, index)
                if node is parent or any(node is n for n in self._open):
                    self._fail(ALIAS, f"alias *{event.anchor} refers to a node that contains it", event.start_mark)
                self._nodes += self._size[id(node)]
                if self._nodes > lim.max_nodes:
                    self._fail(ALIAS, f"aliases expand to more than {lim.max_nodes} nodes", event.start_mark)
                return node
            if len(self._open) >= lim.max_depth:
                self._fail(DEPTH, f"nested more than {lim.max_depth} levels deep", event.start_mark)
            self._open.append(parent)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._open.pop()
            if isinstance(node, yaml.ScalarNode):
                if len(node.value) > lim.max_string:
                    self._fail(STRING, f"a string longer than {lim.max_string} characters", node.start_mark)
                if not node.value.isascii():
                    _unicode(node)
                size = 1
            elif isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self._size[id(c)] for c in node.value)
            else:
                size = 1 + sum(self._size[id(k)] + self._size[id(v)] for k, v in node.value)
            self._size[id(node)] = size
            self._nodes += 1
            if self._nodes > lim.max_nodes:
                self._fail(SIZE, f"more than {lim.max_nodes} YAML nodes", node.start_mark)
            return node

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except BAD_SCALAR as e:
                # Not a YAMLError, so callers that report bad YAML would crash on it instead.
                raise yaml.constructor.ConstructorError(None, None, unbuilt(node, e), node.start_mark) from None

    return Bounded


def unbuilt(node: Any, e: Exception) -> str:
    """What is wrong with a scalar PyYAML could not build, for a ``ConstructorError``.

    >>> unbuilt(yaml.ScalarNode("tag:yaml.org,2002:bool", "maybe"), KeyError("maybe"))
    "cannot read a value: 'maybe' is not a YAML bool"
    """
    value = str(node.value)
    shown = repr(value if len(value) <= 40 else value[:40] + "...")
    why = f" ({str(e).split(':')[0]})" if isinstance(e, (ValueError, OverflowError)) and str(e) else ""
    return f"cannot read a value: {shown} is not a YAML {node.tag.rsplit(':', 1)[-1]}{why}"


class Shape:
    """A list or mapping node where a plain value belongs, as a message shows it: "a list", not
    PyYAML's repr of every node in it (~3 bytes of message a byte of file).

    >>> Shape(yaml.compose("[1, 2]")), Shape(yaml.compose("a: 1"))
    (a list, a mapping)
    """

    def __init__(self, node: Any) -> None:
        self.what = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"

    def __repr__(self) -> str:
        return self.what


def _unicode(node: Any) -> None:
    """Join a scalar's escaped surrogate pairs into the characters they spell; refuse one holding
    a lone surrogate (a ``\\ud800`` escape): every UTF-8 encoder fails on it."""
    try:
        node.value.encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    # JSON, which YAML 1.2 reads, spells a character past U+FFFF in escapes only as a UTF-16 pair.
    try:
        node.value = node.value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        return
    except UnicodeDecodeError as e:
        # The bytes before the error are whole UTF-16 units of the text before the lone one.
        lone = node.value.encode("utf-16-le", "surrogatepass")[e.start : e.start + 2].decode(
            "utf-16-le", "surrogatepass"
        )
    raise yaml.MarkedYAMLError(
        None, None, f"a string with a lone surrogate (U+{ord(lone):04X}), not Unicode text", node.start_mark
    )


_LOADERS: dict[type, type] = {}


def _loader(text: str, limits: Limits, base: type) -> Any:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise YamlLimitError(SIZE, f"the file is {size} bytes; the limit is {limits.max_bytes}")
    cls = _LOADERS.get(base)
    if cls is None:
        cls = _LOADERS[base] = _bounded(base)
    return cls(text, limits)


# What ``compose`` and ``load`` read before, by (what, text, limits, loader), the most recently
# used last, while it holds at most CACHE_NODES YAML nodes in all (~570 bytes a node: ~28 MB).
CACHE_NODES = 50_000
_cache: OrderedDict[tuple[str, str, Limits, type], tuple[Any, int]] = OrderedDict()
_cached_nodes = 0
_lock = threading.Lock()


def _cached(what: str, text: str, limits: Limits, base: type) -> tuple[Any, bool]:
    """(the tree or document of ``text``, True) when kept, else (None, False)."""
    with _lock:
        hit = _cache.get((what, text, limits, base))
        if hit is None:
            return None, False
        _cache.move_to_end((what, text, limits, base))
        return hit[0], True


def _keep(what: str, text: str, limits: Limits, base: type, value: Any, size: int) -> bool:
    """Keep ``value`` (of ``size`` nodes), the least recently used going past the budget;
    False when it is not kept (over the whole budget, or another thread kept it first)."""
    global _cached_nodes
    key = (what, text, limits, base)
    with _lock:
        if size > CACHE_NODES or key in _cache:
            return False
        _cache[key] = (value, size)
        _cached_nodes += size
        while _cached_nodes > CACHE_NODES:
            _cached_nodes -= _cache.popitem(last=False)[1][1]
        return True


def compose(text: str, limits: Limits = DEFAULT, *, base: type = yaml.SafeLoader) -> Any:
    """The node tree of one YAML document (None when empty), every node keeping its position.

    Raises ``YamlLimitError`` (a ``yaml.YAMLError``) at the first limit crossed, or the usual
    ``yaml.YAMLError`` for a syntax error.

    A text composed before gives the same tree again, not a new one: the service compiles the
    same rule files for every partition's engine, and scanning them again was most of a
    partition's set-up (~0.1 s each, docs/operations.md#scale). Callers read the tree and never
    change it.

    >>> compose("a: [1, 2]") is compose("a: [1, 2]")
    True
    """
    node, hit = _cached("tree", text, limits, base)
    if hit:
        return node
    loader = _loader(text, limits, base)
    try:
        node = loader.get_single_node()
        _keep("tree", text, limits, base, node, loader._nodes)
        return node
    finally:
        loader.dispose()


def syntax_error(e: yaml.YAMLError, text: str = "") -> tuple[str, int, int]:
    """A YAML syntax error as (problem, line, column), 1-based, for a ``file:line:col`` diagnostic.
    ``text``: the document, for a character YAML refuses (NUL, a control character), whose
    error holds only its offset and a message of several lines.

    >>> try:
    ...     compose("a: [1, 2")
    ... except yaml.YAMLError as e:
    ...     syntax_error(e)[1:]
    (1, 9)
    >>> try:
    ...     compose("a: 1\\nb: x\\x00")
    ... except yaml.YAMLError as e:
    ...     syntax_error(e, "a: 1\\nb: x\\x00")
    ('character U+0000 is not allowed', 2, 5)
    """
    if isinstance(e, yaml.reader.ReaderError):
        at = min(e.position, len(text))
        what = f"U+{e.character:04X}" if isinstance(e.character, int) else repr(e.character)
        return f"character {what} is not allowed", text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    return problem, (mark.line + 1 if mark else 1), (mark.column + 1 if mark else 1)


def load(text: str, limits: Limits = DEFAULT, *, base: type = yaml.SafeLoader) -> Any:
    """``yaml.safe_load`` (or ``base``'s load) with the limits of ``compose``. A text read before
    gives a deep copy of its document (each partition's models read the same files): the caller
    may change what it gets. Not built from ``compose``'s trees, which constructing a mapping
    would change (merge keys, ``<<``, are rewritten in place).

    >>> a = load("a: [1, 2]")
    >>> a["a"].append(3)
    >>> load("a: [1, 2]")
    {'a': [1, 2]}
    """
    doc, hit = _cached("document", text, limits, base)
    if hit:
        return copy.deepcopy(doc)
    loader = _loader(text, limits, base)
    try:
        doc = loader.get_single_data()
        # What is kept stays as it was read: the caller gets a copy of it.
        return copy.deepcopy(doc) if _keep("document", text, limits, base, doc, loader._nodes) else doc
    finally:
        loader.dispose()


class NotRegularFile(OSError):
    """A YAML file's path that is no regular file (a FIFO, a socket, a device): opening a FIFO
    waits for a writer, so ``rules check``, ``rules test``, ``replay`` and a hot reload would
    hang on it."""


def open_regular(f: str | os.PathLike[str]) -> int:
    """A descriptor of ``f`` opened for reading, or ``NotRegularFile``. ``O_NONBLOCK``: opening a
    FIFO returns at once instead of waiting for a writer; the check is on the opened file, so a
    file swapped between a check and the open is caught too."""
    fd = os.open(f, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"
        raise NotRegularFile(0, f"not a regular file ({kind})", str(f))
    return fd
