"""JSONL files (optionally gzipped) as a source of messages and a sink of records."""

from __future__ import annotations

import gzip
import heapq
import logging
import math
import os
import re
import resource
import stat
import sys
import zlib
from collections import deque
from itertools import chain
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, cast

from pipeline.bus.base import FILE_PARTITION, Message
from pipeline.errors import InputError

log = logging.getLogger(__name__)


def _open(path: str | Path, mode: str, gz: bool | None = None) -> IO[bytes]:
    p = str(path)
    if p == "-":
        return sys.stdin.buffer if "r" in mode else sys.stdout.buffer
    if p.endswith(".gz") if gz is None else gz:
        # A GzipFile is a binary file object, though typeshed's gzip.open does not say IO[bytes].
        return cast(IO[bytes], gzip.open(p, mode + "b", compresslevel=5) if "w" in mode else gzip.open(p, mode + "b"))
    return open(p, mode + "b")


MAX_LINE_BYTES = 8 * 1024 * 1024  # the decoder's message limit (Decoder.max_message_bytes)
GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16  # bytes read (and decompressed) at a time: what bounds memory, whatever a line's length


def _warn(problem: str) -> None:
    log.warning("%s", problem)


def _raw_chunks(fh: IO[bytes]) -> Iterator[bytes]:
    read = getattr(fh, "read1", fh.read)  # read1: what a pipe has now, never waiting for a whole chunk
    while chunk := read(_CHUNK):
        yield chunk


def _gunzip(chunks: Iterator[bytes], name: str, lines_done: Callable[[], int]) -> Iterator[bytes]:
    """The decompressed bytes of the gzip members in ``chunks``, at most ``_CHUNK`` at a time (a
    small file that inflates to gigabytes is never held whole). Raises ``_StreamEnd`` with what
    went wrong when the stream is cut short, damaged, or followed by bytes that are not gzip."""
    d = zlib.decompressobj(wbits=31)  # 16 + MAX_WBITS: a gzip header and trailer
    fed = False  # whether the current member has had any input
    for data in chunks:
        while True:
            if not fed:
                # Zeros between or after members are padding (tape blocks, preallocated files), as
                # gzip(1) and Python's gzip module read them, not bytes that are not gzip.
                data = data.lstrip(b"\x00")
                if not data:
                    break
            try:
                out = d.decompress(data, _CHUNK)
            except zlib.error as e:
                what = "bytes that are not gzip" if not fed else "a damaged gzip stream"
                raise _StreamEnd(f"{name}: after line {lines_done()}: {what} ({e}); the rest of the file is not read")
            fed = fed or bool(data)
            if out:
                yield out
            if d.eof:  # a member ended; another may follow (concatenated gzip files are one gzip file)
                data, d, fed = d.unused_data, zlib.decompressobj(wbits=31), False
                if not data:
                    break
                continue
            data = d.unconsumed_tail
            if not data and len(out) < _CHUNK:
                break
    if fed:
        raise _StreamEnd(
            f"{name}: the gzip stream ends early after line {lines_done()} (a truncated file); "
            "its complete lines were read"
        )


class _StreamEnd(Exception):
    """The end of a file's readable bytes, and why (a truncated or damaged gzip stream)."""


