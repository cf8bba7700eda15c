"""Deciders (hysteresis, running quantile, no learning from flagged points) and models.yaml."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.models import load_model_specs, load_models
from pipeline.models.deciders import QuantileDecider, ThresholdDecider
from pipeline.models.detectors.counters import CounterRateSurprise


def test_threshold_decider_has_hysteresis():
    d = ThresholdDecider(6.0, 3.0)
    ent = np.array([0])
    seq = [2, 7, 5, 4, 2.9, 5, 6.5]
    got = [bool(d.decide(ent, np.array([s], float), 1)[0]) for s in seq]
    assert got == [False, True, True, True, False, False, True]


def test_threshold_decider_keeps_entities_apart():
    d = ThresholdDecider(6.0, 3.0)
    assert d.decide(np.array([0, 1]), np.array([7.0, 1.0]), 2).tolist() == [True, False]
    assert d.decide(np.array([0, 1]), np.array([4.0, 4.0]), 2).tolist() == [True, False]


def test_quantile_decider_follows_the_score_distribution():
    rng = np.random.default_rng(0)
    d = QuantileDecider(q=0.99, margin=1.5)
    d.observe(rng.exponential(1.0, 20_000))
    q99 = np.quantile(rng.exponential(1.0, 200_000), 0.99)
    assert 1.5 * q99 * 0.9 <= d.on <= 1.5 * q99 * 1.15
    assert d.off < d.on
    assert d.decide(np.array([0, 1]), np.array([d.on * 1.01, d.on * 0.5]), 2).tolist() == [True, False]


def test_a_lasting_burst_does_not_become_the_new_normal():
    """The model set learns only from unflagged points: a burst that lasts keeps scoring high."""
    det, dec = CounterRateSurprise(counters=["ecc_sbe_volatile"], warmup=10), ThresholdDecider(8.0, 4.0)
    ent = np.array([0])
    scores = []
    for t in range(3000):
        inc = 2.0 if t >= 600 else 0.0        # 120 SBE/min from t=600 on, for 40 minutes
        F = {"inc:ecc_sbe_volatile": np.array([inc])}
        ts = np.array([float(t)])
        s = det.score_many(ent, ts, F)
        flagged = dec.decide(ent, s, 1)
        det.learn_many(ent, ts, F, ~flagged)
        scores.append(float(s[0]))
    assert max(scores[:600]) < 1.0
    assert min(scores[700:]) > 8.0   # still anomalous 40 minutes in


MINIMAL = """
models:
  - name: m1
    detector: counter_rate
    fault: hbm_sbe_rate_anomaly
    features: [ecc_sbe_volatile]
    decider: {kind: threshold, threshold: 8, clear: 4}
"""


def _write(tmp_path, text):
    p = tmp_path / "models.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_default_models_file_loads_and_names_every_model():
    ms = load_models()
    assert {"thermal_hotter_than_load", "hbm_sbe_rate", "nvlink_error_rate", "nccl_rank_straggler",
            "nccl_comm_busbw", "gpu_multivariate"} <= ms.names
    for c in ms.checks:
        assert c.meta.fault.split("_")[0] in ("thermal", "hbm", "nvlink", "nccl", "gpu")


def test_minimal_file(tmp_path):
    (spec,) = load_model_specs(_write(tmp_path, MINIMAL))
    assert spec.params["counters"] == ["ecc_sbe_volatile"] and spec.decider == {"kind": "threshold",
                                                                             "threshold": 8.0, "clear": 4.0}


@pytest.mark.parametrize("change, key", [
    (("fault: hbm_sbe_rate_anomaly", "fault: hbm_sbe_rate_anomaly\n    colour: blue"), "models[0].colour"),
    (("detector: counter_rate", "detector: counter_rates"), "models[0].detector"),
    (("fault: hbm_sbe_rate_anomaly", "fault: sbe_rate"), "models[0].fault"),
    (("threshold: 8, clear: 4", "threshold: 8, clear: 9"), "models[0].decider.clear"),
    (("threshold: 8, clear: 4", "threshold: 8, hi: 4"), "models[0].decider.hi"),
    (("kind: threshold", "kind: magic"), "models[0].decider.kind"),
    (("features: [ecc_sbe_volatile]", "features: [gpu_temp]"), "models[0].features[0]"),
    (("features: [ecc_sbe_volatile]", "features: [ecc_sbe_volatile]\n    params: {shortt_s: 5}"),
     "models[0].params.shortt_s"),
    (("features: [ecc_sbe_volatile]", "features: [ecc_sbe_volatile]\n    for: soon"), "models[0].for"),
    (("features: [ecc_sbe_volatile]", "features: [ecc_sbe_volatile]\n    cohort: rack"), "models[0].cohort"),
    # Each of these crashed the loader (TypeError, OverflowError) or the model set's build (ValueError).
    (("kind: threshold", "kind: [threshold]"), "models[0].decider.kind"),
    (("features: [ecc_sbe_volatile]", "features: [ecc_sbe_volatile]\n    warmup: .inf"), "models[0].warmup"),
    (("features: [ecc_sbe_volatile]", "features: [ecc_sbe_volatile]\n    params: {short_s: 1" + "0" * 400 + "}"),
     "models[0].params.short_s"),
    (("threshold: 8, clear: 4", "threshold: .inf, clear: 4"), "models[0].decider.threshold"),
    (("detector: counter_rate\n    fault: hbm_sbe_rate_anomaly\n    features: [ecc_sbe_volatile]",
      "detector: cohort_hst\n    fault: gpu_x\n    params: {height: 40}"), "models[0].params"),
    # A forest's memory and start-up are its trees times their nodes: 10^9 trees would take the
    # host down, 2,000 of height 12 (16 M nodes drawn in Python) hold its start for many seconds.
    (("detector: counter_rate\n    fault: hbm_sbe_rate_anomaly\n    features: [ecc_sbe_volatile]",
      "detector: cohort_hst\n    fault: gpu_x\n    params: {n_trees: 1000000000}"), "models[0].params"),
    (("detector: counter_rate\n    fault: hbm_sbe_rate_anomaly\n    features: [ecc_sbe_volatile]",
      "detector: cohort_hst\n    fault: gpu_x\n    params: {n_trees: 2000, height: 12}"), "models[0].params"),
])
def test_config_errors_name_the_key(tmp_path, change, key):
    text = MINIMAL.replace(*change)
    with pytest.raises(ConfigError) as e:
        load_model_specs(_write(tmp_path, text))
    assert e.value.key == key, str(e.value)


def test_fixed_feature_detector_refuses_features(tmp_path):
    text = MINIMAL.replace("detector: counter_rate", "detector: thermal_residual").replace(
        "fault: hbm_sbe_rate_anomaly", "fault: thermal_x")
    with pytest.raises(ConfigError) as e:
        load_model_specs(_write(tmp_path, text))
    assert e.value.key == "models[0].features"


def test_duplicate_names_and_unsafe_yaml(tmp_path):
    dup = MINIMAL + MINIMAL.split("models:")[1]
    with pytest.raises(ConfigError, match="duplicate"):
        load_model_specs(_write(tmp_path, dup))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_model_specs(_write(tmp_path, "models: !!python/object/apply:os.system ['true']\n"))


def test_a_duration_given_as_nan_or_infinity_is_refused_naming_the_key() -> None:
    import pytest

    from pipeline.errors import ConfigError
    from pipeline.models.config import _dur

    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(ConfigError, match="warmup"):
            _dur(bad, "models[0].warmup")
