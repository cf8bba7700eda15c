"""Rule files -> a RuleSet, or every problem at once as ``file:line:col`` diagnostics.

YAML is read with PyYAML's safe composer into nodes (so every value keeps its line and column)
and turned into plain values by hand; any tag outside plain YAML (``!!python/...``) is refused.
Nothing from a rule file is ever executed: conditions go through our own parser.

A rule file is input from anyone who can edit it, and a hot reload reads it inside ``serve``: its
size, YAML aliases and nesting are bounded (``pipeline.yamlsafe``), and any failure, even one of
a kind nobody foresaw, becomes a diagnostic that refuses the file instead of an exception
(limits and codes in docs/rules.md, "Limits").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from pipeline import yamlsafe
from pipeline.catalog import FIELDS
from pipeline.rules import diagnostics as D
from pipeline.rules.compile import CompileError, compile_expr
from pipeline.rules.context import BOOL
from pipeline.rules.windows import WindowStore
from pipeline.rules.diagnostics import Diagnostic
from pipeline.rules.durations import parse_duration
from pipeline.rules.expr import ExprSyntaxError
from pipeline.rules.ruleset import Rule, RuleSet, RuleSpec
from pipeline.rules.template import TemplateError, parse_template
from pipeline.rules.xids import TEXT_NAMES as XID_TEXT_NAMES
from pipeline.schema import FAMILIES, fault_family

RULE_KEYS = {
    "name",
    "fault",
    "severity",
    "level",
    "condition",
    "for",
    "keep_firing_for",
    "summary",
    "description",
    "labels",
    "values",
}
REQUIRED = ("name", "fault", "severity", "condition")
FILE_KEYS = {"rules", "description"}
SEVERITIES = ("critical", "warning", "info")
LEVELS = ("gpu", "host")
LATER_LEVELS = ("link", "comm", "job")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}
# The shipped packs use a few KB and no aliases; these leave room for generated files.
LIMITS = yamlsafe.Limits(max_bytes=1 << 20, max_depth=32, max_aliases=100, max_nodes=100_000, max_string=16 << 10)
MAX_RULES = 1000  # rules in one file
UNREADABLE, NO_RULES = D.UNREADABLE, D.NO_RULES  # the names drivers import from here
# A directory named whose rule files hold no rule (empty, ``rules: []``) and no other YAML file.
NO_RULES_HERE = "no rules in the rule files of this directory (each is empty or has rules: [])"
# A number YAML 1.1 reads other than as the decimal digits written: octal 010 (8 s), sexagesimal
# 1:30 (90 s), 0x10, 0b10, 1_000 (as pipeline/incidents/config.py refuses them, I007).
_NOT_DECIMAL = re.compile(r"[:_xXoObB]|^[-+]?0[0-9]")
# A name in ``values:``: what a summary placeholder can name (pipeline/rules/template.py).
_VALUE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LIMIT_CODES = {
    yamlsafe.SIZE: D.TOO_LARGE,
    yamlsafe.STRING: D.TOO_LARGE,
    yamlsafe.ALIAS: D.YAML_ALIAS,
    yamlsafe.DEPTH: D.YAML_DEPTH,
}


def rule_files(paths: Sequence[str | Path]) -> list[Path]:
    """The rule files named by ``paths`` (files, or directories' ``*.yaml``/``*.yml``, not tests/),
    each once, in the order first named: ``rules check my my`` or ``my/mine.yaml my`` would load
    every rule twice and report each as a duplicate of itself. A path named explicitly is kept
    whatever it is (a FIFO, a missing file): reading it says why it is no rule file.
    """
    out: list[Path] = []
    seen: set[str] = set()
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                x
                for x in p.iterdir()
                if x.suffix in (".yaml", ".yml")
                and x.is_file()
                and x.name not in ("models.yaml", "routes.yaml", "incidents.yaml", "hang.yaml")
            )
        else:
            found = [p]
        for x in found:
            real = os.path.realpath(x)
            if real not in seen:
                seen.add(real)
                out.append(x)
    return out


def without_rule_files(paths: Sequence[str | Path]) -> list[str]:
    """The directories among ``paths`` that hold no YAML file at all (no rule file, no
    ``models.yaml``): a wrong path, a pack not written yet. Loading them gives no rule and no error, so a driver or ``rules check``
    pointed at one would run the built-in checks alone, saying nothing; they refuse it instead.
    (A directory whose rule files hold no rule is refused by loading it: ``NO_RULES_HERE``.)

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as empty:
    ...     without_rule_files([empty]) == [empty]
    True
    """
    return [str(p) for p in paths if Path(p).is_dir() and not _any_yaml(Path(p))]


def _any_yaml(d: Path) -> bool:
    """Whether ``d`` holds a YAML file a driver reads: rules, or only ``models.yaml`` or
    ``hang.yaml`` (a pack of models alone is a pack)."""
    return any(x.suffix in (".yaml", ".yml") and x.is_file() for x in d.iterdir())


def _rules_only(d: Path) -> list[str]:
    """The rule files of directory ``d`` when they are its only YAML files (no ``models.yaml``,
    ``hang.yaml``, ...: a pack of those alone is a pack); else none."""
    rules = rule_files([d])
    if any(x.suffix in (".yaml", ".yml") and x.is_file() and x not in rules for x in d.iterdir()):
        return []
    return [str(f) for f in rules]


def describe_loaded(rules: Any, models: Any, where: str) -> str:
    """What a driver loaded, in one line: ``12 rules (7 files) from rules/, 4 online models``
    (``rules`` and ``models`` are a detector's stages, or None).

    >>> describe_loaded(None, None, "rules/")
    '0 rules (0 files) from rules/'
    """
    n_files = len(getattr(rules, "sources", None) or [])
    return f"{len(rules.checks) if rules else 0} rules ({n_files} file{'s' * (n_files != 1)}) from {where}" + (
        f", {len(models.checks)} online models" if models else ""
    )


def no_rules_warnings(ruleset: RuleSet) -> list[Diagnostic]:
    """A ``NO_RULES`` (W205) warning for each file of a loaded ``ruleset`` that holds no rule
    (empty, ``rules: []``): ``rules check`` prints them, ``replay`` and ``serve`` (start-up and
    each hot reload) say them with the diagnostics of the load.

    >>> [str(d) for d in no_rules_warnings(RuleSet([], WindowStore(1.0), ["r.yaml"]))]
    ['r.yaml:1:1: warning: this file holds no rules [W205]']
    """
    with_rules = {r.spec.source.rpartition(":")[0] for r in ruleset.rules}
    return [
        Diagnostic(f, 1, 1, None, "this file holds no rules", NO_RULES, "warning")
        for f in ruleset.sources
        if f not in with_rules
    ]


class _FileLoader:
    def __init__(self, path: str, text: str, store: WindowStore, models: set[str]) -> None:
        self.path, self.text, self.store, self.models = path, text, store, models
        self.lines = text.splitlines()
        self.diags: list[Diagnostic] = []
        self.rules: list[tuple[Rule, Any]] = []
        self.bad: set[int] = set()
        self.names: list[tuple[str, Any]] = []  # every rule name seen, for duplicate checks
        # One constructor per file: a shared one would keep every scalar node of every reload
        # (construct_object memoizes by node).
        self._ctor = yaml.SafeLoader("")

    def err(
        self,
        node: Any,
        message: str,
        code: str,
        rule: str | None = None,
        *,
        line: int | None = None,
        col: int | None = None,
        severity: str = "error",
    ) -> None:
        mark = getattr(node, "start_mark", None)
        ln = line if line is not None else (mark.line + 1 if mark else 1)
        cl = col if col is not None else (mark.column + 1 if mark else 1)
        self.diags.append(Diagnostic(self.path, ln, cl, rule, message, code, severity))

    def value(self, node: Any) -> Any:
        """Plain Python value of a node whose tags were all checked (refused ones read as None)."""
        if id(node) in self.bad:
            return None
        if isinstance(node, yaml.MappingNode):
            return {self.value(k): self.value(v) for k, v in node.value}
        if isinstance(node, yaml.SequenceNode):
            return [self.value(v) for v in node.value]
        try:
            return self._ctor.construct_object(node, deep=True)
        except yamlsafe.BAD_SCALAR as e:  # an integer of 5000 digits, ``!!bool maybe``
            self.err(node, yamlsafe.unbuilt(node, e), D.BAD_VALUE)
            self.bad.add(id(node))
            return None

    def check_tags(self, node: Any) -> None:
        """Report every node with a tag outside plain YAML; remember them so they are never built."""
        stack, seen = [node], set()
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue  # an aliased node: reported once
            seen.add(id(n))
            if n.tag not in _SAFE_TAGS:
                self.err(n, f"YAML tag {n.tag!r} is not allowed in rule files (plain data only)", D.YAML_TAG)
                self.bad.add(id(n))
                continue
            if isinstance(n, yaml.MappingNode):
                keys: set[tuple[str, str]] = set()
                for k, v in n.value:
                    if not isinstance(k, yaml.ScalarNode):
                        # A list or mapping as a key (``? [a, b]``) cannot be a dict key.
                        self.err(k, "a mapping key must be a plain name or value", D.SHAPE)
                        self.bad.add(id(n))
                    elif (k.tag, k.value) in keys:
                        # YAML keeps the last one silently: a second 'condition:' or 'rules:'
                        # would replace the one a reviewer read.
                        self.err(k, f"key {k.value!r} given twice in this mapping", D.DUPLICATE)
                    else:
                        keys.add((k.tag, k.value))
                    stack += [k, v]
            elif isinstance(n, yaml.SequenceNode):
                stack += list(n.value)

    def tainted(self, node: Any) -> bool:
        stack = [node]
        while stack:
            n = stack.pop()
            if id(n) in self.bad:
                return True
            if isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    stack += [k, v]
            elif isinstance(n, yaml.SequenceNode):
                stack += list(n.value)
        return False

    def load(self) -> None:
        try:
            root = yamlsafe.compose(self.text, LIMITS)
        except yamlsafe.YamlLimitError as e:
            self.err(None, f"YAML: {e.message}", _LIMIT_CODES[e.kind], line=e.line, col=e.col)
            return
        except yaml.YAMLError as e:
            problem, line, col = yamlsafe.syntax_error(e, self.text)
            self.err(None, f"YAML syntax: {problem}", D.YAML_SYNTAX, line=line, col=col)
            return
        if root is None:
            return  # an empty file holds no rules
        self.check_tags(root)
        if id(root) in self.bad:
            return
        if not isinstance(root, yaml.MappingNode):
            self.err(root, "a rule file is a mapping with a 'rules:' list", D.SHAPE)
            return
        rules_node = None
        for k, v in root.value:
            key = self.value(k)
            if key not in FILE_KEYS:
                self.err(k, f"unknown key {key!r} (expected: {', '.join(sorted(FILE_KEYS))})", D.UNKNOWN_KEY)
            elif key == "rules":
                rules_node = v
        if rules_node is None:
            self.err(root, "missing 'rules:' list", D.SHAPE)  # docs/rules.md: R003, no `rules:` list
            return
        if not isinstance(rules_node, yaml.SequenceNode):
            self.err(rules_node, "'rules:' must be a list of rules", D.SHAPE)
            return
        if len(rules_node.value) > MAX_RULES:
            self.err(rules_node.value[MAX_RULES], f"more than {MAX_RULES} rules in one file; split it", D.TOO_LARGE)
            return
        for item in rules_node.value:
            try:
                self.rule(item)
            except Exception as e:  # noqa: BLE001 - the trust boundary: no input may crash the loader
                self.err(
                    item,
                    f"cannot load this rule ({type(e).__name__}: {str(e)[:200]}); "
                    "this is a gpuwarden bug, please report it",
                    D.INTERNAL,
                )

    def rule(self, node: Any) -> None:
        if self.tainted(node):
            return  # already reported; never build anything from it
        if not isinstance(node, yaml.MappingNode):
            self.err(node, "a rule is a mapping (name:, fault:, severity:, condition:, ...)", D.SHAPE)
            return
        keys: dict[str, tuple[Any, Any]] = {}
        for k, v in node.value:
            keys[str(self.value(k))] = (k, v)
        name_node = keys.get("name", (None, None))[1]
        name = str(self.value(name_node)) if name_node is not None else None
        before = len(self.diags)
        for key, (knode, _) in keys.items():
            if key not in RULE_KEYS:
                import difflib

                hint = difflib.get_close_matches(key, sorted(RULE_KEYS), n=1)
                more = f"; did you mean {hint[0]!r}?" if hint else ""
                self.err(knode, f"unknown key {key!r}{more}", D.UNKNOWN_KEY, name)
        for key in REQUIRED:
            if key not in keys:
                self.err(node, f"missing required key {key!r}", D.MISSING_KEY, name)
        if name is not None and name_node is not None:
            self.names.append((name, name_node))
        val = {k: self.value(v) for k, (_, v) in keys.items() if k in RULE_KEYS}
        if "name" in val and (not isinstance(val["name"], str) or not _NAME.fullmatch(val["name"])):
            self.err(keys["name"][1], f"rule name {val['name']!r} must be lower_snake_case", D.BAD_VALUE, name)
        fault = val.get("fault")
        if "fault" in val and (not isinstance(fault, str) or fault_family(fault) not in FAMILIES or "_" not in fault):
            self.err(
                keys["fault"][1],
                f"fault {fault!r} must start with its family ({', '.join(f + '_' for f in FAMILIES)})",
                D.BAD_VALUE,
                name,
            )
        if "severity" in val and val["severity"] not in SEVERITIES:
            self.err(
                keys["severity"][1],
                f"severity {val['severity']!r} must be one of {', '.join(SEVERITIES)}",
                D.BAD_VALUE,
                name,
            )
        level = val.get("level", "gpu")
        if level in LATER_LEVELS:
            self.err(keys["level"][1], f"level {level!r} is not supported yet (gpu and host are)", D.UNSUPPORTED, name)
        elif level not in LEVELS:
            self.err(
                keys["level"][1],
                f"level {level!r} must be one of {', '.join(LEVELS + LATER_LEVELS)}",
                D.BAD_VALUE,
                name,
            )
        durs = {}
        for key in ("for", "keep_firing_for"):
            if key in val and id(keys[key][1]) not in self.bad:
                dnode = keys[key][1]
                try:
                    if (
                        isinstance(val[key], (int, float))
                        and not isinstance(val[key], bool)
                        and _NOT_DECIMAL.search(dnode.value)
                    ):
                        # YAML 1.1 reads 010 as 8, 1:30 as 90 (or was it 1h30m?), 0x10 as 16,
                        # 1_000 as 1000: not the duration a reviewer reads (docs/rules.md: digits
                        # 0-9 only, in durations too).
                        raise ValueError(
                            f"{dnode.value!r} is not a duration: YAML reads it as {val[key]!r} "
                            "(write decimal seconds or a unit, e.g. 90s, 1m30s, 1h30m)"
                        )
                    durs[key] = parse_duration(val[key])
                except ValueError as e:
                    self.err(keys[key][1], f"{key}: {e}", D.BAD_DURATION, name)
        # The names the values give, for the summary's check below (None: 'values:' is not a
        # mapping, so which names it meant is not known).
        value_names = (
            set(map(str, val["values"])) if isinstance(val.get("values"), dict) else None if "values" in val else set()
        )
        for key in ("labels", "values"):
            if key in val and (
                not isinstance(val[key], dict)
                or not all(isinstance(a, str) and isinstance(b, (str, int, float)) for a, b in val[key].items())
            ):
                self.err(keys[key][1], f"{key}: must map names to strings", D.SHAPE, name)
                val[key] = {}
        if isinstance(val.get("values"), dict) and val["values"]:
            self.value_names(keys["values"][1], name)
        # The condition and named values: our own parser, errors pointed at the character.
        cond = self.expr(keys["condition"][1], val["condition"], name) if "condition" in keys else None
        if cond is not None and cond.type != BOOL:
            # A number as the condition is never true (a rule fires where it is 1): say so now.
            self.err(keys["condition"][1], f"a condition must be true or false, not a {cond.type}", D.TYPE, name)
            cond = None
        values = {}
        if val.get("values"):
            vnodes = {self.value(k): v for k, v in keys["values"][1].value}
            for vname, vsrc in val["values"].items():
                c = self.expr(vnodes[vname], str(vsrc), name)
                if c is not None:
                    values[vname] = c
        template: list = []
        summary = val.get("summary", "")
        if not isinstance(summary, str):
            self.err(keys["summary"][1], "summary must be a string", D.TEMPLATE, name)
            summary = ""
        try:
            template = parse_template(summary)
        except TemplateError as e:
            ln, cl = self.position(keys["summary"][1], e.pos)
            self.err(None, f"summary: {e.message}", D.TEMPLATE, name, line=ln, col=cl)
        else:
            # The names are judged against what the rule declares, whether or not its condition
            # and values compiled (their errors are reported already): a summary is not wrong
            # because the condition beside it is.
            known = {"host", "gpu", *(value_names or ()), *(cond.evidence if cond else {})}
            if cond is not None and FIELDS.require("xid").column in cond.columns:
                known |= set(XID_TEXT_NAMES)  # the XID catalogue's text (docs/rules.md#xids)
            # For a condition that did not compile, whether it reads xid is not known: its
            # text's names are not refused.
            unjudged = set(XID_TEXT_NAMES) if cond is None else set()
            for part in template:
                if value_names is None:
                    break  # 'values:' is not a mapping (reported above)
                if isinstance(part, tuple) and part[0] not in known and part[0] not in unjudged:
                    if FIELDS.resolve(part[0]) is not None:
                        continue  # any catalog field may be shown; it is read at alert time
                    import difflib

                    hint = difflib.get_close_matches(part[0], sorted(known), n=1)
                    more = f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(sorted(known))})"
                    ln, cl = self.position(keys["summary"][1], summary.find("{" + part[0]))
                    self.err(
                        None, f"summary refers to unknown name {part[0]!r}{more}", D.TEMPLATE, name, line=ln, col=cl
                    )
        # A missing or bad fault was reported (REQUIRED, the family check): isinstance only narrows.
        if len(self.diags) > before or cond is None or not isinstance(fault, str):
            return
        extra: set[int] = set()
        for part in template:  # catalog fields shown in the summary become evidence too
            if (
                isinstance(part, tuple)
                and part[0] not in cond.evidence
                and part[0] not in values
                and part[0] not in ("host", "gpu", *XID_TEXT_NAMES)
            ):
                fld = FIELDS.resolve(part[0])
                if fld is None:  # an unknown name was reported above
                    continue
                cond.evidence[part[0]] = lambda c, col=fld.column: c.view.filled[:, col]
                extra.add(fld.column)
        spec = RuleSpec(
            name=val["name"],
            fault=fault,
            severity=val["severity"],
            level=level,
            condition=val["condition"],
            for_s=durs.get("for", 0.0),
            keep_firing_for_s=durs.get("keep_firing_for", 0.0),
            summary=summary,
            description=str(val.get("description", "")),
            labels={k: str(v) for k, v in (val.get("labels") or {}).items()},
            values={k: str(v) for k, v in (val.get("values") or {}).items()},
            source=f"{self.path}:{node.start_mark.line + 1}",
        )
        rule = Rule(spec, cond, values, template, self.store)
        rule.extra_columns = extra
        self.rules.append((rule, node))

    def value_names(self, node: Any, rule: str | None) -> None:
        """Refuse a ``values:`` name a summary could not name or that shadows one it already
        has: ``{host}``, ``{gpu}``, a catalog field (read at alert time), the XID text. Shadowed,
        ``{host}`` would print the number, and ``gpu_util: gpu_temp * 2`` would show (and put in
        the evidence) a "gpu_util" that is no GPU utilisation."""
        for k, _ in node.value:
            key = self.value(k)
            if not isinstance(key, str):
                continue  # reported: 'values: must map names to strings'
            if not _VALUE_NAME.fullmatch(key):
                why = "is not a name a summary can use (letters, digits and _, not starting with a digit)"
            elif key in ("host", "gpu"):
                why = f"is the alert's {key}; name the value otherwise"
            elif key in XID_TEXT_NAMES:
                why = "is a name of the XID catalogue's text; name the value otherwise"
            elif (fld := FIELDS.resolve(key)) is not None and fld.alias == key:
                # Only the field's own name, its evidence key: another spelling (``temp``) is a
                # name of its own in the summary and the evidence, as packs have long used it.
                why = "is a catalog field: a summary's {" + key + "} would not show the field; name the value otherwise"
            else:
                continue
            self.err(k, f"values: {key!r} {why}", D.BAD_VALUE, rule)

    def expr(self, node: Any, src: Any, rule: str | None):
        if not isinstance(src, str):
            self.err(node, "an expression must be a string", D.EXPR_SYNTAX, rule)
            return None
        try:
            return compile_expr(src, self.store, self.models)
        except ExprSyntaxError as e:
            ln, cl = self.position(node, e.pos)
            self.err(None, e.message, e.code, rule, line=ln, col=cl)
        except CompileError as e:
            for one in getattr(e, "errors", [e]):  # every problem of the expression (CompileErrors)
                ln, cl = self.position(node, one.pos)
                self.err(None, one.message, one.code, rule, line=ln, col=cl)
        return None

    def position(self, node: Any, offset: int) -> tuple[int, int]:
        """File line/column of character ``offset`` of a scalar's value."""
        mark = node.start_mark
        style = getattr(node, "style", None)
        if style in ("|", ">"):
            # Block scalar: content starts on the next line; walk its lines (folded or not,
            # each line break is one character of the value).
            ln = mark.line + 1
            remaining = max(offset, 0)
            while ln < len(self.lines):
                raw = self.lines[ln]
                body = raw.lstrip()
                indent = len(raw) - len(body)
                if remaining <= len(body):
                    return ln + 1, indent + remaining + 1
                remaining -= len(body) + 1
                ln += 1
            return mark.line + 2, 1
        quote = 1 if style in ("'", '"') else 0
        value = node.value
        line_off = value.count("\n", 0, max(offset, 0))
        if line_off == 0:
            return mark.line + 1, mark.column + 1 + quote + max(offset, 0)
        last_nl = value.rfind("\n", 0, offset)
        raw = self.lines[mark.line + line_off] if mark.line + line_off < len(self.lines) else ""
        return mark.line + line_off + 1, (len(raw) - len(raw.lstrip())) + (offset - last_nl - 1) + 1


def load_rules(
    paths: Sequence[str | Path], *, tick: float = 1.0, models: set[str] | None = None
) -> tuple[RuleSet | None, list[Diagnostic]]:
    """Load every rule file under ``paths``. Returns (rule set, diagnostics); the set is None when
    any diagnostic is an error, so a broken file can never replace a working set."""
    try:
        return compile_rules(read_rules(paths), tick=tick, models=models)
    except Exception as e:  # noqa: BLE001 - a hot reload in `serve` calls this: refuse, never raise
        return None, [_internal(paths, e)]


@dataclass
class RuleSources:
    """The rule files under some paths, read once (``read_rules``): each readable file's name and
    text, and the diagnostics of those that are not. ``compile_rules`` makes a rule set of them as
    often as needed (one per engine: a set holds its rules' state)."""

    files: list[str]
    texts: list[tuple[str, str]]
    diags: list[Diagnostic]
    listed: bool = True  # False: the paths could not be listed (``diags`` says why)
    # Each directory named whose only YAML files are rule files, with those files: one where
    # none holds a rule is refused as a directory without rule files is (``NO_RULES_HERE``).
    packs: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)


def read_rules(paths: Sequence[str | Path]) -> RuleSources:
    """Read the rule files under ``paths``; never raises for a file that cannot be read."""
    try:
        files = rule_files(paths)
    except OSError as e:
        where = str(getattr(e, "filename", None) or paths[0])
        return RuleSources([], [], [Diagnostic(where, 1, 1, None, f"cannot read: {_why(e)}", UNREADABLE)], listed=False)
    texts: list[tuple[str, str]] = []
    diags: list[Diagnostic] = []
    for f in files:
        try:
            texts.append((str(f), _read(f)))
        except yamlsafe.YamlLimitError as e:
            diags.append(Diagnostic(str(f), 1, 1, None, f"YAML: {e.message}", D.TOO_LARGE))
        except UnicodeDecodeError as e:
            good = e.object[: e.start].decode("utf-8")  # what precedes the first bad byte is text
            line, col = _line_col(good, len(good))
            diags.append(
                Diagnostic(str(f), line, col, None, f"not UTF-8: byte 0x{e.object[e.start]:02x}", D.YAML_SYNTAX)
            )
        except OSError as e:
            diags.append(Diagnostic(str(f), 1, 1, None, f"cannot read: {_why(e)}", UNREADABLE))
    packs = list(dict.fromkeys((str(p), tuple(fs)) for p in map(Path, paths) if p.is_dir() and (fs := _rules_only(p))))
    return RuleSources([str(f) for f in files], texts, diags, packs=packs)


def _why(e: OSError) -> str:
    """What the system says of ``e``, without the errno and the path the diagnostic shows already
    (``Too many levels of symbolic links``, not ``[Errno 40] ...: 'r.yaml'``).

    >>> _why(FileNotFoundError(2, "No such file or directory", "r.yaml"))
    'No such file or directory'
    """
    return str(e.strerror or e)


def compile_rules(
    src: RuleSources, *, tick: float = 1.0, models: set[str] | None = None
) -> tuple[RuleSet | None, list[Diagnostic]]:
    """A fresh rule set of ``src`` (as ``load_rules``, without reading the files again)."""
    if not src.listed:
        return None, list(src.diags)
    try:
        return _compile(src, tick, models)
    except Exception as e:  # noqa: BLE001 - as load_rules: refuse, never raise
        return None, [_internal(src.files or ["(rules)"], e)]


def _internal(paths: Sequence[str | Path], e: Exception) -> Diagnostic:
    where = str(paths[0]) if paths else "(rules)"
    return Diagnostic(
        where,
        1,
        1,
        None,
        f"cannot load rules ({type(e).__name__}: {str(e)[:200]}); this is a gpuwarden bug, please report it",
        D.INTERNAL,
    )


def _line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of character ``offset`` of ``text``.

    >>> _line_col("ab\\ncd", 4)
    (2, 2)
    """
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _read(f: Path) -> str:
    """The file's text, refusing one that is no regular file (``yamlsafe.NotRegularFile``) and one over the
    size limit before reading it all."""
    with os.fdopen(yamlsafe.open_regular(f), "rb") as fh:
        data = fh.read(LIMITS.max_bytes + 1)
    if len(data) > LIMITS.max_bytes:
        raise yamlsafe.YamlLimitError(yamlsafe.SIZE, f"the file is over {LIMITS.max_bytes} bytes")
    return data.decode("utf-8")


def _compile(src: RuleSources, tick: float, models: set[str] | None) -> tuple[RuleSet | None, list[Diagnostic]]:
    store = WindowStore(tick)
    diags: list[Diagnostic] = list(src.diags)
    rules: list[Rule] = []
    names: list[tuple[str, Any, str]] = []
    empty: set[str] = set()  # files read whole that hold no rule and no problem
    for f, text in src.texts:
        fl = _FileLoader(f, text, store, models or set())
        try:
            fl.load()
        except Exception as e:  # noqa: BLE001 - refuse the file, keep reporting the others
            fl.err(
                None,
                f"cannot load this file ({type(e).__name__}: {str(e)[:200]}); "
                "this is a gpuwarden bug, please report it",
                D.INTERNAL,
            )
            fl.rules = []
        if not fl.rules and not fl.names and not fl.diags:
            empty.add(os.path.realpath(f))
        diags += fl.diags
        rules += [r for r, _ in fl.rules]
        names += [(n, node, f) for n, node in fl.names]
    for d, fs in src.packs:
        if all(os.path.realpath(f) in empty for f in fs):  # as a directory with no rule file
            diags.append(Diagnostic(d, 1, 1, None, NO_RULES_HERE, D.SHAPE))
    seen: dict[str, str] = {}
    for name, node, file in names:
        where = f"{file}:{node.start_mark.line + 1}"
        if name in seen:
            diags.append(
                Diagnostic(
                    file,
                    node.start_mark.line + 1,
                    node.start_mark.column + 1,
                    name,
                    f"duplicate rule name (first defined at {seen[name]})",
                    D.DUPLICATE,
                )
            )
        else:
            seen[name] = where
    diags.sort()
    if any(d.is_error for d in diags):
        return None, diags
    return RuleSet(rules, store, list(src.files)), diags
