"""dcgmi dmon producer: the real sample, repeated headers and odd rows, and a fake ``dcgmi``
executable on PATH (real subprocess, argv list, exit 250 for an unsupported field)."""

from __future__ import annotations

import math
import time

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.dcgmi import DmonParser, DmonSource, supported_fields
from tests.factories import SHARED_DATA as DATA
from tests.unit.producers.dcgmi_factories import fake_dcgmi  # noqa: F401 - the fixture

SAMPLE = DATA / "dcgmi_dmon_a100_dcgm3_sample.txt"


def test_sample_field_by_field():
    clock = iter([1764403200.0, 1764403201.0, 1764403202.0]).__next__
    p = DmonParser("a100-node", clock=clock)
    recs = list(p.parse(SAMPLE.read_text().splitlines()))
    assert len(recs) == 16
    assert [r.gpu for r in recs[:8]] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert {r.ts for r in recs[:8]} == {1764403200.0} and {r.ts for r in recs[8:]} == {1764403201.0}   # two rounds
    g7 = recs[0].fields
    assert (g7.DCGM_FI_DEV_GPU_TEMP, g7.DCGM_FI_DEV_POWER_USAGE, g7.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            g7.DCGM_FI_DEV_GPU_UTIL, g7.DCGM_FI_DEV_FB_USED) == (45, 57.430, 108702777, 0, 0)
    assert recs[12].gpu == 3 and recs[12].fields.DCGM_FI_DEV_POWER_USAGE == pytest.approx(59.699)
    assert recs[15].fields.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION == 110946157
    assert math.isnan(g7.DCGM_FI_DEV_SM_CLOCK) and all(r.host == "a100-node" for r in recs)
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "t")
    assert out.dead == [] and len(out.records) == 16


def test_repeated_headers_na_links_other_entities_and_sentinels():
    text = """\
#Entity   TMPTR  POWER   XIDER  NFELT
ID        C      W
GPU 0     50     300.5   0      N/A
GPU 0 LINK 3     N/A    N/A     N/A    7
GPU-I 1   1      2       3      4
GPU 1     9223372036854775794  N/A  48  0
GPU 2     51     301
#Entity   TMPTR  POWER   XIDER  NFELT
ID        C      W
GPU 0     52     310     0      N/A
"""
    p = DmonParser("h", clock=lambda: 1.0e9)
    recs = list(p.parse(text.splitlines()))
    assert [(r.gpu, r.link) for r in recs] == [(0, None), (0, 3), (1, None), (0, None)]
    assert recs[0].fields.DCGM_FI_DEV_POWER_USAGE == 300.5
    assert math.isnan(recs[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL)       # N/A
    assert recs[1].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 7
    assert math.isnan(recs[2].fields.DCGM_FI_DEV_GPU_TEMP)                                # blank dropped
    assert recs[2].fields.DCGM_FI_DEV_XID_ERRORS == 48
    # GPU 2 has two values for four columns under a 10-wide "#Entity" (DCGM before 4.0, which packs
    # a row's values to the left): which columns they belong to is unknown, so the row is dropped
    assert recs[3].fields.DCGM_FI_DEV_GPU_TEMP == 52
    assert p.stats.skipped_rows == 0 and p.stats.counts()["dropped.packed_row"] == 1
    assert p.stats.blank == 1 and p.stats.skipped_entities == {"GPU-I": 1}


def test_probe_leaves_out_unsupported_fields(fake_dcgmi):
    assert supported_fields([150, 155, 156, 203, 999]) == [150, 156, 203]


def test_source_streams_fake_dcgmi(fake_dcgmi):
    src = DmonSource([150, 155, 156, 203, 252], interval_s=0.5, host="n1")
    try:
        recs = []
        deadline = time.monotonic() + 15
        while len(recs) < 16 and time.monotonic() < deadline:
            recs += src.poll()
            time.sleep(0.05)
    finally:
        src.close()
    assert len(recs) == 16
    argv = fake_dcgmi.read_text().splitlines()[-1]
    assert argv == "dmon -e 150,156,203,252 -d 500"        # 155 probed out, interval in ms
    assert recs[0].gpu == 7 and recs[0].fields.DCGM_FI_DEV_GPU_TEMP == 45
    assert src.field_ids == [150, 156, 203, 252]


def test_no_supported_field_is_a_clear_error(fake_dcgmi):
    with pytest.raises(RuntimeError, match="supports none"):
        DmonSource([155], host="n1")
