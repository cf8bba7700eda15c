"""argparse types shared by ``gpuwarden``'s commands and the producers' (which may not import
``pipeline.cli``): a bad value is a usage error (exit 2) naming the option, before anything
starts."""

from __future__ import annotations

import argparse
import math


def int_in(text: str, lo: int, hi: int | None, what: str) -> int:
    """``text`` as an integer in ``lo..hi`` (None: no bound), else an argparse error expecting ``what``.

    >>> int_in("7", 1, 8, "an integer 1..8")
    7
    """
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if n < lo or (hi is not None and n > hi):
        raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
    return n


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free one).

    >>> port("9108")
    9108
    """
    return int_in(text, 0, 65535, "a port 0..65535")


def positive_int(text: str) -> int:
    """An integer of at least 1 (``--hosts 0`` is a usage error, not a run of nothing).

    >>> positive_int("3")
    3
    """
    return int_in(text, 1, None, "an integer >= 1")


def _number(text: str, zero: bool) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number {'>=' if zero else '>'} 0, got {text!r}") from None
    if not math.isfinite(x) or x < 0 or (x == 0 and not zero):
        raise argparse.ArgumentTypeError(f"expected a finite number {'>=' if zero else '>'} 0, got {text}")
    return x


def positive_float(text: str) -> float:
    """A finite number above 0 (seconds of a duration, an interval or a timeout).

    >>> positive_float("0.5")
    0.5
    """
    return _number(text, zero=False)


def non_negative_float(text: str) -> float:
    """A finite number, 0 or more (seconds of an interval, an epoch time).

    >>> non_negative_float("0")
    0.0
    """
    return _number(text, zero=True)
