"""Hot reload of rules: on SIGHUP or when a rule file changes, between batches.

A broken file is reported and never replaces the working set: the engine keeps running the
rules it had. Rules whose definition did not change keep their state (pending and firing
alerts, windows), so a reload does not re-fire or forget anything.
"""

from __future__ import annotations

import hashlib
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.engine import Engine
from pipeline.rules.diagnostics import Diagnostic
from pipeline.rules.loader import load_rules, rule_files

log = logging.getLogger(__name__)


@dataclass
class ReloadResult:
    applied: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    rules: int = 0


class RuleReloader:
    """Watches rule files for one engine. Call ``poll()`` from the driver loop between batches."""

    def __init__(self, paths: list[str | Path], engine: Engine) -> None:
        self.paths = list(paths)
        self.engine = engine
        self._fingerprint = self.fingerprint()
        self._requested = False

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for f in rule_files(self.paths):
            h.update(str(f).encode())
            try:
                h.update(f.read_bytes())
            except OSError:
                h.update(b"<unreadable>")
        return h.hexdigest()

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
        ruleset, diags = load_rules(self.paths, tick=self.engine.config.tick)
        for d in diags:
            (log.error if d.is_error else log.warning)("rules: %s", d)
        if ruleset is None:
            log.error("rules: reload refused, %d error(s); still running the previous %d rule(s)",
                      sum(d.is_error for d in diags), len(self.engine.rules or []))
            return ReloadResult(False, diags, len(self.engine.rules or []))
        self.engine.set_rules(ruleset)
        log.warning("rules: reloaded %d rule(s) from %d file(s)", len(ruleset), len(ruleset.sources))
        return ReloadResult(True, diags, len(ruleset))
