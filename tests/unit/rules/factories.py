"""Helpers of the rule tests: run a rule set over records."""

from pipeline.engine import Engine, EngineConfig


def run_rules(ruleset, records, batch=None):
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=ruleset)
    out = []
    step = batch or max(1, len(records))
    for i in range(0, len(records), step):
        out += eng.process(records[i:i + step]).alerts
    return out + eng.flush().alerts, eng
