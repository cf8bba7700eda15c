"""JSONL files (optionally gzipped) as a source of messages and a sink of records."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path
from typing import IO, Iterable, Iterator, cast

from pipeline.bus.base import FILE_PARTITION, Message
from pipeline.errors import InputError


def _open(path: str | Path, mode: str, gz: bool | None = None) -> IO[bytes]:
    p = str(path)
    if p == "-":
        return sys.stdin.buffer if "r" in mode else sys.stdout.buffer
    if p.endswith(".gz") if gz is None else gz:
        # A GzipFile is a binary file object, though typeshed's gzip.open does not say IO[bytes].
        return cast(IO[bytes], gzip.open(p, mode + "b", compresslevel=5) if "w" in mode else gzip.open(p, mode + "b"))
    return open(p, mode + "b")


MAX_LINE_BYTES = 8 * 1024 * 1024  # the decoder's message limit (Decoder.max_message_bytes)


def read_lines(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Message]:
    """Every non-empty line of a JSONL file as a message whose origin is ``file:line``.

    A truncated gzip stream ends the file quietly after its last complete line: a recording cut
    short by a crash is still worth replaying. A line longer than ``max_line_bytes`` is never
    held whole (a 3 GiB line in a ``.gz`` once took 6 GB of memory): its first
    ``max_line_bytes + 1`` bytes stand for it, which the decoder turns into a ``too_large`` dead
    letter, and the rest is skipped in bounded reads.
    """
    name = str(path)
    fh = _open(path, "r")
    try:
        lineno = 0
        while True:
            try:
                line = fh.readline(max_line_bytes + 1)
                if len(line) > max_line_bytes and not line.endswith(b"\n"):
                    while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass
            except EOFError:
                break  # truncated gzip: keep what was complete
            except gzip.BadGzipFile as e:
                raise InputError(f"{name}: not a gzip file, though named .gz") from e
            if not line:
                break
            lineno += 1
            line = line.strip()
            if line:
                yield Message(name, FILE_PARTITION, lineno, None, line)
    finally:
        if name != "-":
            fh.close()


class FileSink:
    """Writes one JSON document per line; ``.gz`` paths are gzipped. Atomic on ``close`` when asked."""

    def __init__(self, path: str | Path, atomic: bool = False) -> None:
        self.path = str(path)
        self.atomic = atomic and self.path != "-"
        target = self.path + ".tmp" if self.atomic else self.path
        if self.path != "-":
            Path(target).parent.mkdir(parents=True, exist_ok=True)
        self._fh = _open(target, "w", gz=self.path.endswith(".gz"))
        self.count = 0

    def write(self, line: bytes) -> None:
        self._fh.write(line)
        self._fh.write(b"\n")
        self.count += 1

    def write_many(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Push what was written so far to the OS (a tailing reader sees it)."""
        self._fh.flush()

    def close(self) -> None:
        if self.path == "-":
            self._fh.flush()
            return
        self._fh.close()
        if self.atomic:
            os.replace(self.path + ".tmp", self.path)

    def __enter__(self) -> "FileSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
