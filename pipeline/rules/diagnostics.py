"""Rule-file diagnostics: every problem with a position, a message and a stable code.

Printed as ``file:line:col: rule "name": message [CODE]`` (Prometheus/promtool and Falco style).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Stable codes (documented in docs/rules.md). Errors:
YAML_SYNTAX = "R001"  # the file is not valid YAML
YAML_TAG = "R002"  # a YAML tag (e.g. !!python/object): refused, rules are plain data
SHAPE = "R003"  # wrong structure (rules is not a list, a rule is not a mapping, ...)
UNKNOWN_KEY = "R004"
MISSING_KEY = "R005"
BAD_VALUE = "R006"  # bad severity / level / fault family / name
BAD_DURATION = "R007"
DUPLICATE = "R008"  # duplicate rule name
TEMPLATE = "R009"  # summary template refers to an unknown name or is malformed
# Limits on what a rule file may hold (docs/rules.md, "Limits"): hostile or runaway input is
# refused at load time, so nothing later has to be defensive on the hot path.
TOO_LARGE = "R010"  # file bytes, YAML nodes, string length, rules in one file
YAML_ALIAS = "R011"  # too many aliases, aliases that expand too far, an alias inside itself
YAML_DEPTH = "R012"  # YAML nested too deep
INTERNAL = "R013"  # an unexpected failure while loading: the file is refused, not the process
UNREADABLE = "R014"  # a rule file that cannot be read: missing, no regular file (a FIFO), a symlink loop
EXPR_SYNTAX = "E101"
UNKNOWN_METRIC = "E102"  # with "did you mean"
UNKNOWN_FUNCTION = "E103"
ARITY = "E104"
TYPE = "E105"  # type mismatch (bool vs number, counter vs gauge, bits on non-bitmask)
UNKNOWN_BIT = "E106"
UNKNOWN_MODEL = "E107"
UNSUPPORTED = "E108"  # valid syntax the evaluator does not support at this level
EXPR_TOO_LONG = "E109"  # more characters than expr.MAX_CHARS
EXPR_TOO_DEEP = "E110"  # nested deeper than expr.MAX_DEPTH
EXPR_TOO_MANY_TERMS = "E111"  # more operands than expr.MAX_TERMS
BAD_NUMBER = "E112"  # a literal that is not finite or is out of range
# Lint warnings (fatal with --strict):
LINT_NO_TEST = "W201"  # a rule no test exercises
LINT_NO_FOR = "W202"  # a rule on a noisy gauge with no for:
LINT_COUNTER_AS_GAUGE = "W203"  # a counter compared as a raw value (almost always wants increase/rate)
LINT_UNKNOWN_COUNTER = "W204"  # a NIC port counter name one or two letters from a known one
NO_RULES = "W205"  # a rule file that holds no rule (empty, ``rules: []``)


@functools.total_ordering
@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int
    col: int
    rule: str | None
    message: str
    code: str
    severity: str = "error"  # or "warning"

    def __str__(self) -> str:
        where = f'rule "{self.rule}": ' if self.rule else ""
        kind = "" if self.severity == "error" else "warning: "
        return f"{self.file}:{self.line}:{self.col}: {kind}{where}{self.message} [{self.code}]"

    def _key(self) -> tuple:
        # By position; a file-level diagnostic (rule None) may share a position with a rule's.
        return (self.file, self.line, self.col, self.rule or "", self.message, self.code, self.severity)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Diagnostic):
            return NotImplemented
        return self._key() < other._key()

    @property
    def is_error(self) -> bool:
        return self.severity == "error"
