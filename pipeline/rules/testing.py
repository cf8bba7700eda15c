"""Rule unit tests (``rules/tests/*.yaml``), run on the production engine and evaluator.

promtool-like::

    tests:
      - name: a hot GPU under load throttles
        interval: 1s                       # default 1s
        rule_files: [../thermal.yaml]      # default: every rule file beside tests/
        series:
          - host: n1
            gpu: 0
            values:
              gpu_util: 98x120             # 98, 121 times
              gpu_temp: 60+1x30 90x89      # 60, 61, ... 90, then 90 x 90
              clocks_event_reasons: 0x30 _ 104x88   # _ = not reported
        alerts:
          - at: 100s
            firing: [{rule: gpu_thermal_throttling, host: n1, gpu: 0}]
          - at: 20s
            firing: []                     # nothing fires at 20s
        never: [gpu_hbm_thermal_throttling] # must not fire at any time

Series notation: ``v`` one value, ``vxN`` N+1 copies, ``a+bxN`` / ``a-bxN`` N+1 values stepping
by b, ``_`` / ``_xN`` missing samples.

A test file is input like a rule file: a key the format does not have or gives twice, a YAML
tag, a value of the wrong type, an expected alert without its ``host:`` (or, for a GPU-level rule,
its ``gpu:``), a test name given twice, an unreadable file are failures of that test or file, never
an exception; a file holds at most ``MAX_TESTS`` tests and ``MAX_SAMPLES`` samples in all (each a
record in memory and a tick of engine time). Each failure keeps where in the file it is and a
stable code (``TestResult.report``: ``file:line:col: message [T00n]``, as rule files' diagnostics).
"""

from __future__ import annotations

import os

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from pipeline import resources, yamlsafe
from pipeline.catalog import FIELDS
from pipeline.engine import Engine, EngineConfig
from pipeline.recordchecks import MAX_GPU_INDEX
from pipeline.rules.durations import parse_duration
from pipeline.rules.loader import load_rules
from pipeline.schema import AlertEvent, dcgm

T0 = 1764403200.0
TEST_LIMITS = yamlsafe.Limits(max_bytes=4 << 20)  # series make test files longer than rule files
MAX_SAMPLES = 1_000_000  # per file, all tests: "1x99999999999" must be an error, not all the memory
MAX_TESTS = 1000  # per file, as rules: each test loads its rules and runs an engine
# ASCII digits only: Python reads any script's digits, and some look like others.
_TERM = re.compile(r"^(_|-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)(?:([+-][0-9]+(?:\.[0-9]+)?))?(?:x([0-9]+))?$")
FILE_KEYS = ("tests",)
TEST_KEYS = ("name", "interval", "rule_files", "series", "alerts", "never")
SERIES_KEYS = ("host", "gpu", "values")
CHECK_KEYS = ("at", "firing")
ALERT_KEYS = ("rule", "host", "gpu")
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}

# Stable codes of rule-test failures (docs/rules.md, "Testing a rule"), as rule files' R/E/W codes.
T_UNREADABLE = "T001"  # the test file cannot be read (YAML syntax, a tag, a limit, not UTF-8, ...)
T_BAD_INPUT = "T002"  # a test that is not what the format says (unknown key, bad series, no host:, ...)
T_FAILED = "T003"  # an expectation did not hold (at: what was firing, never: a rule fired)
T_UNKNOWN_RULE = "T004"  # a test names a rule its rule files do not have
T_RULES = "T005"  # the rule files a test runs on do not load
T_NO_TESTS = "T006"  # a warning: a test file with no tests in it
T_INTERNAL = "T013"  # the test could not be run: a gpuwarden bug (as R013)

Pos = tuple[int, int]  # 1-based line and column in a test file


class _Str(str):
    """A scalar of a test file, knowing where it was written (``pos``)."""

    pos: Pos | None = None


class _Seq(list):
    """A list of a test file, knowing where it starts (``pos``)."""

    pos: Pos | None = None


