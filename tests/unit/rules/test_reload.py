"""One reload for many engines (``RuleReloader`` with a callable of engines, as ``serve`` uses it):
the files are read once per reload, each engine gets a rule set of its own, and each keeps the
state of its unchanged rules."""

from __future__ import annotations

import numpy as np

import pipeline.rules.loader as loader
from pipeline.engine import Engine, EngineConfig
from pipeline.rules import load_rules
from pipeline.rules.reload import RuleReloader
from tests.factories import sample

RULE = """
rules:
  - name: {name}
    fault: thermal_hot
    severity: warning
    condition: gpu_temp > {limit}
    for: 5s
"""


def _rules(tmp_path, name="hot", limit=85):
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / "thermal.yaml").write_text(RULE.format(name=name, limit=limit))
    (d / "other.yaml").write_text(RULE.format(name="other", limit=99))
    return d


def _engine(rules) -> Engine:
    rs, _ = load_rules([rules])
    return Engine(EngineConfig(allowed_lateness=0), rules=rs)


def test_one_reload_reads_the_files_once_and_gives_each_engine_its_own_set(tmp_path, monkeypatch):
    rules = _rules(tmp_path)
    engines = [_engine(rules) for _ in range(3)]
    reloader = RuleReloader([rules], lambda: engines, tick=1.0)
    reads: list[str] = []
    real = loader._read
    monkeypatch.setattr(loader, "_read", lambda f: reads.append(str(f)) or real(f))
    for i, eng in enumerate(engines):  # engine 0 has rule "hot" pending, the others not
        eng.process([sample(t, "n0", 0, gpu_temp=90 if i == 0 else 50) for t in range(3)])
    (rules / "thermal.yaml").write_text(RULE.format(name="hot", limit=85) + "# a comment\n")
    res = reloader.poll()
    assert res is not None and res.applied and res.rules == 2
    assert sorted(reads) == sorted(str(f) for f in rules.glob("*.yaml"))  # once each, not per engine
    sets = [eng.rules for eng in engines]
    assert len({id(s) for s in sets}) == 3 and len({id(s.windows) for s in sets}) == 3
    assert engines[0].lifecycles["hot"].since[0] == sample(0).ts  # unchanged rule: state kept
    assert all(np.isnan(eng.lifecycles["hot"].since).all() for eng in engines[1:])


def test_a_broken_file_reaches_no_engine(tmp_path):
    rules = _rules(tmp_path)
    engines = [_engine(rules) for _ in range(2)]
    before = [eng.rules for eng in engines]
    reloader = RuleReloader([rules], lambda: engines, tick=1.0)
    reloader.rules = 2
    (rules / "thermal.yaml").write_text("rules: [[[")
    res = reloader.poll()
    assert res is not None and not res.applied
    assert [eng.rules for eng in engines] == before


def test_a_folder_emptied_under_a_running_service_is_refused_and_the_rules_kept(tmp_path):
    # Found by a review: start-up refuses a rules folder without YAML, but a reload installed its
    # zero rules (a deploy half done, an rm), and the service went on with the built-in checks.
    rules = _rules(tmp_path)
    engines = [_engine(rules) for _ in range(2)]
    rl = RuleReloader([str(rules)], lambda: engines, tick=1.0)
    for f in rules.iterdir():
        f.unlink()
    res = rl.poll()
    assert res is not None and not res.applied
    assert "no rule files" in res.diagnostics[0].message
    assert all(len(e.rules or []) == 2 for e in engines)
