"""Hostile ``models.yaml`` files: a ``ConfigError`` naming the key, never a hang, a model that
silently never scores, or start-up time and memory that grow without bound."""

from __future__ import annotations


import pytest

from pipeline.errors import ConfigError
from pipeline.models import config
from pipeline.models.config import specs_from_data


def counter_model(i: int = 0, **params) -> dict:
    return {"name": f"m{i}", "detector": "counter_rate", "fault": "hbm_sbe_test", "features": ["ecc_sbe_volatile"],
            "params": params}


@pytest.mark.parametrize("param", ["short_s", "mid_s", "long_s"])
def test_a_counter_window_of_zero_is_refused(param):
    # long_s 0: the exposure never reached the warm-up, so the model never scored; short_s or
    # mid_s 0: an expected count of 0, so every single error scored the maximum.
    with pytest.raises(ConfigError, match=rf"models\[0\]\.params\.{param}': must be above 0"):
        specs_from_data({"models": [counter_model(**{param: 0})]})


@pytest.mark.parametrize("name", ["m\u09ea", "\u1e43", "caf\u00e9"])
def test_a_model_name_is_ascii(name):
    # score(name) reads ASCII names only: a model named so could never be scored by a rule.
    with pytest.raises(ConfigError, match=r"models\[0\]\.name'"):
        specs_from_data({"models": [{**counter_model(), "name": name}]})


def test_at_most_max_models_in_a_file():
    n = config.MAX_MODELS
    assert len(specs_from_data({"models": [counter_model(i) for i in range(n)]})) == n
    with pytest.raises(ConfigError, match=rf"'models': more than {n} models"):
        specs_from_data({"models": [counter_model(i) for i in range(n + 1)]})


def test_the_forests_of_a_file_together_are_bounded():
    # Each forest was bounded alone, so 100 of them at the bound took ~3 s and ~120 MB each to start.
    hst = {"detector": "cohort_hst", "fault": "gpu_multivariate_test", "params": {"n_trees": 64, "height": 12}}
    big = [{**hst, "name": f"h{i}"} for i in range(3)]  # 64 x 8191 = 524,224 nodes each
    assert len(specs_from_data({"models": big[:2]})) == 2
    with pytest.raises(ConfigError, match=r"models\[2\]\.params': .*forests of this file .* at most 1048576"):
        specs_from_data({"models": big})


def test_a_counter_warmup_the_long_window_never_reaches_is_refused():
    # t_long, the exposure the warm-up counts, levels off near long_s: warmup 30000 with the
    # default long_s (21600) loaded, and the model never scored.
    model = {"name": "m", "detector": "counter_rate", "fault": "hbm_x", "features": ["ecc_sbe_volatile"]}
    with pytest.raises(ConfigError) as e:
        specs_from_data({"models": [{**model, "warmup": 30000}]})
    assert e.value.key == "models[0].params" and "warmup" in str(e.value) and "long_s" in str(e.value)
    assert specs_from_data({"models": [{**model, "warmup": 600}]})[0].warmup == 600
