"""``dcgmi dmon`` rows with hostile ids and values cost only themselves, and the live reader
counts what its bounded queue could not hold."""

from __future__ import annotations

import math
import time

from producers.dcgmi import DmonFileSource, DmonParser, DmonSource

from tests.unit.producers.dcgmi_factories import fake_dcgmi  # noqa: F401 - the fixture

HEADER = "#Entity   TMPTR  POWER   XIDER\nID        C      W\n"


def test_non_ascii_or_huge_entity_ids_do_not_name_a_gpu_or_crash():
    # Before: "\d+" read "٣" as GPU 3 (overwriting it), and int() of 5,000 digits raised
    # ValueError out of feed(): the whole file's poll failed.
    text = HEADER + "GPU 0     50     300.5   0\nGPU ٣     51     301     0\nGPU " + "9" * 5000 + "  52  302  0\nGPU 1     53     303     0\n"
    p = DmonParser("h", clock=lambda: 1.0)
    recs = list(p.parse(text.splitlines()))
    assert [r.gpu for r in recs] == [0, 1]
    assert p.stats.skipped_rows == 2


def test_a_damaged_value_costs_only_its_cell_and_is_counted():
    text = HEADER + "GPU 0     ٣     1_0     " + "9" * 400 + "\nGPU 1     50     N/S     48\n"
    p = DmonParser("h", clock=lambda: 1.0)
    r0, r1 = p.parse(text.splitlines())
    f0 = r0.fields
    assert all(math.isnan(v) for v in (f0.DCGM_FI_DEV_GPU_TEMP, f0.DCGM_FI_DEV_POWER_USAGE, f0.DCGM_FI_DEV_XID_ERRORS))
    assert r1.fields.DCGM_FI_DEV_GPU_TEMP == 50 and r1.fields.DCGM_FI_DEV_XID_ERRORS == 48
    c = p.stats.counts()
    assert c["dropped.bad_value"] == 3 and c["dropped.na_value"] == 1


def test_file_with_a_hostile_row_keeps_the_rest(tmp_path):
    f = tmp_path / "dmon.txt"
    f.write_text(HEADER + "GPU 0  50  300  0\nGPU " + "7" * 5000 + "  1  1  1\nGPU 1  51  301  0\n")
    src = DmonFileSource(str(f), host="h")
    assert [r.gpu for r in src.poll()] == [0, 1]


def test_reader_queue_drops_are_counted(fake_dcgmi):  # noqa: F811 - the fixture
    # Before: a full queue dropped records with `pass`; nothing counted them.
    src = DmonSource([150, 156, 203], interval_s=0.5, host="n1", probe=False, max_queued=4)
    try:
        deadline = time.monotonic() + 15
        while src.parser.stats.records < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(src.poll()) == 4
    finally:
        src.close()
    assert src.summary()["dropped.queue_full"] == 12
