"""Hot reload of rules: on SIGHUP or when a rule file changes, between batches.

A broken file is reported and never replaces the working set: the engine keeps running the
rules it had. Nothing a rule file holds may stop the engine: a failure of any kind while
reading, loading or installing a new set is a refused reload, logged with its reason. Rules
whose definition did not change keep their state (pending and firing alerts, windows), so a
reload does not re-fire or forget anything.
"""

from __future__ import annotations

import hashlib
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipeline.engine import Engine
from pipeline.rules import diagnostics as D
from pipeline.rules.diagnostics import Diagnostic
from pipeline.rules.loader import load_rules, rule_files

log = logging.getLogger(__name__)


@dataclass
class ReloadResult:
    applied: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    rules: int = 0


def fingerprint(paths: Sequence[str | Path]) -> str:
    """A digest of the rule files under ``paths`` (names and bytes): it changes when they do.

    Needs no engine, so a driver with many engines (the service, one per partition) watches the
    files once."""
    h = hashlib.sha256()
    try:
        files = rule_files(list(paths))
    except OSError as e:  # a directory that cannot be listed: a change the reload will report
        h.update(f"<unlistable {e}>".encode())
        return h.hexdigest()
    for f in files:
        h.update(str(f).encode())
        try:
            # In blocks: a huge file (refused by the loader) must not be read into memory here.
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            h.update(b"<unreadable>")
    return h.hexdigest()


class RuleReloader:
    """Watches rule files for one engine. Call ``poll()`` from the driver loop between batches."""

    def __init__(self, paths: Sequence[str | Path], engine: Engine) -> None:
        self.paths: list[str | Path] = list(paths)
        self.engine = engine
        self._fingerprint = self.fingerprint()
        self._requested = False

    def fingerprint(self) -> str:
        return fingerprint(self.paths)

    def request(self, *_: object) -> None:
        """Ask for a reload at the next ``poll`` (safe to call from a signal handler)."""
        self._requested = True

    def install_sighup(self) -> None:
        signal.signal(signal.SIGHUP, self.request)

    def poll(self) -> ReloadResult | None:
        """Reload if asked to or if a file changed; None when there was nothing to do."""
        fp = self.fingerprint()
        if not self._requested and fp == self._fingerprint:
            return None
        self._requested = False
        self._fingerprint = fp
        return self.reload()

    def reload(self) -> ReloadResult:
        try:
            ruleset, diags = load_rules(self.paths, tick=self.engine.config.tick)
            for d in diags:
                (log.error if d.is_error else log.warning)("rules: %s", d)
            if ruleset is not None:
                self.engine.set_rules(ruleset)
        except Exception as e:  # noqa: BLE001 - load_rules refuses bad input itself; this is the backstop
            log.exception("rules: reload failed")
            ruleset, diags = (
                None,
                [
                    Diagnostic(
                        str(self.paths[0]) if self.paths else "(rules)",
                        1,
                        1,
                        None,
                        f"reload failed ({type(e).__name__}: {str(e)[:200]})",
                        D.INTERNAL,
                    )
                ],
            )
        if ruleset is None:
            log.error(
                "rules: reload refused, %d error(s); still running the previous %d rule(s)",
                sum(d.is_error for d in diags),
                len(self.engine.rules or []),
            )
            return ReloadResult(False, diags, len(self.engine.rules or []))
        log.warning("rules: reloaded %d rule(s) from %d file(s)", len(ruleset), len(ruleset.sources))
        return ReloadResult(True, diags, len(ruleset))
