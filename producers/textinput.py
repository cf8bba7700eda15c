"""A whole text input read once, bounded: a file producer's ``--file F`` or ``-`` for stdin."""

from __future__ import annotations

import io
import sys
from typing import TextIO


def stdin() -> TextIO:
    """Standard input with bytes that are not UTF-8 replaced, as a file's are when a producer
    reads one: a strict stdin would raise at the first such byte and lose the whole input.

    >>> stdin() is sys.stdin
    True
    """
    if isinstance(sys.stdin, io.TextIOWrapper) and sys.stdin.errors == "strict":
        sys.stdin.reconfigure(errors="replace")
    return sys.stdin


def read_capped(path: str, max_chars: int) -> tuple[str, bool]:
    """The first ``max_chars`` characters of ``path`` (``-``: standard input), undecodable bytes
    replaced and a leading byte-order mark (an editor's save) left out, and whether there was more (the rest is not read, so a huge input costs no memory).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
    ...     _ = fh.write("abcdef")
    >>> read_capped(fh.name, 4), read_capped(fh.name, 6)
    (('abcd', True), ('abcdef', False))
    >>> os.unlink(fh.name)
    """
    if path == "-":
        text = stdin().read(max_chars + 1)
    else:
        with open(path, encoding="utf-8-sig", errors="replace") as fh:
            text = fh.read(max_chars + 1)
    return (text[:max_chars], True) if len(text) > max_chars else (text, False)