def read_lines(
    path: str | Path, max_line_bytes: int = MAX_LINE_BYTES, on_problem: Callable[[str], None] | None = None
) -> Iterator[Message]:
    r"""Every non-empty line of a JSONL file as a message whose origin is ``file:line``.

    A file (or standard input) whose bytes start with gzip's magic number is gunzipped, whatever
    its name, its members one after another; a file named ``.gz`` that is not gzip is an
    ``InputError``. A gzip stream cut short (a recording of a crashed writer) or followed by bytes
    that are not gzip ends the file after its last line, the incomplete line included (the decoder
    makes it a dead letter), and ``on_problem`` (default: a logged warning) is told which file and
    line. A line longer than ``max_line_bytes`` is never held whole (a 3 GiB line in a ``.gz`` once
    took 6 GB of memory): its first ``max_line_bytes + 1`` bytes stand for it, which the decoder
    turns into a ``too_large`` dead letter, and the rest is skipped in bounded reads.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
    ...     _ = f.write(b'{"a":1}\r\n\n{"a":2}')
    >>> [(m.value, m.origin.rsplit(":", 1)[1]) for m in read_lines(f.name)]
    [(b'{"a":1}', '1'), (b'{"a":2}', '3')]
    >>> os.unlink(f.name)
    """
    name = str(path)
    tell = on_problem or _warn
    fh = _open(path, "r", gz=False)
    lineno = 0
    try:
        chunks = _raw_chunks(fh)
        head = b""
        for chunk in chunks:  # the first two bytes, which a pipe may hand over one at a time
            head += chunk
            if len(head) >= 2:
                break
        if head[:2] == GZIP_MAGIC:
            data = _gunzip(chain([head], chunks), name, lambda: lineno)
        elif head and name.endswith(".gz"):
            raise InputError(f"{name}: not a gzip file, though named .gz")
        else:
            data = chain([head], chunks)
        parts: list[bytes] = []  # the current line's pieces, at most max_line_bytes + 1 bytes
        size = 0
        cut = False  # the current line passed max_line_bytes: the rest of it is skipped
        over = False  # a skipped byte was not blank: the line is too large, whatever strip() leaves

        def whole() -> bytes:
            # A line over the limit is not stripped: what stands for it must stay over it. One
            # whose bytes past the limit are blanks (a "\r" before the newline) is only as long
            # as what is left once stripped, which the decoder measures.
            line = b"".join(parts)
            return line if over else line.strip()

        try:
            for chunk in data:
                pieces = chunk.split(b"\n")
                for i, piece in enumerate(pieces):
                    if not parts:
                        piece = piece.lstrip()  # blanks before a line's first byte count for nothing
                    if piece and cut:
                        over = over or not piece.isspace()
                    elif piece:
                        if size + len(piece) > max_line_bytes:
                            rest = piece[max_line_bytes + 1 - size :]
                            over = bool(rest) and not rest.isspace()
                            piece, cut = piece[: max_line_bytes + 1 - size], True
                        parts.append(piece)
                        size += len(piece)
                    if i == len(pieces) - 1:
                        break  # the line goes on in the next chunk
                    lineno += 1
                    line = whole()
                    parts, size, cut, over = [], 0, False, False
                    if line:
                        yield Message(name, FILE_PARTITION, lineno, None, line)
        except _StreamEnd as e:
            tell(str(e))
        if parts:  # the last line, without its newline
            lineno += 1
            line = whole()
            if line:
                yield Message(name, FILE_PARTITION, lineno, None, line)
    finally:
        if name != "-":
            fh.close()


def read_files(paths: Iterable[str | Path], problems: list[str]) -> Iterator[Message]:
    """``read_lines`` of each of ``paths`` in turn, where a file that cannot be read, stops being
    readable or is cut short is one line in ``problems`` naming it instead of the end of the
    input: the other files are still read (``gpuwarden replay``, also ``--to-kafka``).

    >>> problems: list[str] = []
    >>> list(read_files(["/nonexistent/a.jsonl"], problems)), problems[0].startswith("/nonexistent/a.jsonl: ")
    ([], True)
    """
    for path in paths:
        try:
            yield from read_lines(path, on_problem=problems.append)
        except InputError as e:
            problems.append(e.message)
        except OSError as e:
            problems.append(f"{path}: {e.strerror or e}; the rest of the file is not read")


# A record's event time as our producers and the schema write it: a number under a "ts" key
# (docs/architecture.md §3). Only a sort key: the decoder still reads the record whole.
_TS_KEY = re.compile(rb'"ts"\s*:\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)')
#: How far a sample's time may jump from the file's before it is taken for a stray (a clock set
#: wrong for a while) rather than where the file now is: see ``_keyed``.
MERGE_JUMP_S = 600.0
_LOOKAHEAD_RUNS = 8  # samples read ahead of the one keyed, to see whether the file comes back
_LOOKAHEAD_LINES = 4096  # and at most this many lines: a whole fleet's second is one sample
_SPARE_FDS = 64  # descriptors left for everything else the process opens (outputs, sockets)
MAX_MERGED_FILES = 1024  # files open at once: each holds its read buffers (~150 KB)


def _line_ts(line: bytes) -> float | None:
    m = _TS_KEY.search(line)
    if m is None:
        return None
    ts = float(m.group(1))
    return ts if math.isfinite(ts) else None


def _runs(messages: Iterator[Message]) -> Iterator[tuple[float | None, list[Message]]]:
    """Consecutive lines of one time as one sample (a host's GPUs one record a line); a line
    without a time belongs with the one before it (None: lines before any time)."""
    ts_run: float | None = None
    run: list[Message] = []
    for m in messages:
        ts = _line_ts(m.value)
        if ts is not None and ts != ts_run:
            if run:
                yield ts_run, run
            ts_run, run = ts, []
        run.append(m)
    if run:
        yield ts_run, run