class _Map(dict):
    """A mapping of a test file, knowing where it starts (``pos``); its keys are ``_Str``."""

    pos: Pos | None = None


def _pos(v: Any) -> Pos | None:
    """Where ``v`` was written in its test file, if it was read from one."""
    return getattr(v, "pos", None)


class Failure(str):
    """What failed (the message, as a string), where in the test file (``pos``) and its code."""

    pos: Pos | None = None
    code: str = ""


def _failure(message: str, pos: Pos | None, code: str) -> Failure:
    f = Failure(message)
    f.pos, f.code = pos, code
    return f


class SeriesError(ValueError):
    """Bad test input; ``pos``: where in the test file, when the value it names was read from one."""

    def __init__(self, message: str, at: Any = None) -> None:
        super().__init__(message)
        self.pos = _pos(at)

    def where(self, at: Any) -> SeriesError:
        """This error, placed at ``at`` when it has no position of its own."""
        if self.pos is None:
            self.pos = _pos(at)
        return self


def expand_series(text: str | int | float, limit: int = MAX_SAMPLES) -> list[float | None]:
    """``'60+1x3 90x1 _'`` -> ``[60, 61, 62, 63, 90, 90, None]``; more than ``limit`` samples
    is a ``SeriesError``.

    >>> expand_series("1+2x2 _x1 5")
    [1.0, 3.0, 5.0, None, None, 5.0]
    """
    out: list[float | None] = []
    for term in str(text).split():
        m = _TERM.match(term)
        if not m or len(m.group(3) or "") > 9:  # 9 digits: already past any limit
            raise SeriesError(f"bad series term {term[:40]!r} (use v, vxN, a+bxN or _)")
        start, step, times = m.group(1), m.group(2), int(m.group(3) or 0)
        if len(out) + times + 1 > limit:
            raise SeriesError(f"series term {term[:40]!r}: more than {MAX_SAMPLES} samples in one test file")
        if start == "_":
            if step:
                raise SeriesError(f"bad series term {term!r}: '_' takes no step")
            out += [None] * (times + 1)
        else:
            a, b = float(start), float(step or 0)
            # The decoder drops a value past a double (NAN_FIELD): the engine never sees one.
            if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(a + b * times)):
                raise SeriesError(f"bad series term {term[:40]!r}: not a finite number")
            out += [a + b * i for i in range(times + 1)]
    return out


@dataclass
class TestResult:
    file: str
    name: str
    failures: list[str] = field(default_factory=list)  # each a ``Failure`` where it knows its place
    samples: int = 0  # of its series, counted against its file's MAX_SAMPLES
    pos: Pos | None = None  # where the test starts in its file

    @property
    def ok(self) -> bool:
        return not self.failures

    def report(self) -> list[str]:
        """The failures as printed: ``file:line:col: message [code]`` (the code ends the first
        line of a message of several); a line with no place of its own is printed as it is.

        >>> r = TestResult("t.yaml", "t", [_failure("at 5s: firing none", (7, 9), T_FAILED), "  note"])
        >>> r.failures.append(_failure("a\\n  b", None, T_BAD_INPUT))
        >>> r.report()
        ['t.yaml:7:9: at 5s: firing none [T003]', '  note', 't.yaml:1:1: a [T002]\\n  b']
        """
        out = []
        for f in self.failures:
            code = getattr(f, "code", "")
            if not code:
                out.append(str(f))
                continue
            line, col = getattr(f, "pos", None) or self.pos or (1, 1)
            first, nl, rest = str(f).partition("\n")
            out.append(f"{self.file}:{line}:{col}: {first} [{code}]{nl}{rest}")
        return out


def _key(a: AlertEvent) -> tuple:
    return (a.rule, a.host, a.gpu)


