"""Hot reload of rules: on SIGHUP or when a rule file changes, between batches. The one
implementation: ``serve`` reloads through it (pipeline/service/upkeep.py).

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
from typing import Any, Callable, Protocol, Sequence

from pipeline.engine import Engine
from pipeline.rules import diagnostics as D
from pipeline.rules.diagnostics import Diagnostic
from pipeline.rules.loader import compile_rules, no_rules_warnings, read_rules, rule_files, without_rule_files

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


class Reloadable(Protocol):
    """What a reload installs a rule set in: an ``Engine``, or a driver's detector."""

    @property
    def rules(self) -> Any: ...

    def set_rules(self, rules: Any) -> None: ...


class RuleReloader:
    """Watches rule files for one engine or many. Call ``poll()`` from the driver loop between
    batches.

    ``engines``: the engine, or a callable giving the engines to reload (the service's, one per
    partition it owns at the time). The files are read once per reload and each engine gets a
    rule set of its own compiled from those bytes (a set holds its rules' state), so every engine
    runs the same version of the files. ``tick``: the rules' tick (default: the engine's);
    ``models``: the model names the rules may read (``load_rules``)."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        engines: Engine | Callable[[], Sequence[Reloadable]],
        *,
        tick: float | None = None,
        models: set[str] | None = None,
    ) -> None:
        self.paths: list[str | Path] = list(paths)
        self.engine = engines if isinstance(engines, Engine) else None
        self._engines: Callable[[], Sequence[Reloadable]] = (
            (lambda: [engines]) if isinstance(engines, Engine) else engines
        )
        if tick is None:
            if not isinstance(engines, Engine):
                raise TypeError("RuleReloader: give tick with a callable of engines")
            tick = engines.config.tick
        self.tick = tick
        self.models = models
        self.rules = len(self.engine.rules or []) if self.engine is not None else 0
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
        """Read the files once and install a fresh set in every engine, or in none: a set that
        does not load, for any engine, is refused and each keeps the rules it had; so is a folder
        left without a YAML file (a deploy half done), which start-up refuses too."""
        empty = without_rule_files(self.paths)
        if empty:
            diag = Diagnostic(empty[0], 1, 1, None, "no rule files (*.yaml, *.yml) in this directory", D.SHAPE)
            log.error("rules: reload refused, %s; still running the previous %d rule(s)", diag, self.rules)
            return ReloadResult(False, [diag], self.rules)
        try:
            src = read_rules(self.paths)
            ruleset, diags = compile_rules(src, tick=self.tick, models=self.models)
            if ruleset is not None:  # an empty rule file, said at each reload as at start-up
                diags = [*diags, *no_rules_warnings(ruleset)]
            for d in diags:
                (log.error if d.is_error else log.warning)("rules: %s", d)
            if ruleset is not None:
                engines = list(self._engines())
                sets = [ruleset] + [compile_rules(src, tick=self.tick, models=self.models)[0] for _ in engines[1:]]
                if any(s is None for s in sets):  # pragma: no cover - the same bytes compile the same
                    raise RuntimeError("a rule set compiled once did not compile again")
                for eng, rs in zip(engines, sets):
                    eng.set_rules(rs)
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
                self.rules,
            )
            return ReloadResult(False, diags, self.rules)
        self.rules = len(ruleset)
        log.warning("rules: reloaded %d rule(s) from %d file(s)", len(ruleset), len(ruleset.sources))
        return ReloadResult(True, diags, len(ruleset))
