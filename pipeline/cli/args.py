"""What several subcommands check of their arguments, and the Kafka options they share."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import InputError, UsageError


def scenario(name: str) -> str:
    """``name`` when it is a built-in scenario or a readable scenario file; else a usage error."""
    from producers.sim.scenarios import load_scenario

    try:
        load_scenario(name)
    except ValueError as e:
        raise UsageError(f"--scenario: {e}") from None
    return name


def port(text: str) -> int:
    """An argparse type: a TCP port, 0..65535 (0: any free one).

    >>> port("9108")
    9108
    """
    return _int_in(text, 0, 65535, "a port 0..65535")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (``--hosts 0`` is a usage error, not a run of
    nothing or an internal error).

    >>> positive_int("3")
    3
    """
    return _int_in(text, 1, None, "an integer >= 1")


def _int_in(text: str, lo: int, hi: int | None, what: str) -> int:
    """``text`` as an integer in ``lo..hi`` (None: no bound), else an argparse error expecting ``what``."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if n < lo or (hi is not None and n > hi):
        raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
    return n


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds of a duration or an interval).

    >>> positive_float("0.5")
    0.5
    """
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (x > 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return x


def existing(paths: list[str], option: str) -> list[str]:
    """``paths`` when each is ``-`` (stdin) or a file; else an input error naming the first that is not."""
    for p in paths:
        if p != "-" and not Path(p).is_file():
            raise InputError(f"{option}{p}: " + ("not a file" if Path(p).exists() else "no such file"))
    return paths


def models_file(value: str | None) -> str | None:
    """``--models``: ``auto``, ``none`` or a file that is there; else an input error naming the
    file, said before any rule is loaded.

    >>> models_file("auto"), models_file("none")
    ('auto', 'none')
    """
    if value and value not in ("auto", "none"):
        existing([value], "--models ")
    return value


def existing_paths(paths: list[str]) -> list[str]:
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"{p}: no such file or directory")
    return paths


def kafka_options(p: argparse.ArgumentParser, bootstrap_help: str = "Kafka bootstrap servers") -> None:
    from pipeline.bus.connection import add_arguments

    add_arguments(p, bootstrap_help=bootstrap_help)
