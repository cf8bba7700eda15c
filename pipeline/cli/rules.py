"""``gpuwarden rules check|test|alertmanager-config``: load rule files, run rule unit tests, print
the causality of ``incidents.yaml`` as an Alertmanager configuration."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipeline import progress
from pipeline.cli.args import existing_paths
from pipeline.resources import rules_dir


def _tests_of(path: str) -> Path:
    """Where the tests of the rules under ``path`` are (docs/rules.md, "Testing a rule"): a
    directory's ``tests/``, and for a rule file the ``tests/`` beside it."""
    p = Path(path)
    return p / "tests" if p.is_dir() else p.parent / "tests"


def _cmd_rules_check(args: argparse.Namespace) -> int:
    from pipeline.errors import InputError
    from pipeline.rules import diagnostics as D
    from pipeline.rules.diagnostics import Diagnostic
    from pipeline.rules.loader import NO_RULES_HERE, load_rules, no_rules_warnings, rule_files, without_rule_files
    from pipeline.rules.testing import tested_rules

    from pipeline.detection import ports_path
    from pipeline.rules.portconfig import load_port_config

    args.paths = args.paths or [str(rules_dir())]
    if empty := without_rule_files(existing_paths(args.paths)):
        raise InputError(f"{empty[0]}: no rule files (*.yaml, *.yml) in this directory; nothing checked")
    ruleset, diags = load_rules(args.paths)
    if unfilled := [d for d in diags if d.message == NO_RULES_HERE]:  # as a directory without rule files
        raise InputError(f"{unfilled[0].file}: {NO_RULES_HERE}; nothing checked")
    if (ports := ports_path(args.paths)) is not None:  # the NIC port checks' settings beside the rules
        diags += load_port_config(ports)[1]
    if ruleset is not None:
        # A rule file without a rule (empty, ``rules: []``) checks nothing: say so.
        diags += no_rules_warnings(ruleset)
        # Sigma's rule: no stable rule without a test. With --strict a pack without tests has
        # every rule untested; without it, the lint runs where there are tests to read.
        tests = sorted({t for t in map(_tests_of, args.paths) if t.is_dir()})
        if tests or args.strict:
            covered = tested_rules(tests) if tests else set()
            for r in ruleset.rules:
                if r.meta.name not in covered:
                    f, _, line = r.spec.source.rpartition(":")
                    diags.append(
                        Diagnostic(
                            f, int(line), 5, r.meta.name, "no test exercises this rule", D.LINT_NO_TEST, "warning"
                        )
                    )
    for d in sorted(diags):
        print(d)
    errors = sum(d.is_error for d in diags)
    warnings = len(diags) - errors
    n_files = len(rule_files(args.paths))
    if errors or (args.strict and warnings):
        print(f"{errors} error(s), {warnings} warning(s) in {n_files} file(s)", file=sys.stderr)
        return 1
    assert ruleset is not None  # no errors: the rules loaded
    print(
        f"ok: {len(ruleset)} rules in {n_files} file(s)" + (f", {warnings} warning(s)" if warnings else ""),
        file=sys.stderr,
    )
    return 0


def _cmd_rules_test(args: argparse.Namespace) -> int:
    from pipeline.errors import InputError
    from pipeline.rules.testing import T_NO_TESTS, run_tests, test_files

    args.paths = args.paths or [str(rules_dir() / "tests")]
    paths = existing_paths(args.paths)
    # As `rules check` for a directory without rule files: nothing to run is an input error
    # (exit 3) saying so, not "0 passed, 0 failed" and a bare exit 1.
    for p in paths:
        if Path(p).is_dir() and not test_files([p]):
            raise InputError(f"{p}: no test files (*.yaml, *.yml) in this directory; nothing tested")
    empty: list[Path] = []
    with progress.status("rule tests") as update:
        results = run_tests(paths, on_test=lambda i, n: update(f"rule tests: {i + 1}/{n}"), on_empty=empty.append)
    if not results:  # every file read holds no test (a file that cannot be read is a result)
        raise InputError(f"no tests in {', '.join(map(str, empty))} (empty, or tests: []); nothing tested")
    for f in empty:
        print(f"{f}:1:1: warning: no tests in this file (empty, or tests: []) [{T_NO_TESTS}]", file=sys.stderr)
    failed = [r for r in results if not r.ok]
    for r in results:
        mark = "ok  " if r.ok else "FAIL"
        print(f"{mark} {r.file}: {r.name}")
        for line in r.report():
            print(f"     {line}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _cmd_rules_alertmanager_config(args: argparse.Namespace) -> int:
    from pipeline.errors import InputError
    from pipeline.incidents.amconfig import render
    from pipeline.incidents.config import IncidentConfigError, require_config

    source = existing_paths([args.incidents])[0] if args.incidents else str(rules_dir() / "incidents.yaml")
    try:
        cfg = require_config(source)
    except IncidentConfigError as e:
        for problem in e.diagnostics:
            print(str(problem), file=sys.stderr)
        raise InputError(f"{source} does not load; no configuration printed") from None
    sys.stdout.write(render(cfg, source, args.receiver))
    return 0


def register(sub: Any) -> None:
    """Add ``gpuwarden rules`` to the subcommands ``sub``."""
    ru = sub.add_parser("rules", help="check and unit-test detection rules")
    rsub = ru.add_subparsers(dest="rules_command", required=True)
    rc = rsub.add_parser("check", help="load rule files and report every problem as file:line:col")
    rc.add_argument("paths", nargs="*", help="rule files or directories (default: the shipped packs)")
    rc.add_argument("--strict", action="store_true", help="lint warnings are errors too")
    rc.set_defaults(func=_cmd_rules_check)
    rt = rsub.add_parser("test", help="run rule unit tests (rules/tests/*.yaml)")
    rt.add_argument("paths", nargs="*", help="rule test files or directories (default: the shipped packs' tests)")
    rt.set_defaults(func=_cmd_rules_test)
    ra = rsub.add_parser(
        "alertmanager-config",
        help="print an Alertmanager route and inhibit_rules reproducing incidents.yaml's causality",
    )
    ra.add_argument("--incidents", metavar="FILE", help="incidents file (default: the shipped rules/incidents.yaml)")
    ra.add_argument("--receiver", default="gpuwarden", help="the route's receiver name (default: gpuwarden)")
    ra.set_defaults(func=_cmd_rules_alertmanager_config)
