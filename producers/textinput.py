"""A whole text input read once, bounded: a file producer's ``--file F`` or ``-`` for stdin.

A gzip input (a rotated ``kern.log.2.gz``, a saved log kept compressed), told by its first two
bytes whatever its name, is read as the text it holds: member after member as ``zcat`` reads
them, a bounded piece at a time, so the caps a producer puts on plain text bound the unpacked
text too. A gzip cut short or damaged gives the text before the damage; the damage is kept
(``gzip_damage``) for the producer to count as lost input (``damage_counts``).
"""

from __future__ import annotations

import gzip
import io
import logging
import sys
import zlib
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple, TextIO

log = logging.getLogger(__name__)

# The count a producer gives a last line without its newline that it did not read (exit 3).
CUT_LAST_LINE = "dropped.cut_last_line"
# The counts of a gzip input that ends inside a member (a copy taken while logrotate compressed,
# a transfer cut) and of one whose bytes are not gzip past some point (a bad CRC, a bad block,
# bytes after a member that start no other): the text before is read, the rest is lost (exit 3).
CUT_GZIP = "dropped.cut_gzip"
DAMAGED_GZIP = "dropped.damaged_gzip"
GZIP_MAGIC = b"\x1f\x8b"  # no text a producer reads starts with it (0x1f is a control character)


@dataclass(frozen=True)
class GzipDamage:
    """Why a gzip input ended before its end: ``reason`` is ``CUT_GZIP`` or ``DAMAGED_GZIP``,
    ``detail`` what gzip said, ``after`` the bytes of text read before it."""

    reason: str
    detail: str
    after: int


# Compressed bytes handed to zlib a step: a damaged block raises in the step that reaches it and
# loses what that step unpacked, so a small step keeps all but the last few lines before it.
SIP = 64


