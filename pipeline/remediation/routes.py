"""Alertmanager-style route tree: matchers, ``continue``, grouping settings inherited down the tree.

An alert enters at the root (which matches everything). Children are tried in order; the first
that matches takes the alert and is walked the same way, unless it says ``continue: true``, in
which case the following siblings are tried too. A route none of whose children match is a
match itself. Matchers are Alertmanager's: ``name="value"``, ``!=``, ``=~`` and ``!~`` (regular
expressions anchored at both ends). Names are alert fields (``family``, ``fault``, ``severity``,
``rule``, ``host``, ``gpu``, ``link``, ``job``, ``state``) or label names; a label the alert does
not have is the empty string, as in Alertmanager.

Alertmanager runs its expressions on RE2, which is linear in the input; Python's ``re``
backtracks, and ``host=~"(a+)+"`` takes seconds per alert on a long enough host name. So a
pattern that could backtrack badly is refused at load time (``regex_problem``): nested
repeats, alternatives inside a repeat that can match the same text, backreferences, more than
``MAX_LONG_REPEATS`` open-ended repeats. A regular expression is matched with ``fullmatch``
only against values of at most ``MAX_MATCH_CHARS`` characters (every RFC 1123 host name);
a longer value matches no ``=~`` or ``!~`` matcher, so a route with one never takes it.
Limits and their errors: docs/remediation.md ("Limits").

Grouping differs from Alertmanager in one default: ``group_by`` defaults to ``["..."]`` (every
alert its own group) because remediation acts per alert, and a group acts once per
``repeat_interval`` on the alert that opened it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# re's own parser (private modules typeshed does not describe): the one exact reading of a pattern.
from re import _constants as _sre  # type: ignore[attr-defined]
from re import _parser as _sre_parse  # type: ignore[attr-defined]
from typing import Any

from pipeline.durations import duration as parse_duration
from pipeline.errors import ConfigError, UsageError
from pipeline.remediation.specs import RouteSpec
from pipeline.schema import AlertEvent

_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(\S*))\s*')
MAX_MATCHER_CHARS = 1024  # one matcher's text
MAX_MATCH_CHARS = 256  # values a regular expression is run on (host names are <= 253)
MAX_LONG_REPEATS = 3  # open-ended repeats in one pattern: n of them cost up to len**n steps
_LONG = 16  # a repeat allowed more than this many times counts as open-ended
_NESTED_COMBOS = 1000  # (x{1,3}.){3}: bounded nesting with at most this many ways to split
_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT)
ALERT_FIELDS = ("family", "fault", "severity", "rule", "host", "gpu", "link", "job", "state", "id")
EVERY_ALERT = "..."


class _Slow(ValueError):
    pass


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` may take more than polynomial-with-small-degree time to match, or None.

    A syntactic check on Python's own parse of the pattern: it may refuse a pattern that is in
    fact fast (``(a|ab)+c``), never one that is slow in the ways above.
    """
    if len(pattern) > MAX_MATCHER_CHARS:
        return f"longer than {MAX_MATCHER_CHARS} characters"
    try:
        parsed = _sre_parse.parse(pattern)
    except (re.error, OverflowError) as e:  # OverflowError: x{99999999999}
        return f"bad regular expression: {e}"
    except RecursionError:
        return "nested too deeply"
    try:
        long = _long_repeats(list(parsed), None, 0)
    except _Slow as e:
        return str(e)
    if long > MAX_LONG_REPEATS:
        return (
            f"more than {MAX_LONG_REPEATS} open-ended repeats (*, +, {{n,}}): matching may take "
            "len(value)**n steps; split it into several matchers"
        )
    return None


