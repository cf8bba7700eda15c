"""Event JSONL files as the report reads them: alerts or incident events, one per line or an
array a line, ``.gz`` or plain; a line that is not one of them is counted, not fatal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import msgspec

from pipeline.bus.files import read_lines

T = TypeVar("T")

MAX_PROBLEMS = 3  # problems described by origin in the notes; the rest are only counted


@dataclass
class Counts:
    """What ``iter_events`` went through: lines read, and lines or array items that were not
    an event (``bad``)."""

    lines: int = 0
    bad: int = 0


def iter_events(
    paths: Iterable[str | Path],
    kind: type[T],
    counts: Counts,
    *,
    check: Callable[[T], str | None] | None = None,
    problems: list[str] | None = None,
) -> Iterator[T]:
    """The events of type ``kind`` in ``paths``, one at a time (half a million alerts are not
    held twice), counting into ``counts``. ``check(event)``: a reason to skip an event that
    decodes but cannot be used (None: keep it). ``problems``: given ``file:line: why`` for the first
    few skipped.

    >>> import tempfile, os
    >>> from pipeline.schema import AlertEvent
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
    ...     _ = fh.write('{"kind":"alert","id":"a","state":"firing","fault":"gpu_x","severity":"warning",'
    ...                  '"rule":"r","host":"h","gpu":0,"ts":1.0,"started_at":1.0}\\nnot json\\n')
    >>> counts = Counts()
    >>> [e.id for e in iter_events([fh.name], AlertEvent, counts)], counts
    (['a'], Counts(lines=2, bad=1))
    >>> os.unlink(fh.name)
    """

    def skip(origin: str, why: str) -> None:
        counts.bad += 1
        if problems is not None and len(problems) < MAX_PROBLEMS:
            problems.append(f"{origin}: {why[:200]}")

    for path in paths:
        for msg in read_lines(path):
            counts.lines += 1
            try:
                obj = msgspec.json.decode(msg.value)
            except msgspec.DecodeError as e:
                skip(msg.origin, f"not JSON ({e})")
                continue
            except RecursionError:  # nested deeper than the decoder follows
                skip(msg.origin, "nested too deep")
                continue
            for item in obj if isinstance(obj, list) else [obj]:
                try:
                    ev = msgspec.convert(item, kind)
                except msgspec.ValidationError as e:
                    skip(msg.origin, f"not {'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__} ({e})")
                    continue
                except RecursionError:
                    skip(msg.origin, "nested too deep")
                    continue
                why = check(ev) if check is not None else None
                if why is not None:
                    skip(msg.origin, why)
                else:
                    yield ev


def read_events(
    paths: Iterable[str | Path],
    kind: type[T],
    *,
    check: Callable[[T], str | None] | None = None,
    problems: list[str] | None = None,
) -> tuple[list[T], int, int]:
    """``iter_events`` as a list, with how many lines were read and how many lines or array
    items were not such an event."""
    counts = Counts()
    events = list(iter_events(paths, kind, counts, check=check, problems=problems))
    return events, counts.lines, counts.bad