def firing_at(alerts: list[AlertEvent], t: float) -> set[tuple]:
    state: dict[str, tuple[tuple, bool]] = {}
    for a in sorted(alerts, key=lambda a: (a.ts, a.state != "resolved")):
        if a.ts > t:
            break
        state[a.id] = (_key(a), a.state == "firing")
    return {k for k, on in state.values() if on}


def _fmt(keys: set[tuple]) -> str:
    return ", ".join(f"{r}@{h}/{g}" if g is not None else f"{r}@{h}" for r, h, g in sorted(keys, key=str)) or "none"


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:40] + "..."


def _mapping(v: Any, what: str, keys: tuple[str, ...]) -> dict:
    """``v`` if it is a mapping with only ``keys``, else a ``SeriesError``: a misspelt key
    (``sereis:``) would otherwise make a test that checks nothing and passes."""
    if not isinstance(v, dict):
        raise SeriesError(f"{what} must be a mapping, not {_shown(v)}", v)
    for k in v:
        if k not in keys:
            raise SeriesError(f"{what}: unknown key {_shown(k)} (expected: {', '.join(keys)})", k)
    return v


def _items(v: Any, what: str) -> list:
    """``v`` if it is a list; an empty value (``firing:``) is an empty one."""
    if v is None or v == "":
        return []
    if not isinstance(v, list):
        raise SeriesError(f"{what} must be a list, not {_shown(v)}", v)
    return v


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v or "\x00" in v:
        raise SeriesError(f"{what} must be a non-empty string, not {_shown(v)}", v)
    return v


def _gpu(v: Any, what: str) -> int:
    """A GPU index as the decoder takes them: ASCII digits, 0..MAX_GPU_INDEX."""
    if not (isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 6 and int(v) <= MAX_GPU_INDEX):
        raise SeriesError(f"{what}: gpu must be an index 0..{MAX_GPU_INDEX}, not {_shown(v)}", v)
    return int(v)


def run_test(test: Any, path: Path, rules_dir: Path, limit: int = MAX_SAMPLES) -> TestResult:
    """Run one test of a test file, with at most ``limit`` samples; any problem with it is a
    failure of the test, not an exception."""
    name = str(test.get("name", "?")) if isinstance(test, dict) else "?"
    res = TestResult(str(path), name[:200], pos=_pos(test))
    try:
        _run(test, path, rules_dir, res, limit)
    except SeriesError as e:
        res.failures.append(_failure(f"bad test input: {e}", e.pos, T_BAD_INPUT))
    except Exception as e:  # noqa: BLE001 - the trust boundary, as the rule loader's (R013)
        res.failures.append(
            _failure(
                f"cannot run this test ({type(e).__name__}: {str(e)[:200]}); this is a gpuwarden bug", None, T_INTERNAL
            )
        )
    return res


