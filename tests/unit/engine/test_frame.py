import numpy as np
import pytest

from pipeline.catalog import FIELDS
from pipeline.engine.frame import Columnizer
from pipeline.schema import dcgm

TS = 1764403200.0


def col(values, alias):
    return values[:, FIELDS.by_alias(alias).column]


def test_both_spellings_fill_one_column():
    recs = [dcgm(TS, "h", 0, {"DCGM_FI_DEV_GPU_TEMP": 70}), dcgm(TS, "h", 1, {"DCGM_FI_DEV_GPU_TEMP_CELSIUS": 71})]
    values, dead = Columnizer().values(recs, ["a", "b"])
    assert col(values, "gpu_temp").tolist() == [70.0, 71.0]
    assert dead == []


def test_blank_sentinels_by_type_become_nan_with_a_dead_letter():
    recs = [dcgm(TS, "h", 0, {"sm_clock": 9223372036854775794, "power": 140737488355328.0, "gpu_temp": 70,
                             # a huge but real int64 counter (39 h of throttling in ns) is not blank
                             "thermal_violation": 2.0 ** 47 + 5})]
    values, dead = Columnizer().values(recs, ["f:3"])
    assert np.isnan(col(values, "sm_clock")[0]) and np.isnan(col(values, "power")[0])
    assert col(values, "gpu_temp")[0] == 70 and col(values, "thermal_violation")[0] == 2.0 ** 47 + 5
    assert [(d.reason, d.origin, d.action) for d in dead] == [("blank_sentinel", "f:3", "fields_dropped")]
    assert set(dead[0].fields) == {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE"}


def test_impossible_negatives_and_infinities_dropped():
    recs = [dcgm(TS, "h", 0, {"power": -5, "gpu_util": float("inf"), "gpu_temp_margin": -3, "gpu_temp": 70})]
    values, dead = Columnizer().values(recs, ["o"])
    assert np.isnan(col(values, "power")[0]) and np.isnan(col(values, "gpu_util")[0])
    assert col(values, "gpu_temp_margin")[0] == -3  # a margin may be negative
    assert {d.reason for d in dead} == {"negative_value", "nan_field"}


@pytest.mark.parametrize("alias,value,reason", [
    ("power", -5.0, "negative_value"),
    ("power", float("inf"), "nan_field"),
    ("power", float("-inf"), "nan_field"),
    ("gpu_temp_margin", float("-inf"), "nan_field"),   # no minimum: -Inf is still no value
    ("sm_clock", 9223372036854775794.0, "blank_sentinel"),
])
def test_one_bad_cell_in_a_clean_batch_is_found(alias, value, reason):
    # A batch is first checked as a whole; a single bad cell anywhere must still be found.
    recs = [dcgm(TS, "h", g, {"power": 300.0, "gpu_temp_margin": -3, "sm_clock": 1980, "gpu_temp": 70})
            for g in range(8)]
    recs[5] = dcgm(TS, "h", 5, {"power": 300.0, "gpu_temp_margin": -3, "sm_clock": 1980, "gpu_temp": 70,
                                alias: value})
    values, dead = Columnizer().values(recs, [f"o#{g}" for g in range(8)])
    assert [(d.reason, d.origin) for d in dead] == [(reason, "o#5")]
    assert np.isnan(col(values, alias)[5]) and not np.isnan(np.delete(col(values, alias), 5)).any()
    assert (col(values, "gpu_temp") == 70).all()


def test_only_the_columns_in_use_are_read():
    recs = [dcgm(TS, "h", 0, {"gpu_temp": 70, "power": 300, "DCGM_FI_DEV_SM_CLOCK": 1980})]
    cols = (FIELDS.by_alias("gpu_temp").column, FIELDS.by_alias("sm_clock").column)
    values, _ = Columnizer(cols).values(recs, ["o"])
    assert col(values, "gpu_temp")[0] == 70 and col(values, "sm_clock")[0] == 1980
    assert np.isnan(col(values, "power")[0])


def _subset_record(names, **values):
    from pipeline.decode import Decoder

    line = msgspec_line(values)
    return Decoder(fields=tuple(names)).decode(line, "o").records[0]


def msgspec_line(values):
    import msgspec

    return msgspec.json.encode({"kind": "dcgm", "ts": TS, "host": "h", "gpu": 0, "fields": values})


def test_records_decoded_for_the_columnizers_fields_give_the_same_matrix():
    cz = Columnizer([FIELDS.by_alias("gpu_temp").column, FIELDS.by_alias("sm_clock").column])
    fields = {"DCGM_FI_DEV_GPU_TEMP": 70, "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_POWER_USAGE": 500}
    sub = _subset_record(cz.names, **fields)
    assert not hasattr(sub.fields, "DCGM_FI_DEV_POWER_USAGE")          # skipped while decoding
    full, _ = cz.values([dcgm(TS, "h", 0, fields)], ["a"])
    fast, _ = cz.values([sub], ["a"])
    np.testing.assert_array_equal(fast, full)
    mixed, _ = cz.values([sub, dcgm(TS, "h", 1, fields)], ["a", "b"])   # a slow-path record among them
    np.testing.assert_array_equal(mixed[1], full[0])


def test_records_decoded_for_fewer_fields_read_what_they_lack_as_not_reported():
    # Rules reloaded with a new field while records decoded for the old set are still pending.
    old = _subset_record(("DCGM_FI_DEV_GPU_TEMP",), DCGM_FI_DEV_GPU_TEMP=70, DCGM_FI_DEV_SM_CLOCK=1980)
    cz = Columnizer([FIELDS.by_alias("gpu_temp").column, FIELDS.by_alias("sm_clock").column])
    values, dead = cz.values([old], ["a"])
    assert col(values, "gpu_temp")[0] == 70 and np.isnan(col(values, "sm_clock")[0]) and dead == []


def test_records_built_by_hand_with_int_or_bool_values_give_floats():
    # The fast path packs each row as doubles: ints and bools from a hand-built record convert.
    cz = Columnizer([FIELDS.by_alias("gpu_temp").column, FIELDS.by_alias("sm_clock").column])
    sub = _subset_record(cz.names, DCGM_FI_DEV_GPU_TEMP=70, DCGM_FI_DEV_SM_CLOCK=1980)
    odd = type(sub)(ts=TS, host="h", gpu=1, fields=type(sub.fields)(DCGM_FI_DEV_GPU_TEMP=71, DCGM_FI_DEV_SM_CLOCK=True))
    values, _ = cz.values([sub, odd], ["a", "b"])
    assert col(values, "gpu_temp").tolist() == [70.0, 71.0] and col(values, "sm_clock").tolist() == [1980.0, 1.0]
