"""dcgmi dmon layouts checked against NVIDIA/DCGM's dcgmi/DeviceMonitor.cpp at the tags each test
names (cell widths from dcgmlib/src/dcgm_fields.cpp there), and hostile headings: string values
with spaces, entity ids that run into their value, 2.x's bare-id global row, NUL padding, damaged
and oversized headings."""

from __future__ import annotations

import math

from producers.dcgmi import MAX_COLUMNS, DmonFileSource
from tests.unit.producers.dcgmi_factories import dmon, parse_dmon

# Cell widths: DCGM_FIELD_WIDTH_n + 6 + 2 (SetHeaderForOutput, DeviceMonitor.cpp 2.4 - 4.6); DVNAM
# and NFELT are DCGM_FIELD_WIDTH_20, TMPTR _5, POWER _10 (dcgm_fields.cpp @ v3.3.9 and v4.6.0).
DVNAM = 20 + 6 + 2
NFELT = 20 + 6 + 2
TMPTR = 5 + 6 + 2
POWER = 10 + 6 + 2


def _temps(recs: list) -> list[tuple]:
    return [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP, r.fields.DCGM_FI_DEV_POWER_USAGE) for r in recs]


NAME_COLS = [("DVNAM", "", DVNAM), ("TMPTR", "C", TMPTR), ("POWER", "W", POWER)]


def test_a_gpu_name_with_spaces_keeps_the_gpu_row():
    # Before: "NVIDIA H100 80GB HBM3" split into four values, the row had more values than columns
    # and every GPU row of `dcgmi dmon -e 50,150,155` was dropped as unparsable. ListFieldValues
    # prints a DCGM_FT_STRING value as it is (DeviceMonitor.cpp @ v4.6.0), left-aligned in its
    # 28-wide cell; 4.5+ pads "#Entity" to 16.
    rows = [("GPU 0", ["NVIDIA H100 80GB HBM3", "45", "57.430"]), ("GPU 1", ["NVIDIA H100 80GB HBM3", "47", ""])]
    recs, p = parse_dmon(dmon(16, NAME_COLS, rows))
    assert _temps(recs)[0] == (0, 45, 57.43)
    assert recs[1].gpu == 1 and recs[1].fields.DCGM_FI_DEV_GPU_TEMP == 47
    assert math.isnan(recs[1].fields.DCGM_FI_DEV_POWER_USAGE)
    assert p.stats.skipped_rows == 0 and p.stats.bad_values == 0


def test_a_gpu_name_with_spaces_in_a_packing_layout_is_read_only_when_the_row_is_full():
    # DCGM 2.4 - 3.3 pack a row's values to the left (PrintMetricsRow, DeviceMonitor.cpp @ v3.3.9,
    # 10-wide "#Entity"): a row with every value fills every cell and is read by offset; one that
    # also lacks a value ("GPU 1": its values sit under the wrong names) is dropped, not misread.
    rows = [("GPU 0", ["NVIDIA A100-SXM4-80GB", "45", "57.430"]), ("GPU 1", ["NVIDIA A100-SXM4-80GB", "47"])]
    recs, p = parse_dmon(dmon(10, NAME_COLS, rows))
    assert _temps(recs) == [(0, 45, 57.43)]
    assert p.stats.rows == 2 and p.stats.skipped_rows + p.stats.packed_rows == 1


def test_non_gpu_entities_whose_id_runs_into_the_first_value_are_skipped_entities():
    # Before: each row below was an unparsable row, so a saved capture exited 3 (LOST input).
    # PrintMetricsRow pads the entity cell to 10 (@ v3.3.9) or 11 (@ v4.4.2) with no padding after
    # it: "LINK 65537" (3.x dcgm_link_t: GPU 1, port 0), "CPU Core 10" and "LINK 16778497"
    # (4.3.1+: GPU 1, port 5) touch their first value.
    v3 = dmon(10, [("NFELT", "", NFELT)], [("GPU 1", ["9947415957"]), ("LINK 65537", ["9943475587"])])
    v4 = dmon(
        11,
        [("NFELT", "", NFELT), ("TMPTR", "C", TMPTR)],
        [("GPU 1", ["9947415957", "45"]), ("LINK 16778497", ["9943475587", ""]), ("CPU Core 10", ["12", ""])],
    )
    assert "LINK 655379943475587" in v3 and "CPU Core 1012" in v4
    for text, skipped in ((v3, {"LINK": 1}), (v4, {"LINK": 1, "CPU Core": 1})):
        recs, p = parse_dmon(text)
        assert [(r.gpu, r.fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL) for r in recs] == [(1, 9947415957)]
        assert p.stats.skipped_rows == 0 and p.stats.skipped_entities == skipped