def _keyed(messages: Iterator[Message]) -> Iterator[tuple[float, Message]]:
    """Each message of one file with a sort key that never goes back: its sample's time, or, for a
    sample behind the file's time or a stray, the time the file had reached. A stray is a sample
    more than ``MERGE_JUMP_S`` from the file's time that one of the next few samples comes back
    from (a clock set wrong for a while): keyed at its own time it would hold back the rest of
    its file until every other file had passed it (a year-2100 stamp made the file's every later
    record late). A jump the following samples go along with is where the file now is (a host
    back after an outage; kernel-log events hours apart). The first sample is a stray when the
    two after it agree with each other and not with it."""
    runs = _runs(messages)
    ahead: deque[tuple[float | None, list[Message]]] = deque()
    held = 0  # lines in ``ahead``
    prev: float | None = None
    while True:
        while len(ahead) <= _LOOKAHEAD_RUNS and held < _LOOKAHEAD_LINES:
            run = next(runs, None)
            if run is None:
                break
            ahead.append(run)
            held += len(run[1])
        if not ahead:
            return
        ts, msgs = ahead.popleft()
        held -= len(msgs)
        key = ts
        if ts is not None:
            nexts = [t for t, _ in ahead if t is not None]
            if prev is None:
                if len(nexts) >= 2 and abs(nexts[0] - nexts[1]) <= MERGE_JUMP_S < abs(ts - nexts[0]):
                    key = min(ts, nexts[0])
            elif abs(ts - prev) > MERGE_JUMP_S and any(abs(t - prev) <= MERGE_JUMP_S for t in nexts):
                key = prev
            if prev is not None and key is not None and key < prev:
                key = prev
        else:
            key = prev
        prev = key
        k = -math.inf if key is None else key
        for m in msgs:
            yield k, m


def merge_group_size() -> int:
    """How many files ``read_merged`` merges at once: the open-file limit (its soft limit raised to
    the hard one if it can be), less what the process needs beside, at most ``MAX_MERGED_FILES``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    allowed = MAX_MERGED_FILES if soft == resource.RLIM_INFINITY else soft - _SPARE_FDS
    return max(1, min(MAX_MERGED_FILES, allowed))


def _once(paths: list[str | Path]) -> list[str | Path]:
    """``paths`` less a second naming of standard input or of one pipe (FIFO, process
    substitution): its bytes would be shared out between two readers, each getting lines cut in
    two. Named twice, it is read once (a warning says so); a regular file named twice is read twice."""
    seen: set[object] = set()
    out: list[str | Path] = []
    for p in paths:
        ident: object = None
        if str(p) == "-":
            ident = "-"
        else:
            try:
                st = os.stat(p)
            except OSError:
                st = None  # read_files names what is wrong with it
            if st is not None and not stat.S_ISREG(st.st_mode):
                ident = (st.st_dev, st.st_ino)
        if ident is not None and ident in seen:
            log.warning("%s: named twice; a pipe can be read only once, so it is read once", p)
            continue
        if ident is not None:
            seen.add(ident)
        out.append(p)
    return out


def read_merged(paths: Iterable[str | Path], problems: list[str]) -> Iterator[Message]:
    r"""``read_files`` of ``paths`` merged into one stream in event time: recordings of several
    hosts over the same hours (one file per host) interleave as the hosts sampled them, where
    reading them one after another would make every file's records after the first ``late``.

    Each file's own order is kept (a file that goes back in time by itself is not re-sorted);
    records of the same time come in the order the files were given. What problems stop a file
    are told as ``read_files`` tells them; standard input or a pipe named twice is read once.
    The files of a group are open at once; past ``merge_group_size()`` files (the open-file limit,
    at most ``MAX_MERGED_FILES``) the groups are merged one after another, with a warning.

    >>> import json, os, shutil, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name, times in (("a", (0, 10, 20)), ("b", (5, 15))):
    ...     with open(os.path.join(d, name + ".jsonl"), "w") as f:
    ...         _ = f.write("".join('{"kind":"dcgm","ts":%d}\n' % t for t in times))
    >>> msgs = read_merged([os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl")], [])
    >>> [(json.loads(m.value)["ts"], os.path.basename(m.origin)) for m in msgs]
    [(0, 'a.jsonl:1'), (5, 'b.jsonl:1'), (10, 'a.jsonl:2'), (15, 'b.jsonl:2'), (20, 'a.jsonl:3')]
    >>> shutil.rmtree(d)
    """
    paths = _once(list(paths))
    if len(paths) <= 1:
        yield from read_files(paths, problems)
        return
    group = merge_group_size()
    if len(paths) > group:
        log.warning(
            "%d recordings, more than the %d merged at once: merged in groups of %d, one group after "
            "another (records of a later group that overlap an earlier one are late)",
            len(paths),
            group,
            group,
        )
    for start in range(0, len(paths), group):
        streams = [_keyed(read_files([p], problems)) for p in paths[start : start + group]]
        for _, msg in heapq.merge(*streams, key=lambda km: km[0]):
            yield msg


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
