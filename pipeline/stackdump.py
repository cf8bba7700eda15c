"""Every thread's stack on a signal (``kill -USR1``), for a service that seems stuck.

The dump is written by a Python signal handler, so it runs in the main thread between two
bytecodes while every other thread waits for the interpreter lock. ``faulthandler``'s C-level
dump walks the other threads while they run, and a service under load died in it.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from types import FrameType
from typing import TextIO


def format_stacks() -> str:
    """Each thread's stack, most recent call first, the thread that asked named ``Current thread``.

    >>> "Current thread" in format_stacks() and "(most recent call first):" in format_stacks()
    True
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out: list[str] = []
    for ident, frame in sys._current_frames().items():
        head = "Current thread" if ident == me else "Thread"
        out.append(f"{head} 0x{ident:016x} ({names.get(ident, 'unnamed')}) (most recent call first):")
        for fs in reversed(traceback.extract_stack(frame)):
            out.append(f'  File "{fs.filename}", line {fs.lineno} in {fs.name}')
        out.append("")
    return "\n".join(out)


def dump(file: TextIO | None = None) -> None:
    """Write ``format_stacks()`` to ``file`` (standard error); a stream that cannot be written
    to costs only the dump."""
    stream = file if file is not None else sys.stderr
    try:
        stream.write(format_stacks() + "\n")
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


def install(signum: int = signal.SIGUSR1) -> None:
    """Dump every thread's stack to standard error on ``signum``; the process goes on.
    Must be called from the main thread (Python runs signal handlers there)."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        dump()

    signal.signal(signum, handler)