def test_dcgm_2_x_global_row_with_a_bare_id_is_a_skipped_entity(tmp_path):
    # Before: the DCGM_FE_NONE row was unparsable (exit 3). HelperGetGroupIdPrefix names that group
    # "" (DeviceMonitor.cpp @ v2.1.4 and v2.3.4), so the row is setw(8) of "" + " " + its id, and
    # std::map order prints it before the GPU rows; values right-aligned in width + 2.
    head = "#" + "Entity".rjust(7) + "DRVER".rjust(9) + "TMPTR".rjust(7) + "POWER".rjust(12)
    units = "Id".rjust(8) + "#".rjust(9) + "C".rjust(7) + "W".rjust(12)
    glob = "".rjust(8) + " 0" + " " + "535.104.05"  # 10 chars in a 9-wide cell: one space before it
    gpu = "GPU".rjust(8) + " 0" + "45".rjust(9) + "57.430".rjust(7)
    f = tmp_path / "dmon.log"
    f.write_text("\n".join([head, units, glob, gpu]) + "\n")
    src = DmonFileSource(str(f), host="h")
    assert _temps(src.poll()) == [(0, 45, 57.43)]
    s = src.summary()
    assert s["dropped.unparsable_row"] == 0 and s["dropped.skipped_entity.UNKNOWN"] == 1


def test_heading_after_a_nul_hole_is_read(tmp_path):
    # Before: a log that dmon appended to after a crash left NULs (no newline among them) in front
    # of the new heading; the heading was missed and the new rows were read against the old one:
    # TMPTR got the power. Heading layout of DeviceMonitor.cpp @ v4.6.0 (16-wide "#Entity").
    old = dmon(16, [("TMPTR", "C", TMPTR), ("POWER", "W", POWER)], [("GPU 0", ["45", "57.430"])])
    new = dmon(16, [("POWER", "W", POWER), ("TMPTR", "C", TMPTR)], [("GPU 0", ["300.500", "52"])])
    f = tmp_path / "dmon.log"
    f.write_bytes(old.encode() + b"\x00" * 4096 + new.encode())
    src = DmonFileSource(str(f), host="h")
    assert _temps(src.poll()) == [(0, 45, 57.43), (0, 52, 300.5)]
    assert src.summary()["dropped.unparsable_row"] == 0


def test_a_heading_that_does_not_start_its_line_stops_the_old_one():
    # Before: the damaged heading was a row that fit nothing, and the rows after it were read
    # against the earlier heading: TMPTR got the power. Now they wait for a whole heading.
    cols = [("TMPTR", "C", TMPTR), ("POWER", "W", POWER)]
    swapped = [("POWER", "W", POWER), ("TMPTR", "C", TMPTR)]
    text = dmon(16, cols, [("GPU 0", ["45", "57.430"])])
    text += "GPU 1           4" + dmon(16, swapped, [("GPU 0", ["300.500", "52"])])
    text += dmon(16, swapped, [("GPU 0", ["301.000", "53"])])
    recs, p = parse_dmon(text)
    assert _temps(recs) == [(0, 45, 57.43), (0, 53, 301.0)]
    assert p.stats.counts()["dropped.bad_header"] == 1 and p.stats.skipped_rows == 1


def test_a_heading_wider_than_any_field_group_is_rejected():
    # Before: a 1 MB heading (80,000 columns) was taken, and each row after it was cut at all its
    # offsets: 1,000 short rows took 28 s, 4,000 took 117 s. A field group holds at most
    # DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP = 128 fields (dcgm_structs.h @ v2.1.4 - v4.6.0), so no
    # dmon heading is wider; rows after a wider one are not read against it (nor against the last).
    widest = dmon(16, [("TMPTR", "C", TMPTR)] * MAX_COLUMNS, [("GPU 0", ["45"] * MAX_COLUMNS)])
    recs, p = parse_dmon(widest)
    assert _temps(recs)[0][:2] == (0, 45) and p.stats.counts().get("dropped.bad_header", 0) == 0
    wide = "#Entity".ljust(16) + "TMPTR".ljust(TMPTR) * (MAX_COLUMNS + 1) + "\nGPU 0           45\n"
    recs, p = parse_dmon(dmon(16, [("TMPTR", "C", TMPTR)], [("GPU 0", ["41"])]) + wide * 3)
    assert [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP) for r in recs] == [(0, 41)]
    c = p.stats.counts()
    assert c["dropped.bad_header"] == 3 and c["dropped.unparsable_row"] == 3
