"""One duration dialect (pipeline/durations.py) for rules, models and configs."""

from __future__ import annotations

import pytest

from pipeline.durations import MAX_SECONDS, duration, parse_duration
from pipeline.errors import ConfigError
from pipeline.rules import durations as rule_durations


@pytest.mark.parametrize("text, seconds", [
    ("500ms", 0.5), ("30s", 30), ("5m", 300), ("1m30s", 90), ("1h30m", 5400), ("1.5h", 5400), ("1d", 86400),
    (" 90s ", 90), ("10 m", 600), ("1h 30m", 5400), ("90", 90), (15, 15), (0, 0), ("366d", MAX_SECONDS),
])
def test_the_dialect(text, seconds):
    assert parse_duration(text) == seconds == duration(text, "k")


@pytest.mark.parametrize("bad", ["", "   ", "10 minutes", "5x", "1m30", "1e3s", "-5s", "367d", "9" * 400 + "s",
                                 "9" * 400, True, float("nan"), float("inf"), -1, 10 ** 400,
                                 # Other scripts' digits, which float() reads: Bengali 4 looks like an 8.
                                 "\u09ea" + "m", "\u0663" + "0s", "\uff11\uff10s", "\u0663"])
def test_what_is_no_duration(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)
    with pytest.raises(ConfigError) as e:
        duration(bad, "guardrails.cooldown")
    assert e.value.key == "guardrails.cooldown" and e.value.code == "GW100"


def test_a_config_value_of_another_type_names_the_key():
    with pytest.raises(ConfigError, match="models\\[0\\].for"):
        duration(["5m"], "models[0].for")


def test_the_rule_language_keeps_its_names():
    assert rule_durations.parse_duration is parse_duration and rule_durations.MAX_SECONDS == MAX_SECONDS
