"""Event JSONL files as the report reads them: alerts or incident events, one per line or an
array a line, ``.gz`` or plain; a line that is not one of them is counted, not fatal."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, TypeVar

import msgspec

from pipeline.bus.files import read_lines

T = TypeVar("T")


def read_events(paths: Iterable[str | Path], kind: type[T]) -> tuple[list[T], int, int]:
    """The events of type ``kind`` in ``paths``, with how many lines were read and how many
    lines or array items were not such an event.

    >>> import tempfile, os
    >>> from pipeline.schema import AlertEvent
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
    ...     _ = fh.write('{"kind":"alert","id":"a","state":"firing","fault":"gpu_x","severity":"warning",'
    ...                  '"rule":"r","host":"h","gpu":0,"ts":1.0,"started_at":1.0}\\nnot json\\n')
    >>> events, lines, bad = read_events([fh.name], AlertEvent)
    >>> [e.id for e in events], lines, bad
    (['a'], 2, 1)
    >>> os.unlink(fh.name)
    """
    events: list[T] = []
    lines = bad = 0
    for path in paths:
        for msg in read_lines(path):
            lines += 1
            try:
                obj = msgspec.json.decode(msg.value)
            except msgspec.DecodeError:
                bad += 1
                continue
            for item in obj if isinstance(obj, list) else [obj]:
                try:
                    events.append(msgspec.convert(item, kind))
                except msgspec.ValidationError:
                    bad += 1
    return events, lines, bad