def _long_repeats(items: list, outer: int | None, depth: int) -> int:
    """Open-ended repeats along a sequence (a choice counts its worst alternative).

    ``outer``: the count of the repeat this sequence is inside (None: none). Raises ``_Slow``.
    """
    if depth > 32:
        raise _Slow("nested too deeply")
    n = 0
    for op, av in items:
        if op in _REPEATS:
            _lo, hi, body = av
            inner = outer
            if hi > 1:
                if outer is not None:
                    unbounded = outer == _sre.MAXREPEAT or hi == _sre.MAXREPEAT
                    if unbounded or outer * math.log(hi) > math.log(_NESTED_COMBOS):
                        raise _Slow(
                            "a repeat inside a repeat, as in (a+)+, can take exponential time; "
                            "write it without the nesting"
                        )
                    inner = _sre.MAXREPEAT  # a third level is refused
                else:
                    inner = hi
                n += hi > _LONG
            n += _long_repeats(list(body), inner, depth + 1)
        elif op is _sre.SUBPATTERN:
            n += _long_repeats(list(av[3]), outer, depth + 1)
        elif op is _sre.ATOMIC_GROUP:
            n += _long_repeats(list(av), outer, depth + 1)
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            n += _long_repeats(list(av[1]), outer, depth + 1)
        elif op is _sre.BRANCH:
            alts = [list(a) for a in av[1]]
            if outer is not None:
                _distinct(alts)
            n += max(_long_repeats(a, outer, depth + 1) for a in alts)
        elif op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            raise _Slow("backreferences are not supported (Alertmanager's RE2 syntax has none)")
    return n


def _distinct(alts: list[list]) -> None:
    """Alternatives inside a repeat must part on different literal characters: (a|ab)+ on
    "aaaa...b" tries every way of splitting the a's."""
    lit = _sre.LITERAL
    for i, a in enumerate(alts):
        for b in alts[i + 1 :]:
            k = 0
            while k < len(a) and k < len(b) and a[k] == b[k] and a[k][0] is lit:
                k += 1
            if not (k < len(a) and k < len(b) and a[k][0] is lit and b[k][0] is lit):
                raise _Slow(
                    "alternatives inside a repeat that can match the same text, as in (a|ab)+, "
                    "can take exponential time; make each start with a different literal"
                )


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    regex: re.Pattern[str] | None = None

    @classmethod
    def parse(cls, text: str, key: str) -> "Matcher":
        if len(text) > MAX_MATCHER_CHARS:
            raise ConfigError(key, f"matcher is longer than {MAX_MATCHER_CHARS} characters")
        m = _MATCHER.fullmatch(text)
        if not m:
            raise ConfigError(key, f'matcher {text!r} is not name="value" (ops =, !=, =~, !~)')
        name, op = m.group(1), m.group(2)
        value = m.group(3) if m.group(3) is not None else m.group(4)
        value = re.sub(r"\\(.)", r"\1", value) if m.group(3) is not None else value
        regex = None
        if op in ("=~", "!~"):
            problem = regex_problem(value)
            if problem is not None:
                raise ConfigError(key, f"matcher {text!r}: {problem}")
            try:
                # fullmatch, not ^...$: $ also matches before a trailing newline.
                regex = re.compile(f"(?:{value})")
            except re.error as e:
                raise ConfigError(key, f"matcher {text!r}: bad regular expression: {e}") from None
        return cls(name, op, value, regex)

    def matches(self, fields: dict[str, str]) -> bool:
        v = fields.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        if len(v) > MAX_MATCH_CHARS:
            return False  # neither =~ nor !~: see the module's docstring
        hit = self.regex.fullmatch(v) is not None  # type: ignore[union-attr]
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


def alert_fields(alert: AlertEvent) -> dict[str, str]:
    """What matchers and ``group_by`` see: labels, overlaid by the alert's own fields."""
    out = {k: str(v) for k, v in alert.labels.items()}
    for k in ALERT_FIELDS:
        v = alert.family if k == "family" else getattr(alert, k)
        if v is None and k == "job":
            v = alert.labels.get("job")
        out[k] = "" if v is None else str(v)
    return out