def _run(test: Any, path: Path, rules_dir: Path, res: TestResult, limit: int) -> None:
    test = _mapping(test, "a test", TEST_KEYS)
    _text(test.get("name", "?"), "name")
    # ``realpath``, not ``resolve``: the same file, but a symlink loop is the loader's to report
    # (R014), not a RuntimeError here.
    files = [
        Path(os.path.realpath(path.parent / _text(f, "rule_files")))
        for f in _items(test.get("rule_files"), "rule_files")
    ]
    series = [_mapping(s, "series", SERIES_KEYS) for s in _items(test.get("series"), "series")]
    checks = [_mapping(c, "alerts", CHECK_KEYS) for c in _items(test.get("alerts"), "alerts")]
    never = [_text(r, "never") for r in _items(test.get("never"), "never")]
    ruleset, diags = load_rules(files or [rules_dir])
    if ruleset is None:
        where = _pos(test.get("rule_files")) or res.pos
        res.failures += [_failure("rule files do not load:", where, T_RULES)] + [f"  {d}" for d in diags if d.is_error]
        return
    try:
        interval = parse_duration(test.get("interval", "1s"))
    except ValueError as e:
        raise SeriesError(f"interval: {e}", test.get("interval")) from None
    if interval <= 0:
        raise SeriesError("interval must be positive", test.get("interval"))
    records = []
    for s in series:
        host, gpu = str(_text(s.get("host"), "series: host")), _gpu(s.get("gpu", "0"), "series")
        columns = {}
        values = s.get("values") or {}
        if not isinstance(values, dict):
            raise SeriesError(
                f"series {host}/{gpu}: values must map field names to series, not {_shown(values)}", values
            )
        for fname, text in values.items():
            if FIELDS.resolve(str(fname)) is None:
                raise SeriesError(f"unknown field {str(fname)!r} in series {host}/{gpu}", fname)
            try:
                columns[str(fname)] = expand_series(_text(text, f"series {host}/{gpu}: {fname}"), limit - res.samples)
            except SeriesError as e:
                raise e.where(text) from None
            res.samples += len(columns[str(fname)])
        n = max((len(v) for v in columns.values()), default=0)
        for i in range(n):
            vals = {f: x for f, v in columns.items() if i < len(v) and (x := v[i]) is not None}
            if vals:
                records.append(dcgm(T0 + i * interval, host, gpu, vals))
    records.sort(key=lambda r: (r.ts, r.host, r.gpu))
    engine = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=ruleset)
    alerts = engine.process(records).alerts + engine.flush().alerts
    levels = {r.meta.name: r.meta.level for r in ruleset.rules}
    for exp in checks:
        try:
            t = parse_duration(_text(exp.get("at"), "the time"))
        except (SeriesError, ValueError) as e:
            where = (e.pos if isinstance(e, SeriesError) else None) or _pos(exp.get("at")) or _pos(exp)
            res.failures.append(_failure(f"bad test input: at: {e}", where, T_BAD_INPUT))
            continue
        want = set()
        for a in _items(exp.get("firing"), "firing"):
            a = _mapping(a, f"at {exp['at']}: firing", ALERT_KEYS)
            rule = _text(a.get("rule"), f"at {exp['at']}: firing: rule")
            # Every alert names its host, and a GPU-level rule's its GPU: an expectation without
            # them could never be met, and would report the alert it meant as "unexpected".
            if "host" not in a:
                raise SeriesError("firing: missing key host", a)
            if rule not in levels:
                res.failures.append(
                    _failure(f"at {exp['at']}: expects unknown rule {rule!r}", _pos(a.get("rule")), T_UNKNOWN_RULE)
                )
            elif levels[rule] == "gpu" and a.get("gpu") in (None, "", "null"):
                raise SeriesError(f"firing: missing key gpu ({rule} is a GPU-level rule)", a)
            on_gpu, on_host = a.get("gpu"), _text(a.get("host"), f"at {exp['at']}: firing: host")
            on_gpu = None if on_gpu in (None, "", "null") else _gpu(on_gpu, f"at {exp['at']}")
            want.add((rule, str(on_host), on_gpu))
        got = firing_at(alerts, T0 + t)
        if got != want:
            res.failures.append(
                _failure(
                    f"at {exp['at']}: firing {_fmt(got)}; expected {_fmt(want)}\n"
                    f"      missing:    {_fmt(want - got)}\n      unexpected: {_fmt(got - want)}",
                    _pos(exp),
                    T_FAILED,
                )
            )
    for rule in never:
        if rule not in levels:
            res.failures.append(_failure(f"never: unknown rule {rule!r}", _pos(rule), T_UNKNOWN_RULE))
            continue
        fired = [a for a in alerts if a.rule == rule and a.state == "firing"]
        if fired:
            a = fired[0]
            res.failures.append(
                _failure(
                    f"{rule} must never fire, but fired at {a.ts - T0:.0f}s on {a.host}/{a.gpu}: {a.summary}",
                    _pos(rule),
                    T_FAILED,
                )
            )
    if not checks and not never:  # it would pass whatever the rules do
        res.failures.append(_failure("checks nothing: give it alerts: or never:", res.pos, T_BAD_INPUT))


