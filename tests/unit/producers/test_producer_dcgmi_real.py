"""dcgmi dmon rows shaped as NVIDIA/DCGM's dcgmi/DeviceMonitor.cpp prints them at the tags named
in each test (header ``"{:<{}}"`` of ``#Entity``, each field cell ``width + 6 + 2`` wide, values
left-aligned), with entity labels and trailers taken from that source and its tests."""

from __future__ import annotations

from producers.dcgmi import DmonFileSource, DmonParser

# NFELT: DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL, DCGM_FIELD_WIDTH_20 (dcgmlib/src/dcgm_fields.cpp @ v4.6.0)
# -> a 28-wide cell; TMPTR (width 5) -> 13.
NFELT = 20 + 6 + 2
TMPTR = 5 + 6 + 2


def dmon(entity_width: int, cols: list[tuple[str, str, int]], rows: list[tuple[str, list[str]]]) -> str:
    """Header, units row and ``rows`` as DeviceMonitor.cpp pads them (trailing padding kept)."""
    head = "#Entity".ljust(entity_width) + "".join(n.ljust(w) for n, _, w in cols)
    units = "ID".ljust(entity_width) + "".join(u.ljust(w) for _, u, w in cols)
    body = [e.ljust(entity_width) + "".join(v.ljust(w) for v, (_, _, w) in zip(vals, cols)) for e, vals in rows]
    return "\n".join([head, units, *body]) + "\n"


def _parse(text: str) -> tuple[list, DmonParser]:
    p = DmonParser("h", clock=lambda: 1.0e9)
    return list(p.parse(text.splitlines())), p


def test_raw_link_rows_of_dcgm_3_to_4_5_are_counted_entities_not_lost_rows():
    # Before: "LINK 257" matched no entity: the row was dropped as unparsable (exit 3). Rows as
    # testing/python3/tests/test_dcgmi.py @ v4.6.0 (test_dcgmi_dmon_gpu_link_per_link) quotes the
    # pre-4.6 output. The raw dcgm_link_t names its GPU in bits 16-31 (3.x: 66817 is GPU 1, port 5),
    # bits 24-31 (4.3.1+: 16778497), or not at all (4.0 - 4.3.0): no row can be read as a GPU's link.
    rows = [("LINK 1", ["9943475587"]), ("LINK 257", ["9944687209"]), ("LINK 66817", ["N/A"]),
            ("LINK 16778497", ["N/A"]), ("LINK 771", ["7"]), ("GPU 0", ["9947415957"])]
    recs, p = _parse(dmon(16, [("NFELT", "", NFELT)], rows))
    assert [(r.gpu, r.link) for r in recs] == [(0, None)]
    assert recs[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 9947415957
    assert p.stats.skipped_rows == 0 and p.stats.skipped_entities == {"LINK": 5}


def test_ctrl_c_trailer_is_not_a_lost_row(tmp_path):
    # Before: the trailer counted as an unparsable row, so a saved capture stopped with ctrl-C
    # exited 3 ("LOST input"). LockWatchAndUpdate() @ v4.6.0 prints "\n\ndmon was stopped due to
    # receiving a signal\n"; @ v2.1.4 the same sentence with a "." after one newline.
    cols = [("TMPTR", " C", TMPTR)]
    for trailer in ("\n\ndmon was stopped due to receiving a signal\n", "\ndmon was stopped due to receiving a signal.\n"):
        f = tmp_path / "dmon.log"
        f.write_text(dmon(16, cols, [("GPU 0", ["41"]), ("GPU 1", ["43"])]) + trailer)
        src = DmonFileSource(str(f), host="h")
        assert [r.gpu for r in src.poll()] == [0, 1]
        assert src.summary()["dropped.unparsable_row"] == 0 and src.summary()["rows"] == 2


def test_unknown_entity_rows_are_skipped_entities_not_lost_rows():
    # Before: "UNKNOWN 0" (DCGM_FE_NONE, global data; the formatter<dcgm_field_entity_group_t>
    # of dcgmi/DeviceMonitor.cpp @ v3.3.9, 10-wide entity cell) was an unparsable row (exit 3).
    recs, p = _parse(dmon(10, [("TMPTR", " C", TMPTR)], [("GPU 0", ["41"]), ("UNKNOWN 0", ["N/A"])]))
    assert [r.gpu for r in recs] == [0]
    assert p.stats.skipped_rows == 0 and p.stats.skipped_entities == {"UNKNOWN": 1}
