"""``incidents.yaml`` -> an ``IncidentConfig``, or every problem at once as ``file:line:col``
diagnostics with stable codes, the way rule files are checked (docs/rules.md#incidents).

The file is read through ``pipeline.yamlsafe`` (bounded size, nesting and aliases) into nodes,
so every value keeps its position, and turned into plain values by hand: any tag outside plain
YAML is refused, and nothing in it is ever executed. Rule names are matched as shell-style
patterns (``nvlink_*``), by ``fnmatch``.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from pipeline import typedconfig, yamlsafe
from pipeline.durations import parse_duration
from pipeline.errors import ConfigError
from pipeline.incidents.xidbuckets import buckets

# Stable codes (docs/rules.md#incidents).
YAML_SYNTAX = "I001"
YAML_TAG = "I002"
SHAPE = "I003"
UNKNOWN_KEY = "I004"
MISSING_KEY = "I005"
BAD_VALUE = "I006"
BAD_DURATION = "I007"
DUPLICATE = "I008"
TOO_LARGE = "I010"
YAML_ALIAS = "I011"
YAML_DEPTH = "I012"
UNREADABLE = "I013"

LIMITS = yamlsafe.Limits(max_bytes=256 << 10, max_depth=16, max_aliases=50, max_nodes=20_000, max_string=4096)
_LIMIT_CODES = {
    yamlsafe.SIZE: TOO_LARGE,
    yamlsafe.STRING: TOO_LARGE,
    yamlsafe.ALIAS: YAML_ALIAS,
    yamlsafe.DEPTH: YAML_DEPTH,
}
MAX_ENTRIES = 200  # causality entries, policies, patterns in one list
MAX_HOLD = 60.0  # seconds a possible symptom may wait for its cause (``hold``)
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_PATTERN = re.compile(r"[a-z0-9_*?\[\]]{1,64}")
# A number YAML reads other than as decimal digits: octal 010, sexagesimal 1:30, 0x10, 1_000.
_NOT_DECIMAL = re.compile(r"[:_xXoObB]|^[-+]?0[0-9]")

_POLICY_NARROWS = {"xid": ("xids", "rules"), "alerts": ("rules",), "incidents": ()}  # what each count reads
SEVERITIES = ("info", "warning", "critical")
REACHES = ("gpu", "host", "comm")
COUNTS = ("xid", "alerts", "incidents")
PERS = ("gpu", "host")

FILE_KEYS = {
    "description",
    "join_window",
    "quiet",
    "hold",
    "actions",
    "default_action",
    "rule_actions",
    "causality",
    "policies",
    "application_xids",
}
CAUSE_KEYS = {"name", "cause", "explains", "reach", "within", "description"}
POLICY_KEYS = {"name", "count", "per", "threshold", "window", "action", "xids", "rules", "reason", "description"}
APP_KEYS = {"rules", "buckets", "xids", "repeat", "window", "description"}


@dataclass(frozen=True)
class Diagnostic:
    """One problem of an incidents file, printed ``file:line:col: message [code]``."""

    file: str
    line: int
    col: int
    message: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message} [{self.code}]"


def _matches(patterns: tuple[str, ...], rule: str) -> bool:
    return any(fnmatch.fnmatchcase(rule, p) for p in patterns)


_GLOB_CACHE = 4096  # rule names one matcher remembers (a deployment has a few hundred rules)


class _Globs:
    """Shell-style patterns as one regex, with what each rule name asked of it remembered: the
    stage asks every causality entry about every rule of an incident near an alert, for every
    alert, and a file may hold 200 entries of a hundred patterns each."""

    __slots__ = ("_rx", "_seen")

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self._rx = re.compile("|".join(map(fnmatch.translate, patterns))) if patterns else None
        self._seen: dict[str, bool] = {}

    def __call__(self, rule: str) -> bool:
        hit = self._seen.get(rule)
        if hit is None:
            hit = self._rx is not None and self._rx.match(rule) is not None
            if len(self._seen) >= _GLOB_CACHE:
                self._seen.clear()
            self._seen[rule] = hit
        return hit


@dataclass(frozen=True)
class Cause:
    """Alerts of the ``cause`` rules explain alerts of the ``explains`` rules within ``reach``, and,
    with ``within``, only those that start at most that long after the latest alert of a ``cause``
    rule started (a fault that follows it; a later one on the host is another fault)."""

    name: str
    cause: tuple[str, ...]
    explains: tuple[str, ...]
    reach: str  # gpu: the same GPU; host: its host; comm: its host and communicators its alerts name
    within: float | None = None  # seconds; None: as long as the incident takes alerts
    _cause_m: _Globs = field(init=False, repr=False, compare=False, hash=False)
    _explains_m: _Globs = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cause_m", _Globs(self.cause))
        object.__setattr__(self, "_explains_m", _Globs(self.explains))

    def links(self, root_rules: Any, rule: str) -> bool:
        """Whether an incident holding ``root_rules`` explains an alert of ``rule``."""
        return self.explains_rule(rule) and self.caused_by(root_rules)

    def explains_rule(self, rule: str) -> bool:
        """Whether this entry explains an alert of ``rule`` (given an incident that causes it)."""
        return self._explains_m(rule)

    def caused_by(self, rules: Any) -> bool:
        """Whether an incident holding ``rules`` is a cause of this entry."""
        return any(map(self._cause_m, rules))


@dataclass(frozen=True)
class Policy:
    """A repeat-offender policy: ``threshold`` of what ``count`` counts, per GPU or host, in
    ``window`` seconds, escalate the incident to ``action``."""

    name: str
    count: str  # xid | alerts | incidents
    per: str  # gpu | host
    threshold: int
    window: float
    action: str
    xids: frozenset[int] = frozenset()
    rules: tuple[str, ...] = ()
    reason: str = ""

    def counts(self, rule: str, xid: int | None) -> bool:
        """Whether a firing alert of ``rule`` (about ``xid``) is one of what this policy counts."""
        if self.count == "xid":
            return xid is not None and xid in self.xids and (not self.rules or _matches(self.rules, rule))
        if self.count == "alerts":
            return _matches(self.rules, rule)
        return False


@dataclass(frozen=True)
class ApplicationXids:
    """XIDs that are an application's, not the GPU's: an alert of ``rules`` about one opens an
    incident only at its ``repeat``-th time on one GPU within ``window``."""

    rules: tuple[str, ...] = ()
    xids: frozenset[int] = frozenset()
    repeat: int = 3
    window: float = 3600.0

    def applies(self, rule: str, xid: int | None) -> bool:
        return xid is not None and xid in self.xids and _matches(self.rules, rule)


@dataclass(frozen=True)
class IncidentConfig:
    """What the incident stage reads: windows, the action ladder, causality and policies."""

    join_window: float = 300.0
    quiet: float = 300.0
    actions: tuple[str, ...] = ("watch", "drain_node")
    default_action: dict[str, str] = field(default_factory=dict)
    rule_actions: tuple[tuple[str, str], ...] = ()
    causality: tuple[Cause, ...] = ()
    policies: tuple[Policy, ...] = ()
    application_xids: ApplicationXids = ApplicationXids()
    # Event time a possible symptom waits for a cause on its host (pipeline/incidents/hold.py).
    hold: float = 5.0

    def rank(self, action: str) -> int:
        """An action's place on the ladder (higher escalates); -1 for one not on it."""
        return self.actions.index(action) if action in self.actions else -1

    def action_for(self, rule: str, severity: str) -> str:
        """The action an alert calls for: the first ``rule_actions`` pattern it matches, else its
        severity's ``default_action``, else the lowest rung."""
        for pattern, action in self.rule_actions:
            if fnmatch.fnmatchcase(rule, pattern):
                return action
        return self.default_action.get(severity, self.actions[0])


