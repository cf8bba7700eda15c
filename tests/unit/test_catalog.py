import csv
from pathlib import Path

import pytest

from pipeline.catalog import BITMASK, COUNTER, FIELDS

SHARED = Path(__file__).resolve().parents[3] / "shared" / "reference"


def test_both_dcgm_spellings_and_alias_name_one_field():
    old = FIELDS.by_name("DCGM_FI_DEV_GPU_TEMP")
    assert old is FIELDS.by_name("DCGM_FI_DEV_GPU_TEMP_CELSIUS") is FIELDS.by_alias("gpu_temp") is FIELDS.by_id(150)
    assert old.unit == "C" and old.names[0] == "DCGM_FI_DEV_GPU_TEMP"
    assert FIELDS.by_name("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") is FIELDS.by_name("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    assert FIELDS.by_alias("clocks_event_reasons").kind == BITMASK


def test_counters_and_gauges_are_classified():
    for alias in ("ecc_sbe_volatile", "ecc_dbe_aggregate", "nvlink_crc_flit_errors", "nvlink_replay_errors",
                  "thermal_violation", "power_violation", "pcie_replays"):
        assert FIELDS.by_alias(alias).kind == COUNTER, alias
    for alias in ("gpu_temp", "sm_clock", "power", "gpu_util"):
        assert FIELDS.by_alias(alias).kind == "gauge", alias


def test_columns_are_dense_and_unique():
    assert [f.column for f in FIELDS] == list(range(len(FIELDS)))
    assert len({f.alias for f in FIELDS}) == len(FIELDS)


def test_suggests_close_names():
    assert "gpu_temp" in FIELDS.suggest("gpu_tmp")
    assert FIELDS.resolve("nope") is None
    assert FIELDS.resolve("150").alias == "gpu_temp"


def test_clock_event_bits_from_reference():
    assert FIELDS.bits["HW_THERMAL"].mask == 0x40
    assert FIELDS.bits["SW_THERMAL"].mask == 0x20
    assert FIELDS.bits["GPU_IDLE"].mask == 0x1


@pytest.mark.skipif(not SHARED.exists(), reason="shared/ reference not beside this checkout")
def test_shipped_tables_match_the_shared_reference():
    pkg = Path(__file__).resolve().parents[2] / "pipeline" / "data"
    assert (pkg / "dcgm_fields.csv").read_text() == (SHARED / "dcgm_field_ids_subset.csv").read_text()
    assert (pkg / "clock_event_reasons.csv").read_text() == (SHARED / "clock_event_reasons.csv").read_text()
    with open(SHARED / "dcgm_field_ids_subset.csv") as fh:
        for row in csv.DictReader(fh):
            f = FIELDS.by_id(int(row["field_id"]))
            if f is None:
                assert row["type"] == "STRING", row  # only string fields are left out
                continue
            assert row["name_used_by_dcgm_exporter"] in f.names
            if row["canonical_name_dcgm_4_6_if_renamed"]:
                assert row["canonical_name_dcgm_4_6_if_renamed"] in f.names


def test_exporter_only_metrics_come_from_their_own_table_not_the_dcgm_copy():
    """dcgm_fields.csv stays a byte copy of the shared reference; what dcgm-exporter computes
    itself (DCGM_EXP_*) is in dcgm_exporter_fields.csv, under the exporter's own ids (>= 9000)."""
    pkg = Path(__file__).resolve().parents[2] / "pipeline" / "data"
    with open(pkg / "dcgm_exporter_fields.csv") as fh:
        rows = list(csv.DictReader(fh))
    with open(pkg / "dcgm_fields.csv") as fh:
        dcgm_ids = {int(r["field_id"]) for r in csv.DictReader(fh)}
    assert rows and all(r["name_used_by_dcgm_exporter"].startswith("DCGM_EXP_") for r in rows)
    for r in rows:
        assert int(r["field_id"]) >= 9000 and int(r["field_id"]) not in dcgm_ids
        assert FIELDS.by_name(r["name_used_by_dcgm_exporter"]).field_id == int(r["field_id"])
    assert FIELDS.by_alias("xid_count").field_id == 9001
