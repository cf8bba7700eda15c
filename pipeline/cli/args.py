"""What several subcommands check of their arguments, and the Kafka options they share."""

from __future__ import annotations

import argparse
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
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"{p}: no such file or directory")
    return paths


def kafka_options(p: argparse.ArgumentParser, bootstrap_help: str = "Kafka bootstrap servers") -> None:
    from pipeline.bus.connection import add_arguments

    add_arguments(p, bootstrap_help=bootstrap_help)