class TestFileError(ValueError):
    """A test file that cannot be read, or is not a mapping with a ``tests:`` list; ``pos``: where
    in it, when known."""

    def __init__(self, message: str, pos: Pos | None = None) -> None:
        super().__init__(message)
        self.pos = pos


class _PlainLoader(yaml.BaseLoader):
    """``BaseLoader`` refusing a tag outside plain YAML (which it would read as the text beside
    it) and a key given twice in one mapping (PyYAML keeps the last: a list of checks dropped).
    What it builds keeps its place in the file (``_Str``, ``_Seq``, ``_Map``: ``pos``), as the
    rule loader's nodes do, so a failure can say ``file:line:col``."""

    @staticmethod
    def _placed(data: Any, node: Any) -> Any:
        data.pos = (node.start_mark.line + 1, node.start_mark.column + 1)
        return data

    def construct_scalar(self, node: Any) -> Any:
        return self._placed(_Str(super().construct_scalar(node)), node)

    def construct_sequence(self, node: Any, deep: bool = False) -> Any:
        return self._placed(_Seq(super().construct_sequence(node, deep)), node)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        if node.tag not in _SAFE_TAGS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"YAML tag {node.tag[:60]!r} is not allowed in test files (plain data only)",
                node.start_mark,
            )
        return super().construct_object(node, deep)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for k, _ in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {k.value[:60]!r} given twice in one mapping", k.start_mark
                    )
                seen.add(k.value)
        return self._placed(_Map(super().construct_mapping(node, deep)), node)


def _load(path: Path) -> list:
    """The tests of a test file; raises ``TestFileError`` saying why there are none to run."""
    # BaseLoader: every scalar stays the text that was written. With the usual resolvers a
    # series such as ``0x120`` would silently become the hex number 288. Bounded like rule
    # files (an alias bomb is a YAMLError here, reported as a file that cannot be read).
    text = ""
    try:
        # Opened without waiting on a FIFO and checked as a regular file (/dev/zero never ends).
        with os.fdopen(yamlsafe.open_regular(path), "rb") as fh:
            raw = fh.read(TEST_LIMITS.max_bytes + 1)  # not the whole of a file of any size
        if len(raw) > TEST_LIMITS.max_bytes:
            raise TestFileError(f"the file is over the limit of {TEST_LIMITS.max_bytes} bytes")
        text = raw.decode("utf-8")
        doc = yamlsafe.load(text, TEST_LIMITS, base=_PlainLoader) or {}
    except yamlsafe.YamlLimitError as e:
        raise TestFileError(str(e)) from None
    except yaml.YAMLError as e:
        problem, line, col = yamlsafe.syntax_error(e, text)
        raise TestFileError(f"line {line}, column {col}: {' '.join(str(problem).split())}", (line, col)) from None
    except UnicodeDecodeError as e:
        raise TestFileError(f"not UTF-8: byte 0x{e.object[e.start]:02x} at offset {e.start}") from None
    except yamlsafe.NotRegularFile:
        raise TestFileError("not a regular file") from None
    except OSError as e:
        raise TestFileError(str(e)) from None
    try:
        tests = _items(_mapping(doc, "a test file", FILE_KEYS).get("tests"), "tests")
    except SeriesError as e:
        raise TestFileError(str(e), e.pos) from None
    if len(tests) > MAX_TESTS:
        raise TestFileError(f"more than {MAX_TESTS} tests in one file", _pos(tests))
    return tests


def _twice(tests: list, path: Path) -> dict[int, Failure]:
    """The tests (by index) whose name an earlier test of the file has: a failure each, naming
    where both are (a report by name alone would not say which of them failed)."""
    first: dict[str, Pos | None] = {}
    out = {}
    for i, test in enumerate(tests):
        name = test.get("name") if isinstance(test, dict) else None
        if not isinstance(name, str) or not name:
            continue  # no name, or not a string: the test itself reports it
        if name in first:
            at = first[name]
            where = f"{path}:{at[0]}:{at[1]}" if at else "an earlier test of this file"
            out[i] = _failure(
                f"bad test input: test name {_shown(name)} given twice (first at {where})", _pos(name), T_BAD_INPUT
            )
        else:
            first[name] = _pos(name)
    return out