@dataclass
class Route:
    """One node of the compiled tree, with inherited settings resolved."""

    path: str
    name: str
    receiver: str
    matchers: list[Matcher]
    group_by: list[str]
    group_wait: float
    repeat_interval: float
    cont: bool
    children: list["Route"] = field(default_factory=list)

    def group_key(self, alert: AlertEvent) -> str:
        if EVERY_ALERT in self.group_by:
            return f"{self.path}|id={alert.id}"
        f = alert_fields(alert)
        return self.path + "|" + ",".join(f"{k}={f.get(k, '')}" for k in self.group_by)


@dataclass
class RouteMatch:
    route: Route
    trail: list[Route]  # root .. route

    @property
    def receiver(self) -> str:
        return self.route.receiver

    def describe(self) -> str:
        return " > ".join(r.name for r in self.trail)


class RouteTree:
    def __init__(self, root: Route) -> None:
        self.root = root

    @classmethod
    def build(cls, spec: RouteSpec) -> "RouteTree":
        """Compile a route spec (matchers parsed, settings inherited); errors name the key."""

        def make(s: RouteSpec, path: str, parent: Route | None) -> Route:
            if parent is None and s.matchers:
                raise ConfigError("route.matchers", "the root route matches every alert; put matchers on child routes")
            if parent is None and s.continue_:
                raise ConfigError("route.continue", "the root route cannot continue")
            r = Route(
                path=path,
                name=s.name or (path if parent is not None else "root"),
                receiver=s.receiver or (parent.receiver if parent else ""),
                matchers=[Matcher.parse(t, f"{path}.matchers[{i}]") for i, t in enumerate(s.matchers)],
                group_by=list(s.group_by) if s.group_by is not None else (parent.group_by if parent else [EVERY_ALERT]),
                group_wait=(
                    parse_duration(s.group_wait, f"{path}.group_wait")
                    if s.group_wait is not None
                    else parent.group_wait
                    if parent
                    else 0.0
                ),
                repeat_interval=(
                    parse_duration(s.repeat_interval, f"{path}.repeat_interval")
                    if s.repeat_interval is not None
                    else parent.repeat_interval
                    if parent
                    else 4 * 3600.0
                ),
                cont=s.continue_,
            )
            r.children = [make(c, f"{path}.routes[{i}]", r) for i, c in enumerate(s.routes)]
            return r

        return cls(make(spec, "route", None))

    def match(self, alert: AlertEvent) -> list[RouteMatch]:
        """Every route the alert ends at, in tree order (more than one only through ``continue``)."""
        fields = alert_fields(alert)
        out: list[RouteMatch] = []

        def visit(r: Route, trail: list[Route]) -> None:
            trail = trail + [r]
            matched_child = False
            for c in r.children:
                if all(m.matches(fields) for m in c.matchers):
                    visit(c, trail)
                    matched_child = True
                    if not c.cont:
                        break
            if not matched_child:
                out.append(RouteMatch(r, trail))

        visit(self.root, [])
        return out


def alert_from_args(pairs: list[str]) -> AlertEvent:
    """``fault=hbm_ecc_burst severity=critical host=n1 cluster=c1`` -> a test alert (``routes test``)."""
    kw: dict[str, Any] = {
        "id": "routes-test",
        "state": "firing",
        "fault": "",
        "severity": "",
        "rule": "routes-test",
        "ts": 0.0,
        "started_at": 0.0,
    }
    labels: dict[str, str] = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise UsageError(f"{p}: expected name=value")
        if k in ("fault", "severity", "rule", "host", "job", "state", "id"):
            kw[k] = v
        elif k in ("gpu", "link"):
            try:
                kw[k] = int(v)
            except ValueError:
                raise UsageError(f"{k}: expected an integer, got {v!r}") from None
        elif k == "family":
            raise UsageError("family: comes from the fault name (fault=hbm_... has family hbm); give fault=")
        else:
            labels[k] = v
    if not kw["fault"]:
        raise UsageError("fault: give fault=<name>, e.g. fault=hbm_ecc_burst")
    return AlertEvent(labels=labels, **kw)