class IncidentConfigError(ValueError):
    """An incidents file that does not load; ``diagnostics`` says every problem."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("; ".join(map(str, diagnostics)))
        self.diagnostics = diagnostics


class _Reader:
    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text
        self.diags: list[Diagnostic] = []
        self._ctor = yaml.SafeLoader("")

    def err(self, node: Any, message: str, code: str, line: int | None = None, col: int | None = None) -> None:
        mark = getattr(node, "start_mark", None)
        ln = line if line is not None else (mark.line + 1 if mark else 1)
        cl = col if col is not None else (mark.column + 1 if mark else 1)
        self.diags.append(Diagnostic(self.path, ln, cl, message, code))

    def scalar(self, node: Any) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return yamlsafe.Shape(node)
        try:
            return self._ctor.construct_object(node, deep=True)
        except yamlsafe.BAD_SCALAR as e:  # ``!!bool maybe`` raises KeyError, ``!!int ""`` IndexError
            self.err(node, yamlsafe.unbuilt(node, e), BAD_VALUE)
            return None

    def tags_ok(self, root: Any) -> bool:
        ok, stack, seen = True, [root], set()
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if n.tag not in _SAFE_TAGS:
                self.err(n, f"YAML tag {n.tag!r} is not allowed in an incidents file (plain data only)", YAML_TAG)
                ok = False
            elif isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    if not isinstance(k, yaml.ScalarNode):
                        self.err(k, "a mapping key must be a plain name", SHAPE)
                        ok = False
                    stack += [k, v]
            elif isinstance(n, yaml.SequenceNode):
                stack += list(n.value)
        return ok

    def mapping(self, node: Any, keys: set[str], what: str) -> dict[str, tuple[Any, Any]] | None:
        """``key -> (key node, value node)`` of a mapping node; unknown and repeated keys reported."""
        if not isinstance(node, yaml.MappingNode):
            self.err(node, f"{what} must be a mapping", SHAPE)
            return None
        out: dict[str, tuple[Any, Any]] = {}
        for k, v in node.value:
            key = self.scalar(k)
            if not isinstance(key, str) or key not in keys:
                self.err(k, f"{what}: unknown key {key!r} (expected: {', '.join(sorted(keys))})", UNKNOWN_KEY)
            elif key in out:
                self.err(k, f"{what}: key {key!r} given twice", DUPLICATE)
            else:
                out[key] = (k, v)
        return out

    def duration(self, node: Any, what: str, positive: bool = False) -> float | None:
        """Seconds; ``positive``: above 0 (a count within 0 s never reaches 2)."""
        value = self.scalar(node)
        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and _NOT_DECIMAL.search(node.value):
                # YAML 1.1 reads 010 as 8, 1:30 as 90 (is it 1h30m?), 0x10 as 16: not what a reviewer reads
                raise ValueError(f"{node.value!r} is not a duration (use e.g. 90s, 1m30s, 1h30m)")
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                secs = parse_duration(value)
                if positive and secs <= 0:
                    raise ValueError("must be longer than 0s")
                return secs
            raise ValueError(f"{value!r} is not a duration")
        except ValueError as e:
            self.err(node, f"{what}: {e}", BAD_DURATION)
            return None

    def count(self, node: Any, what: str, lo: int = 1, hi: int = 10_000) -> int | None:
        value = self.scalar(node)
        if type(value) is not int or not lo <= value <= hi:
            self.err(node, f"{what}: {value!r} is not a whole number from {lo} to {hi}", BAD_VALUE)
            return None
        return value

    def name(self, node: Any, what: str) -> str | None:
        value = self.scalar(node)
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            self.err(node, f"{what}: {value!r} is not a name (lower case, digits and _)", BAD_VALUE)
            return None
        return value

    def choice(self, node: Any, what: str, choices: tuple[str, ...]) -> str | None:
        value = self.scalar(node)
        if value not in choices:
            self.err(node, f"{what}: {value!r} is not one of {', '.join(choices)}", BAD_VALUE)
            return None
        return str(value)

    def items(self, node: Any, what: str) -> list[Any] | None:
        if not isinstance(node, yaml.SequenceNode):
            self.err(node, f"{what} must be a list", SHAPE)
            return None
        if len(node.value) > MAX_ENTRIES:
            self.err(node.value[MAX_ENTRIES], f"{what}: more than {MAX_ENTRIES} entries", TOO_LARGE)
            return None
        return list(node.value)

    def patterns(self, node: Any, what: str) -> tuple[str, ...] | None:
        nodes = self.items(node, what)
        if nodes is None:
            return None
        out = []
        for n in nodes:
            value = self.scalar(n)
            if not isinstance(value, str) or not _PATTERN.fullmatch(value):
                self.err(n, f"{what}: {value!r} is not a rule name or pattern (a-z, 0-9, _, *, ?, [])", BAD_VALUE)
                return None
            out.append(value)
        return tuple(out)

    def xids(self, node: Any, what: str) -> frozenset[int] | None:
        nodes = self.items(node, what)
        if nodes is None:
            return None
        out = set()
        for n in nodes:
            x = self.count(n, what, 1, 1_000_000)
            if x is None:
                return None
            out.add(x)
        return frozenset(out)


def _required(r: _Reader, node: Any, got: dict[str, Any], keys: tuple[str, ...], what: str) -> bool:
    missing = [k for k in keys if k not in got]
    for k in missing:
        r.err(node, f"{what}: missing key {k!r}", MISSING_KEY)
    return not missing


def _actions(r: _Reader, got: dict[str, tuple[Any, Any]]) -> tuple[str, ...] | None:
    if "actions" not in got:
        return IncidentConfig.actions
    nodes = r.items(got["actions"][1], "actions")
    if nodes is None:
        return None
    names = [r.name(n, "actions") for n in nodes]
    if any(n is None for n in names):
        return None
    if not names:
        r.err(got["actions"][1], "actions: the ladder needs at least one action", BAD_VALUE)
        return None
    if len(set(names)) != len(names):
        r.err(got["actions"][1], "actions: an action is named twice", DUPLICATE)
        return None
    return tuple(n for n in names if n is not None)


def _action(r: _Reader, node: Any, what: str, ladder: tuple[str, ...]) -> str | None:
    return r.choice(node, what, ladder)


def _cause(r: _Reader, node: Any, i: int) -> Cause | None:
    got = r.mapping(node, CAUSE_KEYS, f"causality[{i}]")
    if got is None or not _required(r, node, got, ("name", "cause", "explains"), f"causality[{i}]"):
        return None
    name = r.name(got["name"][1], f"causality[{i}].name")
    what = f"causality {name or i}"
    cause = r.patterns(got["cause"][1], f"{what}: cause")
    explains = r.patterns(got["explains"][1], f"{what}: explains")
    reach = r.choice(got["reach"][1], f"{what}: reach", REACHES) if "reach" in got else "host"
    within = r.duration(got["within"][1], f"{what}: within", positive=True) if "within" in got else None
    empty = [k for k, pats in (("cause", cause), ("explains", explains)) if pats == ()]
    for key in empty:  # an entry that can never link anything, nor inhibit anything in Alertmanager
        r.err(got[key][1], f"{what}: {key} needs at least one rule or pattern", BAD_VALUE)
    if empty:
        return None
    if name is None or cause is None or explains is None or reach is None or ("within" in got and within is None):
        return None
    return Cause(name, cause, explains, reach, within)


def _policy(r: _Reader, node: Any, i: int, ladder: tuple[str, ...]) -> Policy | None:
    got = r.mapping(node, POLICY_KEYS, f"policies[{i}]")
    keys = ("name", "count", "per", "threshold", "window", "action")
    if got is None or not _required(r, node, got, keys, f"policies[{i}]"):
        return None
    name = r.name(got["name"][1], f"policies[{i}].name")
    what = f"policy {name or i}"
    count = r.choice(got["count"][1], f"{what}: count", COUNTS)
    per = r.choice(got["per"][1], f"{what}: per", PERS)
    threshold = r.count(got["threshold"][1], f"{what}: threshold", 2)
    window = r.duration(got["window"][1], f"{what}: window", positive=True)
    action = _action(r, got["action"][1], f"{what}: action", ladder)
    xids = r.xids(got["xids"][1], f"{what}: xids") if "xids" in got else frozenset()
    rules = r.patterns(got["rules"][1], f"{what}: rules") if "rules" in got else ()
    reason = r.scalar(got["reason"][1]) if "reason" in got else ""
    if count == "xid" and xids == frozenset():  # None: a bad list, already reported
        r.err(node, f"{what}: count xid needs the xids it counts", MISSING_KEY)
        return None
    if count == "alerts" and rules == ():
        r.err(node, f"{what}: count alerts needs the rules it counts", MISSING_KEY)
        return None
    unused = [k for k in ("xids", "rules") if k in got and count is not None and k not in _POLICY_NARROWS[count]]
    for k in unused:  # it would be read as narrowing what is counted, and narrow nothing
        r.err(got[k][0], f"{what}: count {count} does not use {k}", BAD_VALUE)
    if unused:
        return None
    if count == "xid" and per == "host" or count == "incidents" and per == "gpu":
        r.err(got["per"][1], f"{what}: {count} are counted per {'gpu' if count == 'xid' else 'host'}", BAD_VALUE)
        return None
    if not isinstance(reason, str):
        r.err(got["reason"][1], f"{what}: reason must be text", BAD_VALUE)
        return None
    parts = (name, count, per, threshold, window, action, xids, rules)
    if any(p is None for p in parts):
        return None
    assert name and count and per and threshold and window is not None and action and xids is not None
    return Policy(name, count, per, threshold, window, action, xids, rules or (), reason)


def _application(r: _Reader, node: Any) -> ApplicationXids | None:
    got = r.mapping(node, APP_KEYS, "application_xids")
    if got is None or not _required(r, node, got, ("rules", "repeat", "window"), "application_xids"):
        return None
    rules = r.patterns(got["rules"][1], "application_xids: rules")
    repeat = r.count(got["repeat"][1], "application_xids: repeat", 1)
    # A window of 0 suppressed these XIDs' incidents for good: no repeat falls within it.
    window = r.duration(got["window"][1], "application_xids: window", positive=True)
    xids: set[int] = set()
    if "buckets" in got:
        known = buckets()
        for n in r.items(got["buckets"][1], "application_xids: buckets") or []:
            b = r.scalar(n)
            if not isinstance(b, str) or b not in known or not b:
                r.err(n, f"application_xids: bucket {b!r} is not in the XID catalogue", BAD_VALUE)
                return None
            xids |= known[b]
    if "xids" in got:
        more = r.xids(got["xids"][1], "application_xids: xids")
        if more is None:
            return None
        xids |= more
    if rules is None or repeat is None or window is None:
        return None
    return ApplicationXids(rules, frozenset(xids), repeat, window)


def _build(r: _Reader, root: Any) -> IncidentConfig | None:
    got = r.mapping(root, FILE_KEYS, "the incidents file")
    if got is None:
        return None
    ladder = _actions(r, got)
    if ladder is None:
        return None
    base = IncidentConfig(actions=ladder)
    join = r.duration(got["join_window"][1], "join_window") if "join_window" in got else base.join_window
    quiet = r.duration(got["quiet"][1], "quiet") if "quiet" in got else base.quiet
    hold = r.duration(got["hold"][1], "hold") if "hold" in got else base.hold
    if hold is not None and not 0 <= hold <= MAX_HOLD:
        # Every incident event waits behind a held alert: a long hold delays the fleet's pages.
        r.err(got["hold"][1], f"hold: {hold:g}s is not from 0s to {MAX_HOLD:g}s", BAD_DURATION)
    defaults: dict[str, str] = {}
    if "default_action" in got:
        m = r.mapping(got["default_action"][1], set(SEVERITIES), "default_action") or {}
        for sev, (_, v) in m.items():
            a = _action(r, v, f"default_action.{sev}", ladder)
            if a is not None:
                defaults[sev] = a
    rule_actions: list[tuple[str, str]] = []
    if "rule_actions" in got:
        node = got["rule_actions"][1]
        if not isinstance(node, yaml.MappingNode):
            r.err(node, "rule_actions must be a mapping of rule (pattern) to action", SHAPE)
        elif len(node.value) > MAX_ENTRIES:
            r.err(node, f"rule_actions: more than {MAX_ENTRIES} entries", TOO_LARGE)
        else:
            for k, v in node.value:
                pat = r.scalar(k)
                if not isinstance(pat, str) or not _PATTERN.fullmatch(pat):
                    r.err(k, f"rule_actions: {pat!r} is not a rule name or pattern", BAD_VALUE)
                    continue
                if any(pat == p for p, _ in rule_actions):  # the first would win, silently
                    r.err(k, f"rule_actions: {pat!r} is given twice", DUPLICATE)
                    continue
                a = _action(r, v, f"rule_actions.{pat}", ladder)
                if a is not None:
                    rule_actions.append((pat, a))
    causes = _list(r, got, "causality", _cause)
    policies = _list(r, got, "policies", lambda rr, n, i: _policy(rr, n, i, ladder))
    app = _application(r, got["application_xids"][1]) if "application_xids" in got else ApplicationXids()
    if r.diags or join is None or quiet is None or hold is None or app is None:
        return None
    return IncidentConfig(join, quiet, ladder, defaults, tuple(rule_actions), tuple(causes), tuple(policies), app, hold)


def _list(r: _Reader, got: dict[str, tuple[Any, Any]], key: str, build: Callable[[_Reader, Any, int], Any]) -> list:
    if key not in got:
        return []
    nodes = r.items(got[key][1], key) or []
    out, names = [], set()
    for i, n in enumerate(nodes):
        item = build(r, n, i)
        if item is None:
            continue
        if item.name in names:
            r.err(n, f"{key}: {item.name!r} is named twice", DUPLICATE)
        names.add(item.name)
        out.append(item)
    return out


def parse_config(text: str, path: str = "<incidents>") -> tuple[IncidentConfig | None, list[Diagnostic]]:
    """An incidents file's text -> its config, or None and every problem found.

    >>> cfg, diags = parse_config("join_window: 2m\\nactions: [watch, drain_node]\\n")
    >>> cfg.join_window, diags
    (120.0, [])
    >>> print(parse_config("quiet: soon\\n", "i.yaml")[1][0])
    i.yaml:1:8: quiet: 'soon' is not a duration (use e.g. 30s, 5m, 1h30m) [I007]
    """
    r = _Reader(path, text)
    try:
        root = yamlsafe.compose(text, LIMITS)
    except yamlsafe.YamlLimitError as e:
        r.err(None, f"YAML: {e.message}", _LIMIT_CODES[e.kind], line=e.line, col=e.col)
        return None, r.diags
    except yaml.YAMLError as e:
        problem, line, col = yamlsafe.syntax_error(e, text)
        r.err(None, f"YAML syntax: {problem}", YAML_SYNTAX, line=line, col=col)
        return None, r.diags
    if root is None:
        return IncidentConfig(), []
    if not r.tags_ok(root):
        return None, r.diags
    try:
        cfg = _build(r, root)
    except RecursionError:  # bounded by LIMITS.max_depth; kept so no input can crash a driver
        r.err(None, "the file is nested too deeply to read", UNREADABLE)
        return None, r.diags
    return (cfg if not r.diags else None), r.diags


def load_config(path: str | Path) -> tuple[IncidentConfig | None, list[Diagnostic]]:
    """Read and check an incidents file (see ``parse_config``); an unreadable file is a diagnostic."""
    p = Path(path)
    try:  # no more than the limit allows into memory (/dev/zero), no FIFO waited on
        text = typedconfig.read_text(p, LIMITS)
    except ConfigError as e:
        return None, [Diagnostic(str(p), 1, 1, f"cannot read the file: {e.reason}", UNREADABLE)]
    return parse_config(text, str(p))


def require_config(path: str | Path) -> IncidentConfig:
    """The config in ``path``; raises ``IncidentConfigError`` with every diagnostic when it does
    not load."""
    cfg, diags = load_config(path)
    if cfg is None:
        raise IncidentConfigError(diags)
    return cfg


def default_config(rules: str | Path | None = None) -> IncidentConfig:
    """The config beside a rule directory (``incidents.yaml``), else the shipped one.

    Raises ``IncidentConfigError`` when that file does not load."""
    from pipeline.resources import rules_dir

    if rules is not None:
        p = Path(rules)
        cand = p / "incidents.yaml" if p.is_dir() else p.parent / "incidents.yaml"
        if cand.is_file():
            return require_config(str(cand))
    return require_config(str(rules_dir() / "incidents.yaml"))
