"""Alertmanager-style route tree: matchers, ``continue``, grouping settings inherited down the tree.

An alert enters at the root (which matches everything). Children are tried in order; the first
that matches takes the alert and is walked the same way, unless it says ``continue: true``, in
which case the following siblings are tried too. A route none of whose children match is a
match itself. Matchers are Alertmanager's: ``name="value"``, ``!=``, ``=~`` and ``!~`` (regular
expressions anchored at both ends). Names are alert fields (``family``, ``fault``, ``severity``,
``rule``, ``host``, ``gpu``, ``link``, ``job``, ``state``) or label names; a label the alert does
not have is the empty string, as in Alertmanager.

Regular expressions are Alertmanager's: RE2 syntax, matched against the whole value, in time
linear in the value (``pipeline/remediation/regexes.py``); one RE2 does not accept is a load
error naming its key (and, from a file, its line). Limits and their errors: docs/remediation.md
("Limits").

Grouping differs from Alertmanager in one default: ``group_by`` defaults to ``["..."]`` (every
alert its own group) because remediation acts per alert, and a group acts once per
``repeat_interval`` on the alert that opened it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.durations import duration as parse_duration
from pipeline.errors import ConfigError, UsageError
from pipeline.remediation.regexes import Anchored, RegexError
from pipeline.remediation.specs import RouteSpec
from pipeline.schema import AlertEvent

_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(\S*))\s*')
MAX_MATCHER_CHARS = 1024  # one matcher's text
ALERT_FIELDS = ("family", "fault", "severity", "rule", "host", "gpu", "link", "job", "state", "id")
EVERY_ALERT = "..."


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    regex: Anchored | None = None

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
            try:
                regex = Anchored(value)
            except RegexError as e:
                raise ConfigError(key, f"matcher {text!r}: bad regular expression (RE2 syntax): {e}") from None
        return cls(name, op, value, regex)

    def matches(self, fields: dict[str, str]) -> bool:
        v = fields.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = self.regex.matches(v)  # type: ignore[union-attr]
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

    def matched_labels(self) -> set[str]:
        """The names every matcher of the tree reads (``incident mode`` asks whether any route
        reads an incident's own labels).

        >>> from pipeline.remediation.specs import RouteSpec
        >>> tree = RouteTree.build(RouteSpec(receiver="r", routes=[RouteSpec(matchers=['action="drain_node"'])]))
        >>> sorted(tree.matched_labels())
        ['action']
        """
        out: set[str] = set()
        todo = [self.root]
        while todo:
            r = todo.pop()
            out.update(m.name for m in r.matchers)
            todo += r.children
        return out

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
