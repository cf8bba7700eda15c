"""YAML detection rules: the language, the loader, the evaluator and the unit-test runner."""

from pipeline.rules.loader import load_rules
from pipeline.rules.ruleset import Rule, RuleSet

DEFAULT_RULES_DIR = "rules"

__all__ = ["DEFAULT_RULES_DIR", "Rule", "RuleSet", "load_rules"]
