import pytest

from pipeline.report.signals import (
    DCGM,
    NCCL,
    PRESENCE,
    PRESENCE_SIGNAL,
    CheckCatalog,
    Signal,
    evidence_signals,
    load_checks,
)
from tests.unit.report.factories import alert


@pytest.fixture(scope="module")
def default_checks():
    from pipeline.resources import rules_dir
    return load_checks([rules_dir()])


def test_a_rule_plots_the_fields_its_condition_and_values_read(default_checks):
    sigs, info = default_checks.signals_for(alert(1, rule="gpu_thermal_throttling", evidence={}))
    names = [s.name for s in sigs]
    assert info.kind == "rule" and "thermal.yaml" in info.source and "gpu_util" in info.definition
    assert {"clocks_event_reasons", "gpu_temp", "sm_clock", "thermal_violation"} <= set(names)
    assert names[0] == "clocks_event_reasons"       # the order the condition names them
    assert all(s.source == DCGM for s in sigs)


def test_a_model_plots_its_detector_features(default_checks):
    sigs, info = default_checks.signals_for(alert(1, rule="hbm_sbe_rate", evidence={}))
    assert info.kind == "model" and sigs == [Signal("ecc_sbe_volatile")]
    sigs, _ = default_checks.signals_for(alert(1, rule="nccl_rank_straggler", evidence={}))
    assert Signal("exec_time_us", NCCL) in sigs


def test_custom_rules_are_read_from_the_given_directory(tmp_path):
    (tmp_path / "r.yaml").write_text(
        "rules:\n  - name: hot_mem\n    fault: thermal_mem\n    severity: warning\n"
        "    condition: memory_temp > 90\n    summary: hot\n")
    cat = load_checks([tmp_path], models="none")
    sigs, info = cat.signals_for(alert(1, rule="hot_mem", evidence={}))
    assert sigs == [Signal("memory_temp")] and info.source.endswith("r.yaml:2")


def test_broken_rules_are_reported_not_raised(tmp_path):
    (tmp_path / "r.yaml").write_text("rules:\n  - name: x\n    condition: nonsense_field > 1\n")
    cat = load_checks([tmp_path], models="none")
    assert cat.checks == {} and "do not load" in cat.problems[0]


def test_unknown_rules_fall_back_to_field_names_in_the_evidence_keys():
    ev = {"increase(ecc_sbe_volatile, 1m)": 12, "DCGM_FI_DEV_GPU_TEMP": 80, "score": 3,
          "drivers": {"exec_time_us": 5.0, "nothing": 1}}
    assert evidence_signals(ev) == [Signal("ecc_sbe_volatile"), Signal("gpu_temp"), Signal("exec_time_us", NCCL)]
    sigs, info = CheckCatalog().signals_for(alert(1, rule="not_loaded", evidence=ev))
    assert info is None and sigs[0] == Signal("ecc_sbe_volatile")


def test_alerts_without_fields_plot_sample_arrival():
    cat = CheckCatalog()
    assert cat.signals_for(alert(1, rule="builtin_gpu_lost", evidence={"last_seen": 1.0}))[0] == [PRESENCE_SIGNAL]
    assert cat.signals_for(alert(1, rule="mystery", evidence={"score": 1}))[0][0].source == PRESENCE
