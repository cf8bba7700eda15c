"""dcgmi dmon in the layouts DCGM prints, built from DeviceMonitor.cpp's format (entity cell 14
wide + 2, each field its width + 6 + 2, values left-aligned under their column, empty cells for
values an entity lacks) and from the DCGM User Guide's examples (``# Entity`` with a space, an
``Id`` units row), not copied from a log."""

from __future__ import annotations

import math
import os

from producers.dcgmi import DmonFileSource, DmonParser

COLS = [("TMPTR", "C"), ("POWER", "W"), ("XIDER", ""), ("NFELT", "")]


def layout(rows: list[tuple[str, list[str]]], *, guide: bool = False, width: int = 8) -> str:
    """A dmon table: header + units rows, then ``rows`` as (entity cell, values; '' = empty cell)."""
    head = ("# Entity" if guide else "#Entity").ljust(16) + "".join(n.ljust(width + 2) for n, _ in COLS)
    units = ("Id" if guide else "ID").ljust(16) + "".join(u.ljust(width + 2) for _, u in COLS)
    body = [ent.ljust(16) + "".join(v.ljust(width + 2) for v in vals) for ent, vals in rows]
    return "\n".join([head.rstrip(), units.rstrip(), *[b.rstrip() for b in body]]) + "\n"


# A GPU row has a value in every column: a "# Entity" header is DCGM 2.1 - 2.3's, which packs a
# short row's values to the left instead of printing empty cells (see DmonParser).
GPU_ROWS = [("GPU 0", ["41", "250.5", "0", "0"]), ("GPU 1", ["43", "251.0", "79", "0"])]


def _parse(text: str) -> tuple[list, DmonParser]:
    p = DmonParser("h", clock=lambda: 1.0e9)
    return list(p.parse(text.splitlines())), p


def test_user_guide_layout_entity_with_a_space_and_id_units_row():
    recs, p = _parse(layout(GPU_ROWS, guide=True) * 2)
    assert [r.gpu for r in recs] == [0, 1, 0, 1]
    assert recs[1].fields.DCGM_FI_DEV_XID_ERRORS == 79 and recs[0].fields.DCGM_FI_DEV_POWER_USAGE == 250.5
    assert p.stats.rows == 4 and p.stats.skipped_rows == 0


def test_link_rows_with_empty_gpu_cells_are_read_by_column_offset():
    rows = GPU_ROWS + [("GPU 0 LINK 2", ["", "", "", "123456"]), ("GPU 1 LINK 0", ["", "", "", "N/A"])]
    recs, p = _parse(layout(rows))
    link = recs[2]
    assert (link.gpu, link.link, link.fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL) == (0, 2, 123456)
    assert math.isnan(link.fields.DCGM_FI_DEV_GPU_TEMP)
    assert (recs[3].gpu, recs[3].link) == (1, 0) and p.stats.na == 1 and p.stats.skipped_rows == 0


def test_mig_switch_and_cpu_rows_are_counted_by_entity_type():
    rows = [GPU_ROWS[0], ("GPU-I 0", ["", "", "", ""]), ("GPU-CI 0", ["", "", "", ""]),
            ("Switch 0", ["50", "", "", ""]), ("SW 0 LINK 3", ["", "", "", "7"]), ("CPU Core 4", ["", "", "", ""]),
            GPU_ROWS[1]]
    recs, p = _parse(layout(rows, guide=True))
    assert [r.gpu for r in recs] == [0, 1]
    assert p.stats.skipped_entities == {"Switch": 1, "SW LINK": 1, "CPU Core": 1, "GPU-I": 1, "GPU-CI": 1}
    assert p.stats.counts()["dropped.skipped_entity.Switch"] == 1


def test_rows_that_fit_no_header_are_counted():
    text = layout(GPU_ROWS) + "GPU 2     1 2 3 4 5 6\nGPU 3\n"
    recs, p = _parse(text)
    assert [r.gpu for r in recs] == [0, 1, 3] and p.stats.skipped_rows == 1
    # a row before any header cannot be read either
    recs, p = _parse("GPU 0  41  250\n" + layout(GPU_ROWS))
    assert len(recs) == 2 and p.stats.skipped_rows == 1


def test_file_source_stamps_rounds_interval_apart_ending_at_mtime(tmp_path):
    f = tmp_path / "dmon.log"
    f.write_text(layout(GPU_ROWS, guide=True) + "\n".join(layout(GPU_ROWS).splitlines()[2:]) + "\n")
    os.utime(f, (1764403260.0, 1764403260.0))
    src = DmonFileSource(str(f), interval_s=5.0, host="n1")
    recs = src.poll()
    assert src.done and [(r.gpu, r.ts) for r in recs] == [(0, 1764403255.0), (1, 1764403255.0),
                                                           (0, 1764403260.0), (1, 1764403260.0)]
    assert src.summary()["records"] == 4


def test_cli_reads_a_saved_dmon_log(tmp_path, capsys):
    from pipeline.cli import main

    f = tmp_path / "dmon.log"
    f.write_text(layout(GPU_ROWS + [("GPU-I 1", ["", "", "", ""])], guide=True))
    out = tmp_path / "o.jsonl"
    assert main(["produce", "dcgmi", "--file", str(f), "--out", str(out), "--host", "n1"]) == 0
    assert len(out.read_text().splitlines()) == 2
    err = capsys.readouterr().err
    assert "records 2" in err and "dropped.skipped_entity.GPU-I 1" in err
