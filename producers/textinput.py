"""A whole text input read once, bounded: a file producer's ``--file F`` or ``-`` for stdin."""

from __future__ import annotations

import io
import logging
import sys
from typing import TextIO

log = logging.getLogger(__name__)

# The count a producer gives a last line without its newline that it did not read (exit 3).
CUT_LAST_LINE = "dropped.cut_last_line"


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


def split_cut_line(text: str) -> tuple[str, str]:
    """``text`` up to and with its last newline, and the last line after it that has none (a file
    still being written, or cut: its last value may be a part of one), ``""`` when there is none.

    >>> split_cut_line("a\\nb: 40"), split_cut_line("a\\nb: 400\\n")
    (('a\\n', 'b: 40'), ('a\\nb: 400\\n', ''))
    """
    i = text.rfind("\n") + 1
    return text[:i], text[i:]


def warn_cut_line(path: str, line: str) -> None:
    """The one warning for a last line left unread because it has no newline."""
    log.warning(
        "%s: the last line has no newline (the file may still be being written, or was cut); not read (%s): %.80r",
        "stdin" if path == "-" else path,
        CUT_LAST_LINE,
        line,
    )
