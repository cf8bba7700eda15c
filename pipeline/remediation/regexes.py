"""Regular expressions run the way Alertmanager runs them: RE2, linear in the input
(docs/remediation.md#regular-expressions).

Alertmanager accepts a matcher's value when Go's ``regexp`` (RE2 syntax) compiles it on its own,
and matches with ``^(?:value)$``. Here the same value runs on RE2 itself (the ``re2`` module of
google-re2) with both ends anchored, which for a value that compiles on its own is the same
test: so a silence matches exactly the alerts it matches in Alertmanager, and no pattern can
make one match take more than time linear in the value (Python's ``re`` backtracks: ``(a+)+$``
took seconds, ``.?`` x 40 followed by ``!`` hours).

Go's syntax and RE2's differ in two constructs a pattern can hold, which RE2 accepts and Go
refuses; they are refused here too (``_go_refuses``). Values and patterns are UTF-8 text; a lone
surrogate, which Go's JSON decoder reads as U+FFFD, is read the same way here.
"""

from __future__ import annotations

import re
from typing import Any

import re2

# RE2's own default budget for one compiled pattern: a pattern whose program is larger
# (\pL{1000}: 1.2 million instructions) does not compile, quickly, instead of taking memory.
MAX_PROGRAM_MEMORY = 8 << 20


class RegexError(ValueError):
    """A pattern RE2 (or Go's syntax) does not accept; the message says why."""


def _options() -> Any:
    o = re2.Options()
    o.log_errors = False  # RE2 would write every refused pattern to stderr itself
    o.max_mem = MAX_PROGRAM_MEMORY
    return o


def utf8_text(s: str) -> str:
    """``s`` with any lone surrogate replaced by U+FFFD (what Go makes of ``"\\ud800"`` in JSON),
    so that it can be encoded as UTF-8 for RE2."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)
    return s


_REPEAT = re.compile(r"\{([1-9][0-9]*|0)(?:(,)([1-9][0-9]*|0)?)?\}")


def _go_refuses(pattern: str) -> str | None:
    """Why Go's ``regexp`` would refuse a pattern RE2 accepts, or None.

    Two such constructs: ``\\C`` (any byte), and a repeat count too large to read (``x{99999999999}``:
    Go refuses it, RE2 reads the braces as literal text). Escapes, ``\\Q...\\E`` and character
    classes are skipped as both parsers skip them."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt == "Q":  # literal text up to \E in both: a \C inside it is two characters
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            if nxt == "C":
                return "invalid escape sequence: \\C (Go's regular expressions have no \\C)"
            i += 2
        elif c == "[":
            i = _class_end(pattern, i + 1)
        elif c == "{":
            m = _REPEAT.match(pattern, i)
            if m and any(g is not None and len(g) > 4 for g in (m.group(1), m.group(3))):
                return f"invalid repeat count: {m.group(0)[:40]} (Go's limit is 1000)"
            i += 1
        else:
            i += 1
    return None


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class whose body starts at ``i``."""
    n = len(pattern)
    if i < n and pattern[i] == "^":
        i += 1
    if i < n and pattern[i] == "]":  # a ] first in the class is a literal
        i += 1
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
        elif c == "[" and pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            i = i + 1 if end < 0 else end + 2
        elif c == "]":
            return i + 1
        else:
            i += 1
    return n


def _compile(pattern: str) -> Any:
    pattern = utf8_text(pattern)
    why = _go_refuses(pattern)
    if why is not None:
        raise RegexError(why)
    try:
        return re2.compile(pattern, _options())
    except re2.error as e:
        msg = e.args[0] if e.args else str(e)
        raise RegexError(msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)) from None


class Anchored:
    """A matcher's regular expression: true when it matches the whole value (``^(?:p)$``)."""

    __slots__ = ("pattern", "_re", "size")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._re = _compile(pattern)
        self.size: int = self._re.programsize  # RE2 instructions: what it holds in memory

    def matches(self, value: str) -> bool:
        """Whether the pattern matches all of ``value``; linear in ``len(value)``."""
        return self._re.fullmatch(utf8_text(value)) is not None


class Searching:
    """A pattern searched for anywhere in a text (a command query's ``query_match``)."""

    __slots__ = ("pattern", "_re")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._re = _compile(pattern)

    def search(self, text: str) -> str | None:
        """The leftmost match's text, or None; linear in ``len(text)``."""
        m = self._re.search(utf8_text(text))
        return None if m is None else m.group(0)


def forget_compiled() -> None:
    """Drop the re2 module's own cache of compiled patterns (up to 128 of them, each up to
    ``MAX_PROGRAM_MEMORY``): callers keep the ones they still use."""
    re2.purge()
