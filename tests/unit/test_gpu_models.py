"""The per-GPU-model table (pipeline/data/gpu_models.csv) and what reads it."""

from pipeline.gpu_models import MODELS, lookup
from producers.sim.fields import model_spec


def test_every_row_is_sane_and_cites_a_source():
    assert {m.key for m in MODELS} >= {"H100_SXM", "H200_SXM", "B200", "A100_SXM"}
    for m in MODELS:
        assert m.source and "datasheet" in m.source
        assert m.gpu_max_op_c <= m.slowdown_c < m.shutdown_c
        assert 250 <= m.tdp_w <= 1200 and 1000 <= m.max_sm_clock_mhz <= 2200


def test_lookup_by_dcgm_model_name():
    assert lookup("NVIDIA H100 80GB HBM3").key == "H100_SXM"
    assert lookup("NVIDIA H100 PCIe").key == "H100_PCIE"
    assert lookup("NVIDIA H200").key == "H200_SXM"
    assert lookup("NVIDIA B200").tdp_w == 1000.0
    assert lookup("NVIDIA A100-SXM4-80GB").key == "A100_SXM"
    assert lookup("") is None and lookup("NVIDIA T4") is None


def test_the_simulators_gpu_models_come_from_the_table():
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200"):
        row, spec = lookup(name), model_spec(name)
        assert (spec.power_limit_w, spec.boost_mhz, spec.gpu_max_op_c, spec.slowdown_c, spec.shutdown_c,
                spec.mem_max_op_c) == (row.tdp_w, row.max_sm_clock_mhz, row.gpu_max_op_c, row.slowdown_c,
                                       row.shutdown_c, row.mem_max_op_c)
