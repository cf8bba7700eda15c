"""Progress on long work (replay, report, eval, rules test), drawn on a terminal only.

A bar or spinner goes to stderr when stderr is a terminal, ``CI`` is not set and ``-q`` was not
given; in a pipe, a file or a CI log there is nothing but each command's summary line, so output
that scripts read stays clean. The bars are transient: they vanish when the work is done.

>>> with bar("replaying") as advance:   # not a terminal here: a no-op
...     advance(100)
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

_quiet = False


def set_quiet(quiet: bool) -> None:
    """``-q``: no progress at all, even on a terminal."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    """Whether progress is drawn: stderr is a terminal, not CI, not ``-q``, not ``TERM=dumb``."""
    if _quiet or os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def _noop(*_: object) -> None:
    return None


@contextmanager
def bar(description: str, total: float | None = None, unit: str = "records") -> Iterator[Callable[[float], None]]:
    """A progress bar (a count and rate when ``total`` is unknown); yields ``advance(n)``."""
    if not enabled():
        yield _noop
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is None:
        columns += [TextColumn("{task.completed:,.0f} " + unit), TimeElapsedColumn()]
    else:
        columns += [BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: float = 1) -> None:
            progress.advance(task, n)

        yield advance


@contextmanager
def status(description: str) -> Iterator[Callable[[str], None]]:
    """A spinner with a line of text; yields ``update(text)`` for work told in phases."""
    if not enabled():
        yield _noop
        return
    from rich.console import Console

    with Console(stderr=True).status(description) as st:
        yield lambda text: st.update(text)
