"""dcgmi dmon rows shaped as NVIDIA/DCGM's dcgmi/DeviceMonitor.cpp prints them at the tags named
in each test (header ``"{:<{}}"`` of ``#Entity``, each field cell ``width + 6 + 2`` wide, values
left-aligned), with entity labels and trailers taken from that source and its tests."""

from __future__ import annotations

import math

from producers.dcgmi import DmonFileSource
from tests.unit.producers.dcgmi_factories import dmon, parse_dmon

# NFELT: DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL, DCGM_FIELD_WIDTH_20 (dcgmlib/src/dcgm_fields.cpp @ v4.6.0)
# -> a 28-wide cell; TMPTR (width 5) -> 13.
NFELT = 20 + 6 + 2
TMPTR = 5 + 6 + 2


def test_raw_link_rows_of_dcgm_3_to_4_5_are_counted_entities_not_lost_rows():
    # Before: "LINK 257" matched no entity: the row was dropped as unparsable (exit 3). Rows as
    # testing/python3/tests/test_dcgmi.py @ v4.6.0 (test_dcgmi_dmon_gpu_link_per_link) quotes the
    # pre-4.6 output. The raw dcgm_link_t names its GPU in bits 16-31 (3.x: 66817 is GPU 1, port 5),
    # bits 24-31 (4.3.1+: 16778497), or not at all (4.0 - 4.3.0): no row can be read as a GPU's link.
    rows = [("LINK 1", ["9943475587"]), ("LINK 257", ["9944687209"]), ("LINK 66817", ["N/A"]),
            ("LINK 16778497", ["N/A"]), ("LINK 771", ["7"]), ("GPU 0", ["9947415957"])]
    recs, p = parse_dmon(dmon(16, [("NFELT", "", NFELT)], rows))
    assert [(r.gpu, r.link) for r in recs] == [(0, None)]
    assert recs[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 9947415957
    assert p.stats.skipped_rows == 0 and p.stats.skipped_entities == {"LINK": 5}


def test_ctrl_c_trailer_is_not_a_lost_row(tmp_path):
    # Before: the trailer counted as an unparsable row, so a saved capture stopped with ctrl-C
    # exited 3 ("LOST input"). LockWatchAndUpdate() @ v4.6.0 prints "\n\ndmon was stopped due to
    # receiving a signal\n"; @ v2.1.4 the same sentence with a "." after one newline; @ v3.1.8
    # and v3.3.9 (2.4 - 3.3) "dmon was stopped do to receiving a signal\n", as spelled there.
    cols = [("TMPTR", " C", TMPTR)]
    for trailer in ("\n\ndmon was stopped due to receiving a signal\n", "\ndmon was stopped due to receiving a signal.\n",
                    "\n\ndmon was stopped do to receiving a signal\n"):
        f = tmp_path / "dmon.log"
        f.write_text(dmon(16, cols, [("GPU 0", ["41"]), ("GPU 1", ["43"])]) + trailer)
        src = DmonFileSource(str(f), host="h")
        assert [r.gpu for r in src.poll()] == [0, 1]
        assert src.summary()["dropped.unparsable_row"] == 0 and src.summary()["rows"] == 2


def test_unknown_entity_rows_are_skipped_entities_not_lost_rows():
    # Before: "UNKNOWN 0" (DCGM_FE_NONE, global data; the formatter<dcgm_field_entity_group_t>
    # of dcgmi/DeviceMonitor.cpp @ v3.3.9, 10-wide entity cell) was an unparsable row (exit 3).
    recs, p = parse_dmon(dmon(10, [("TMPTR", " C", TMPTR)], [("GPU 0", ["41"]), ("UNKNOWN 0", ["N/A"])]))
    assert [r.gpu for r in recs] == [0]
    assert p.stats.skipped_rows == 0 and p.stats.skipped_entities == {"UNKNOWN": 1}


# Cell widths before DCGM 4.0 (dcgm_fields.cpp @ v3.1.8: DRVER DCGM_FIELD_WIDTH_7, POWER and GPUTL
# DCGM_FIELD_WIDTH_10, XIDER DCGM_FIELD_WIDTH_5; DeviceMonitor.cpp pads each to width + 6 + 2).
DRVER = 7 + 6 + 2
POWER = 10 + 6 + 2
GPUTL = 10 + 6 + 2
XIDER = 5 + 6 + 2


def _gpus(recs: list) -> list[tuple]:
    return [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP, r.fields.DCGM_FI_DEV_POWER_USAGE) for r in recs]


