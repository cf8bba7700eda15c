"""A whole text input read once, bounded: a file producer's ``--file F`` or ``-`` for stdin."""

from __future__ import annotations

import io
import sys
from typing import TextIO


def stdin() -> TextIO:
    """Standard input read as ``open_text`` reads a file: a strict stdin would raise at the first
    byte that is not UTF-8 and lose the whole input, Python's default (``surrogateescape``) would
    pass it on as a lone surrogate that no record can be encoded with.

    >>> stdin() is sys.stdin
    True
    """
    if isinstance(sys.stdin, io.TextIOWrapper) and sys.stdin.errors != "replace":
        try:
            sys.stdin.reconfigure(encoding="utf-8-sig", errors="replace")
        except (ValueError, io.UnsupportedOperation):  # some was read already: the encoding stays
            sys.stdin.reconfigure(errors="replace")
    return sys.stdin


def open_text(path: str) -> TextIO:
    """A saved input file as text: bytes that are not UTF-8 replaced (each costs its line, not the
    file), a leading byte-order mark (an editor's or PowerShell's save) left out.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", delete=False) as fh:
    ...     _ = fh.write(b"\\xef\\xbb\\xbfGPU 0\\xff\\n")
    >>> with open_text(fh.name) as f:
    ...     f.read()
    'GPU 0\\ufffd\\n'
    >>> os.unlink(fh.name)
    """
    return open(path, encoding="utf-8-sig", errors="replace")


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
        with open_text(path) as fh:
            text = fh.read(max_chars + 1)
    return (text[:max_chars], True) if len(text) > max_chars else (text, False)
