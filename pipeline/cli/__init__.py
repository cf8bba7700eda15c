"""``gpuwarden``: the command line. Each subcommand is a thin driver around the library, in a
module of its own that registers its parser (``register(sub)``); this one holds the options every
subcommand shares and ``main``'s one-line error handling."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from typing import Any

from pipeline import progress
from pipeline.cli import demo, evaluate, record, replay, report, rules, serve, sim, topics
from pipeline.errors import (
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    GpuwardenError,
)
from pipeline.resources import version

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake told in one line (the usage is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _global_options(p: argparse.ArgumentParser, top: bool) -> None:
    # Under a subcommand the default is SUPPRESS, so an option not given there keeps the value
    # given (or defaulted) before the subcommand: `gpuwarden -v replay` = `gpuwarden replay -v`.
    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    for flags, help_ in (
        (("-v", "--verbose"), "debug logging; a bug shows its traceback"),
        (("-q", "--quiet"), "no progress bars, even on a terminal"),
    ):
        if not any(f in p._option_string_actions for f in flags):
            p.add_argument(*flags, action="store_true", help=help_, **kw)


def _everywhere(p: argparse.ArgumentParser, seen: set[int]) -> None:
    """Global options on every subcommand, nested ones and those other modules register included."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                if id(sp) not in seen:
                    seen.add(id(sp))
                    _global_options(sp, top=False)
                    sp.set_defaults(_prog=sp.prog)
                    _everywhere(sp, seen)


def build_parser() -> argparse.ArgumentParser:
    """The ``gpuwarden`` parser: each subcommand registered by its module (``register(sub)``)."""
    p = _Parser(
        prog="gpuwarden",
        description="GPU-fleet fault detection on streaming telemetry.",
        epilog="Exit status: 0 ok, 1 findings (rule errors, failed tests or actions), 2 usage, "
        "3 unreadable or invalid input or config, 4 broker or service unavailable, "
        "70 internal error (see -v), 130 interrupted.",
    )
    p.add_argument("--version", action="version", version=f"gpuwarden {version()}")
    _global_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)

    for register in (
        sim.register,
        demo.register,
        replay.register,
        rules.register,
        evaluate.register,
        report.register,
        serve.register,
        record.register,
    ):
        register(sub)
    from producers.cli import register as register_produce

    register_produce(sub)
    from pipeline.remediation.cli import register as register_remediation

    register_remediation(sub, known_faults=_shipped_faults)
    topics.register(sub)
    return p


def _fail(args: argparse.Namespace, message: str) -> None:
    print(f"{getattr(args, '_prog', 'gpuwarden')}: {message}", file=sys.stderr)
    if args.verbose:
        traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    """Run one ``gpuwarden`` command; return its exit status (listed in the README).

    A mistake of the user's (an option, a missing file, a bad config, a broker that does not
    answer) is one line on stderr and its own status; anything else is a bug: one line and 70,
    the traceback with ``-v``.
    """
    parser = build_parser()
    _everywhere(parser, set())
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, a usage mistake (told by _Parser.error)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    progress.set_quiet(args.quiet)
    # `gpuwarden sim --out - | head` should end quietly; but a service, a producer or remediate
    # must not die of a peer that hangs up (a socket write to a closed connection raises instead).
    if getattr(args, "_prog", "").split(" ")[1:2] not in (["serve"], ["remediate"], ["produce"], ["record"]):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return int(args.func(args) or 0)
    except GpuwardenError as e:
        _fail(args, str(e))
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit as e:
        if isinstance(e.code, str):  # raise SystemExit("...") of a subcommand: a usage mistake
            _fail(args, e.code.removeprefix(f"{getattr(args, '_prog', '')}: "))
            return EXIT_USAGE
        raise
    except OSError as e:
        if e.filename is None:
            _fail(args, f"internal error: {e!r} (run with -v for the traceback)")
            return EXIT_INTERNAL
        _fail(args, f"{e.filename}: {e.strerror or e}")
        return EXIT_INPUT
    except Exception as e:  # noqa: BLE001 - the last resort: a bug, told in one line (-v: traceback)
        if type(e).__module__.startswith("kafka."):
            _fail(args, f"Kafka: {e}")
            return EXIT_UNAVAILABLE
        _fail(
            args,
            f"internal error: {type(e).__name__}: {e}" + ("" if args.verbose else " (run with -v for the traceback)"),
        )
        return EXIT_INTERNAL


def _shipped_faults() -> frozenset[str]:
    """The shipped detectors' faults, for ``routes test`` (imported only when it runs: the
    detectors are slow to import for every other command)."""
    from pipeline.detection import shipped_faults

    return shipped_faults()


if __name__ == "__main__":
    raise SystemExit(main())
