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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from pipeline import yamlsafe
from pipeline.catalog import FIELDS
from pipeline.engine import Engine, EngineConfig
from pipeline.rules.durations import parse_duration
from pipeline.rules.loader import load_rules
from pipeline.schema import AlertEvent, dcgm

T0 = 1764403200.0
TEST_LIMITS = yamlsafe.Limits(max_bytes=4 << 20)  # series make test files longer than rule files
MAX_SAMPLES = 1_000_000  # per series: "1x99999999999" must be an error, not all the memory
_TERM = re.compile(r"^(_|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?:([+-]\d+(?:\.\d+)?))?(?:x(\d+))?$")


class SeriesError(ValueError):
    pass


def expand_series(text: str | int | float) -> list[float | None]:
    """``'60+1x3 90x1 _'`` -> ``[60, 61, 62, 63, 90, 90, None]``.

    >>> expand_series("1+2x2 _x1 5")
    [1.0, 3.0, 5.0, None, None, 5.0]
    """
    out: list[float | None] = []
    for term in str(text).split():
        m = _TERM.match(term)
        if not m:
            raise SeriesError(f"bad series term {term!r} (use v, vxN, a+bxN or _)")
        start, step, times = m.group(1), m.group(2), int(m.group(3) or 0)
        if len(out) + times + 1 > MAX_SAMPLES:
            raise SeriesError(f"series term {term[:40]!r}: more than {MAX_SAMPLES} samples in one series")
        if start == "_":
            if step:
                raise SeriesError(f"bad series term {term!r}: '_' takes no step")
            out += [None] * (times + 1)
        else:
            a, b = float(start), float(step or 0)
            out += [a + b * i for i in range(times + 1)]
    return out


@dataclass
class TestResult:
    file: str
    name: str
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


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


def run_test(test: dict[str, Any], path: Path, rules_dir: Path) -> TestResult:
    name = str(test.get("name", "?"))
    res = TestResult(str(path), name)
    files = [(path.parent / f).resolve() for f in test.get("rule_files", [])] or [rules_dir]
    ruleset, diags = load_rules(files)
    if ruleset is None:
        res.failures += ["rule files do not load:"] + [f"  {d}" for d in diags if d.is_error]
        return res
    try:
        interval = parse_duration(test.get("interval", "1s"))
        records = []
        for s in test.get("series") or []:
            host, gpu = str(s["host"]), int(s.get("gpu", 0))
            columns = {}
            for fname, text in (s.get("values") or {}).items():
                if FIELDS.resolve(str(fname)) is None:
                    raise SeriesError(f"unknown field {fname!r} in series {host}/{gpu}")
                columns[str(fname)] = expand_series(text)
            n = max((len(v) for v in columns.values()), default=0)
            for i in range(n):
                vals = {f: x for f, v in columns.items() if i < len(v) and (x := v[i]) is not None}
                if vals:
                    records.append(dcgm(T0 + i * interval, host, gpu, vals))
        records.sort(key=lambda r: (r.ts, r.host, r.gpu))
    except (SeriesError, KeyError, TypeError, ValueError) as e:
        res.failures.append(f"bad test input: {e}")
        return res
    engine = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=ruleset)
    alerts = engine.process(records).alerts + engine.flush().alerts
    known = {r.meta.name for r in ruleset.rules}
    for exp in test.get("alerts") or []:
        try:
            t = parse_duration(exp["at"])
        except (KeyError, TypeError, ValueError) as e:
            res.failures.append(f"bad test input: at: {e}")
            continue
        want = set()
        for a in exp.get("firing") or []:
            if a["rule"] not in known:
                res.failures.append(f"at {exp['at']}: expects unknown rule {a['rule']!r}")
            gpu = a.get("gpu")
            want.add((a["rule"], str(a.get("host")), None if gpu in (None, "", "null") else int(gpu)))
        got = firing_at(alerts, T0 + t)
        if got != want:
            res.failures.append(
                f"at {exp['at']}: firing {_fmt(got)}; expected {_fmt(want)}\n"
                f"      missing:    {_fmt(want - got)}\n      unexpected: {_fmt(got - want)}"
            )
    for rule in test.get("never") or []:
        if rule not in known:
            res.failures.append(f"never: unknown rule {rule!r}")
            continue
        fired = [a for a in alerts if a.rule == rule and a.state == "firing"]
        if fired:
            a = fired[0]
            res.failures.append(
                f"{rule} must never fire, but fired at {a.ts - T0:.0f}s on {a.host}/{a.gpu}: {a.summary}"
            )
    return res


def _load(path: Path) -> dict:
    # BaseLoader: every scalar stays the text that was written. With the usual resolvers a
    # series such as ``0x120`` would silently become the hex number 288. Bounded like rule
    # files (an alias bomb is a YAMLError here, reported as a file that cannot be read).
    doc = yamlsafe.load(path.read_text(encoding="utf-8"), TEST_LIMITS, base=yaml.BaseLoader) or {}
    return doc if isinstance(doc, dict) else {}


def test_files(paths: Sequence[str | Path]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")) if p.is_dir() else [p]
    return out


def run_tests(paths: Sequence[str | Path], on_test: Callable[[int, int], None] | None = None) -> list[TestResult]:
    """Run every test in the given test files/directories; ``on_test(i, n)`` before test ``i`` of ``n``."""
    results = []
    todo = []
    for path in test_files(paths):
        try:
            doc = _load(path)
        except (OSError, yaml.YAMLError) as e:
            results.append(TestResult(str(path), "(file)", [f"cannot read: {e}"]))
            continue
        rules_dir = path.parent.parent if path.parent.name == "tests" else path.parent
        todo += [(test, path, rules_dir) for test in doc.get("tests") or []]
    for i, (test, path, rules_dir) in enumerate(todo):
        if on_test:
            on_test(i, len(todo))
        results.append(run_test(test, path, rules_dir))
    return results


def tested_rules(paths: Sequence[str | Path]) -> set[str]:
    """Rule names that some test expects to fire or never to fire (for the W201 lint)."""
    names: set[str] = set()
    for path in test_files(paths):
        try:
            doc = _load(path)
        except (OSError, yaml.YAMLError):
            continue
        for test in doc.get("tests") or []:
            names.update(test.get("never") or [])
            for exp in test.get("alerts") or []:
                names.update(a["rule"] for a in exp.get("firing") or [] if isinstance(a, dict) and "rule" in a)
    return names