class _Sips:
    """``raw`` read at most ``SIP`` bytes a call (``GzipFile`` asks for 8 KiB and decompresses
    it in one step)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw

    def read(self, n: int = -1, /) -> bytes:
        return self._raw.read(SIP if n < 0 else min(n, SIP))

    def seek(self, n: int, /) -> object:  # GzipFile's rewind, never called on a read
        return self._raw.seek(n)


class _Gunzip(io.RawIOBase):
    """The text bytes of the gzip stream ``raw``, at most the caller's buffer a read (a bomb
    costs its reader's buffer, not its size). Damage ends the stream: the reads before it keep
    what they gave, ``damage`` says why, and no exception reaches the text layer, which would
    drop the text it was decoding (``TextIOWrapper.read`` loses its whole call)."""

    def __init__(self, raw: BinaryIO, *, owned: bool, holder: object = None) -> None:
        super().__init__()
        self._raw, self._owned = raw, owned
        self._holder = holder  # the text reader over raw (stdin's): collected, it would close raw
        self._gz = gzip.GzipFile(fileobj=_Sips(raw), mode="rb")
        self.damage: GzipDamage | None = None
        self._given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.damage is not None:
            return 0
        try:
            # read1: one decompression step, so text unpacked before a damaged step is not held back.
            data = self._gz.read1(len(b))
        except EOFError as e:
            self.damage = GzipDamage(CUT_GZIP, f"cut short: {e}", self._given)
            return 0
        except (gzip.BadGzipFile, zlib.error) as e:
            self.damage = GzipDamage(DAMAGED_GZIP, f"damaged: {e}", self._given)
            return 0
        b[: len(data)] = data
        self._given += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._gz.close()  # a GzipFile given a fileobj leaves it open
            if self._owned:
                self._raw.close()
        super().close()


def _gunzipped(raw: BinaryIO, *, owned: bool, holder: object = None) -> TextIO:
    """``raw`` (gzip) as text read as ``open_text`` reads a file."""
    unpacked = io.BufferedReader(_Gunzip(raw, owned=owned, holder=holder))
    return io.TextIOWrapper(unpacked, encoding="utf-8-sig", errors="replace")


def gzip_damage(fh: TextIO) -> GzipDamage | None:
    """Why the gzip input ``fh`` (``open_text``'s or ``stdin``'s) ended early, once it was read
    to its end; ``None`` for a whole one, or plain text.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", delete=False) as fh:
    ...     _ = fh.write(gzip.compress(b"GPU 0\\n")[:-4])
    >>> with open_text(fh.name) as f:
    ...     f.read(), gzip_damage(f).reason
    ('GPU 0\\n', 'dropped.cut_gzip')
    >>> os.unlink(fh.name)
    """
    raw = getattr(getattr(fh, "buffer", None), "raw", None)
    return raw.damage if isinstance(raw, _Gunzip) else None


def damage_counts(damage: GzipDamage | None) -> dict[str, int]:
    """The summary's counts for a gzip input's damage, both reasons always there.

    >>> damage_counts(None)
    {'dropped.cut_gzip': 0, 'dropped.damaged_gzip': 0}
    """
    return {r: int(damage is not None and damage.reason == r) for r in (CUT_GZIP, DAMAGED_GZIP)}


def warn_damage(path: str, damage: GzipDamage | None) -> None:
    """The one warning for a gzip input that ended early, naming the input and the damage."""
    if damage is not None:
        log.warning(
            "%s: gzip input %s; the %d bytes of text before it are read, the rest is lost (%s)",
            "stdin" if path == "-" else path,
            damage.detail,
            damage.after,
            damage.reason,
        )


_probed: list[object] = []  # the standard input whose first bytes were looked at for gzip's


def _stdin_is_gzip() -> bool:
    """Whether standard input starts with gzip's magic, looked at once, before it is read, in the
    bytes its buffer holds (``peek``: nothing is taken from the stream); no buffer that can peek
    (a test's stand-in) is text."""
    if any(s is sys.stdin for s in _probed):
        return False
    _probed[:] = [sys.stdin]
    peek = getattr(getattr(sys.stdin, "buffer", None), "peek", None)
    try:
        return peek is not None and bytes(peek(2)[:2]) == GZIP_MAGIC
    except (OSError, ValueError):  # closed, or not readable: reading it says why
        return False


def stdin() -> TextIO:
    """Standard input read as ``open_text`` reads a file: a strict stdin would raise at the first
    byte that is not UTF-8 and lose the whole input, Python's default (``surrogateescape``) would
    pass it on as a lone surrogate that no record can be encoded with. A gzip stream (``cat
    kern.log.2.gz |``) is read as its text: ``sys.stdin`` becomes its reader.

    >>> stdin() is sys.stdin
    True
    """
    if isinstance(sys.stdin, io.TextIOWrapper) and _stdin_is_gzip():
        sys.stdin = _gunzipped(sys.stdin.buffer, owned=False, holder=sys.stdin)
        _probed[:] = [sys.stdin]
        return sys.stdin
    if isinstance(sys.stdin, io.TextIOWrapper) and sys.stdin.errors != "replace":
        try:
            sys.stdin.reconfigure(encoding="utf-8-sig", errors="replace")
        except (ValueError, io.UnsupportedOperation):  # some was read already: the encoding stays
            sys.stdin.reconfigure(errors="replace")
    return sys.stdin


def open_text(path: str) -> TextIO:
    """A saved input file as text: bytes that are not UTF-8 replaced (each costs its line, not the
    file), a leading byte-order mark (an editor's or PowerShell's save) left out; a gzip file
    read as the text it holds (``gzip_damage`` says when it ended early).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", delete=False) as fh:
    ...     _ = fh.write(b"\\xef\\xbb\\xbfGPU 0\\xff\\n")
    >>> with open_text(fh.name) as f:
    ...     f.read()
    'GPU 0\\ufffd\\n'
    >>> os.unlink(fh.name)
    """
    raw = open(path, "rb")  # noqa: SIM115 - handed to the text reader, which closes it
    try:
        gz = raw.peek(2)[:2] == GZIP_MAGIC
    except BaseException:
        raw.close()
        raise
    if gz:
        return _gunzipped(raw, owned=True)
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace")


class TextRead(NamedTuple):
    """``read_input``'s answer: the text, whether there was more past the cap (not read), and
    what damage ended a gzip input early."""

    text: str
    more: bool
    damage: GzipDamage | None


def read_input(path: str, max_chars: int) -> TextRead:
    """``read_capped`` with what ended a gzip input early, for a producer to count.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", delete=False) as fh:
    ...     _ = fh.write(gzip.compress(b"ab") + gzip.compress(b"cdef"))
    >>> read_input(fh.name, 4)
    TextRead(text='abcd', more=True, damage=None)
    >>> os.unlink(fh.name)
    """
    if path == "-":
        src = stdin()
        text = src.read(max_chars + 1)
        damage = gzip_damage(src)
    else:
        with open_text(path) as fh:
            text = fh.read(max_chars + 1)
            damage = gzip_damage(fh)
    return TextRead(*((text[:max_chars], True) if len(text) > max_chars else (text, False)), damage)


def read_capped(path: str, max_chars: int) -> tuple[str, bool]:
    """The first ``max_chars`` characters of ``path`` (``-``: standard input), undecodable bytes
    replaced and a leading byte-order mark (an editor's save) left out, and whether there was more
    (the rest is not read, so a huge input costs no memory). A gzip input is read as its text, at
    most ``max_chars`` of it; one that ended early is warned of (``read_input`` also says so).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
    ...     _ = fh.write("abcdef")
    >>> read_capped(fh.name, 4), read_capped(fh.name, 6)
    (('abcd', True), ('abcdef', False))
    >>> os.unlink(fh.name)
    """
    text, more, damage = read_input(path, max_chars)
    warn_damage(path, damage)
    return text, more


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
