"""RuleSet: a rule over fields no GPU has reported answers without being evaluated each tick,
exactly what evaluating it gives."""

from pathlib import Path

import pytest

from pipeline.engine import Engine, EngineConfig
from pipeline.rules import load_rules
from pipeline.rules.ruleset import RuleSet
from tests.factories import fleet
from tests.unit.rules.factories import fields_in_spells, one_rule, run_rules

RULES = Path(__file__).resolve().parents[3] / "rules"


def _evaluate_every_rule(monkeypatch):
    """The reference: every rule evaluated every tick, as before unread rules were answered."""
    monkeypatch.setattr(RuleSet, "_unread", lambda self, rule, chunk: rule.evaluate(chunk))


def _answered_and_evaluated(make_rules, monkeypatch, text, records, batch):
    """The alerts of ``text``'s rules over ``records``, answered as RuleSet does, then with
    every rule evaluated every tick."""
    answered, _ = run_rules(make_rules(text), records, batch=batch)
    _evaluate_every_rule(monkeypatch)
    evaluated, _ = run_rules(make_rules(text), records, batch=batch)
    return answered, evaluated


def _default_packs():
    rs, diags = load_rules([RULES])
    assert rs is not None, diags
    return rs


def _run_restored(rs_a, rs_b, records, cut):
    """``records`` through one engine to ``cut``, the rest through a second restored from its
    snapshot (a restart): the alerts of both."""
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=rs_a)
    first = eng.process(records[:cut]).alerts
    eng2 = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=rs_b)
    eng2.restore(eng.snapshot())
    return first + eng2.process(records[cut:]).alerts + eng2.flush().alerts


@pytest.mark.parametrize("seed", range(2))
def test_rules_over_fields_that_come_and_go_alert_as_if_evaluated_every_tick(seed, monkeypatch):
    # The default packs' PCIe rules over counters each GPU reports only in spells: before any
    # GPU reports them they are answered once for all; after, evaluated. A restart in the middle
    # changes nothing either.
    records = fields_in_spells(seed, 1200)
    cut = len(records) // 2
    answered, _ = run_rules(_default_packs(), records, batch=97)
    answered_restored = _run_restored(_default_packs(), _default_packs(), records, cut)
    _evaluate_every_rule(monkeypatch)
    evaluated, _ = run_rules(_default_packs(), records, batch=97)
    evaluated_restored = _run_restored(_default_packs(), _default_packs(), records, cut)
    assert {a.rule for a in evaluated} & {"pcie_aer_fatal", "pcie_replay_rate"}, "the case tests nothing"
    assert answered == evaluated
    assert answered_restored == evaluated_restored


def test_a_rule_true_where_its_field_was_never_reported_fires_and_resolves_as_evaluated(make_rules, monkeypatch):
    # 'not changed(x)' is 1 where x was never reported (changed() answers 0, not unknown): the
    # rule fires on every GPU, and resolves on the one whose x changes once it reports x.
    text = one_rule("not changed(pcie_aer_fatal)")

    def overrides(t, host, gpu):
        if host == "n1" and gpu == 1 and t >= 30:
            return {"pcie_aer_fatal": t // 5}
        return {}

    records = fleet(range(60), hosts=2, gpus=2, overrides=overrides)
    answered, evaluated = _answered_and_evaluated(make_rules, monkeypatch, text, records, batch=13)
    assert answered == evaluated
    assert {(a.host, a.gpu) for a in answered if a.state == "firing"} == {("n0", 0), ("n0", 1), ("n1", 0), ("n1", 1)}
    assert [(a.host, a.gpu) for a in answered if a.state == "resolved"][:1] == [("n1", 1)]


def test_a_rule_over_an_unreported_field_is_evaluated_once_not_each_tick(make_rules):
    text = one_rule("increase(pcie_aer_fatal, 5m) > 0")
    rs = make_rules(text)
    calls = []
    rule = rs.rules[0]
    real = rule.evaluate
    rule.evaluate = lambda chunk: calls.append(1) or real(chunk)
    alerts, _ = run_rules(rs, fleet(range(40), hosts=2, gpus=2))
    assert alerts == [] and len(calls) == 1


def test_a_field_every_gpu_stopped_reporting_is_still_read_from_its_windows(make_rules, monkeypatch):
    # Reported once is reported: the windows still hold the spell's increase after the last
    # value (a producer stopped), so the rule is evaluated and resolves when the window says,
    # though no row of those ticks has the field and the rule was answered unread before.
    text = one_rule("increase(pcie_replays, 2m) > 10")

    def overrides(t, host, gpu):  # none at first, then two spells further apart than the window
        spell = 30 <= t < 90 or 300 <= t < 360
        return {"pcie_replays": 5 * t} if (host, gpu) == ("n0", 1) and spell else {}

    records = fleet(range(600), hosts=2, gpus=2, overrides=overrides)
    answered, evaluated = _answered_and_evaluated(make_rules, monkeypatch, text, records, batch=31)
    assert answered == evaluated
    resolved = [a.ts - records[0].ts for a in evaluated if a.state == "resolved"]
    assert len(resolved) == 2 and resolved[0] > 150, "the alert resolved with the last value, not with the window"