def test_dcgm_3_1_gpu_row_without_its_global_value_is_read_by_column():
    # Before: the short GPU row was cut at the header's offsets: POWER got GPUTL's value.
    # DcgmCacheManager::GetLatestSample @ v3.1.8 (dcgmlib/src/DcgmCacheManager.cpp 4442-4494) files
    # a DCGM_FS_GLOBAL field's value (DRVER here) under DCGM_FE_NONE, so DeviceMonitor.cpp @ v3.1.8
    # prints it on an "UNKNOWN n" row, and PrintMetricsRow (365-386) prints the GPU row's other
    # values one per cell from the left: `dcgmi dmon -e 150,1,155,203`.
    cols = [("TMPTR", "C", TMPTR), ("DRVER", "#", DRVER), ("POWER", "W", POWER), ("GPUTL", "", GPUTL)]
    rows = [("GPU 0", ["45", "57.430", "12"]), ("UNKNOWN 0", ["535.104.05"]),
            ("GPU 1", ["47", "60.035", "0"]), ("UNKNOWN 1", ["535.104.05"])]
    recs, p = parse_dmon(dmon(10, cols, rows))
    assert _gpus(recs) == [(0, 45, 57.43), (1, 47, 60.035)]
    assert [r.fields.DCGM_FI_DEV_GPU_UTIL for r in recs] == [12, 0]
    assert p.stats.skipped_rows == 0 and p.stats.skipped_entities == {"UNKNOWN": 2}


def test_dcgm_2_3_right_aligned_gpu_row_without_its_global_value_is_read_by_column():
    # Before: TMPTR got POWER's value. DeviceMonitor.cpp @ v2.3.4: SetHeaderForOutput (438-463)
    # right-aligns "Entity" after "#" in 7 and each short name in width + 2; the print loop
    # (369-390) right-aligns the values a row got in the first cells. DRVER's value is on the
    # (DCGM_FE_NONE, 0) row, which has no entity name (DcgmCacheManager.cpp @ v2.1.4, 4316-4351).
    head = "#" + "Entity".rjust(7) + "DRVER".rjust(9) + "TMPTR".rjust(7) + "POWER".rjust(12)
    units = "Id".rjust(8) + "#".rjust(9) + "C".rjust(7) + "W".rjust(12)
    gpu = "GPU".rjust(8) + " 0" + "45".rjust(9) + "57.430".rjust(7)
    glob = "".rjust(8) + " 0" + " " + "535.104.05".rjust(9)
    recs, p = parse_dmon("\n".join([head, units, gpu, glob]) + "\n")
    assert _gpus(recs) == [(0, 45, 57.43)]
    assert p.stats.counts()["dropped.packed_row"] == 0


def test_short_row_of_a_pre_4_0_layout_is_dropped_not_guessed():
    # Before 4.0 a row prints only the values it got, one per cell from the left (PrintMetricsRow,
    # DeviceMonitor.cpp @ v3.3.9, 375-396), so a row with fewer values than columns, not explained by
    # left-out DCGM_FS_GLOBAL values, does not say whose values it holds (here: a line cut short).
    cols = [("TMPTR", "C", TMPTR), ("POWER", "W", POWER), ("GPUTL", "", GPUTL), ("XIDER", "", XIDER)]
    rows = [("GPU 0", ["45", "57.430", "12", "0"]), ("GPU 1", ["47", "60.035"]), ("GPU 2", ["46", "62.356", "3", "0"])]
    recs, p = parse_dmon(dmon(10, cols, rows))
    assert _gpus(recs) == [(0, 45, 57.43), (2, 46, 62.356)]
    assert p.stats.counts()["dropped.packed_row"] == 1 and p.stats.skipped_rows == 0


def test_dcgm_4_0_empty_cells_are_read_by_column():
    # From v4.0.0 PrintMetricsRow (DeviceMonitor.cpp 384-426) prints an empty cell for a field the
    # entity got no value of, and SetHeaderForOutput pads "#Entity" to 11 (745-754).
    cols = [("TMPTR", "C", TMPTR), ("POWER", "W", POWER), ("GPUTL", "", GPUTL)]
    recs, p = parse_dmon(dmon(11, cols, [("GPU 0", ["45", "57.430", ""]), ("GPU 1", ["47", "", "3"])]))
    assert _gpus(recs)[0] == (0, 45, 57.43) and math.isnan(recs[0].fields.DCGM_FI_DEV_GPU_UTIL)
    assert (recs[1].fields.DCGM_FI_DEV_GPU_TEMP, recs[1].fields.DCGM_FI_DEV_GPU_UTIL) == (47, 3)
    assert math.isnan(recs[1].fields.DCGM_FI_DEV_POWER_USAGE) and p.stats.skipped_rows == 0
