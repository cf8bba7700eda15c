"""What several subcommands check of their arguments, and the Kafka options they share."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# Re-exported: the subcommands take them from here.
from pipeline.argtypes import port as port
from pipeline.argtypes import positive_float as positive_float
from pipeline.argtypes import positive_int as positive_int
from pipeline.errors import InputError, UsageError


def scenario(name: str) -> str:
    """``name`` when it is a built-in scenario or a readable scenario file; else a usage error."""
    from producers.sim.scenarios import load_scenario

    try:
        load_scenario(name)
    except ValueError as e:
        raise UsageError(f"--scenario: {e}") from None
    return name


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
    """``paths``, or an ``InputError`` naming the first that is not there, with the system's
    reason: a symlink loop is not "no such file"."""
    for p in paths:
        try:
            os.stat(p)
        except OSError as e:
            raise InputError(f"{p}: {(e.strerror or 'cannot be read').lower()}") from None
    return paths


def kafka_options(p: argparse.ArgumentParser, bootstrap_help: str = "Kafka bootstrap servers") -> None:
    from pipeline.bus.connection import add_arguments

    add_arguments(p, bootstrap_help=bootstrap_help)