def test_files(paths: Sequence[str | Path]) -> list[Path]:
    """The test files ``paths`` name (files, or directories' ``*.yaml``/``*.yml``), each once in
    the order first named: ``rules test tests tests/xid.yaml`` runs the XID tests once."""
    out: list[Path] = []
    seen: set[str] = set()
    for p in map(Path, paths):
        for f in sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")) if p.is_dir() else [p]:
            if (real := os.path.realpath(f)) not in seen:
                seen.add(real)
                out.append(f)
    return out


def run_tests(
    paths: Sequence[str | Path],
    on_test: Callable[[int, int], None] | None = None,
    default_rules: Path | None = None,
    on_empty: Callable[[Path], None] | None = None,
) -> list[TestResult]:
    """Run every test in the given test files/directories; ``on_test(i, n)`` before test ``i`` of
    ``n``; ``on_empty(path)`` for each file that reads but holds no test (empty, ``tests: []``),
    which would otherwise pass unnoticed. A test whose name an earlier test of its file has fails
    (``T002``) without running.

    A test without ``rule_files:`` runs on the rule files beside its ``tests/`` directory, or,
    when its file is in no ``tests/`` directory, on ``default_rules`` (default: the shipped
    packs): the file's own directory holds test files, not rules (docs/rules.md#testing-a-rule).

    >>> run_tests([])
    []
    """
    results = []
    todo = []
    shipped = default_rules if default_rules is not None else resources.rules_dir()
    for path in test_files(paths):
        try:
            tests = _load(path)
        except TestFileError as e:
            results.append(TestResult(str(path), "(file)", [_failure(f"cannot read: {e}", e.pos, T_UNREADABLE)]))
            continue
        if not tests and on_empty:
            on_empty(path)
        beside = path.parent.name == "tests"
        twice = _twice(tests, path)
        todo += [(test, path, path.parent.parent if beside else None, twice.get(j)) for j, test in enumerate(tests)]
    left: dict[Path, int] = {}  # samples each file has left
    for i, (test, path, rules_dir, dup) in enumerate(todo):
        if on_test:
            on_test(i, len(todo))
        if dup is not None:
            results.append(TestResult(str(path), str(test.get("name"))[:200], [dup], pos=_pos(test)))
            continue
        res = run_test(test, path, rules_dir if rules_dir is not None else shipped, left.get(path, MAX_SAMPLES))
        left[path] = left.get(path, MAX_SAMPLES) - res.samples
        if res.failures and rules_dir is None and not (isinstance(test, dict) and test.get("rule_files")):
            res.failures.append(
                f"(ran on the rules in {shipped}: this file is not in a tests/ directory; name the rules to test "
                "with rule_files:, relative to this file)"
            )
        results.append(res)
    return results


def tested_rules(paths: Sequence[str | Path]) -> set[str]:
    """Rule names that some test expects to fire or never to fire (for the W201 lint)."""
    names: set[str] = set()
    for path in test_files(paths):
        try:
            tests = _load(path)
        except TestFileError:
            continue
        for test in tests:
            try:  # a malformed test covers nothing (``rules test`` says what is wrong with it)
                test = _mapping(test, "a test", TEST_KEYS)
                names.update(_text(r, "never") for r in _items(test.get("never"), "never"))
                for exp in _items(test.get("alerts"), "alerts"):
                    for a in _items(_mapping(exp, "alerts", CHECK_KEYS).get("firing"), "firing"):
                        names.add(_text(_mapping(a, "firing", ALERT_KEYS).get("rule"), "rule"))
            except SeriesError:
                continue
    return names
