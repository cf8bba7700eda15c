"""Fixtures of these tests; the helpers they share are in factories.py beside this file."""

from __future__ import annotations

import pytest

from tests.factories import fleet
from tests.unit.report.factories import alert, hot_gpu, write_jsonl


@pytest.fixture
def incident_files(tmp_path):
    """A 3-minute, 2-host x 2-GPU recording with one throttling GPU, and its alerts."""
    tel = write_jsonl(tmp_path / "t.jsonl", fleet(range(180), hosts=2, gpus=2, overrides=hot_gpu))
    alerts = write_jsonl(tmp_path / "a.jsonl", [
        alert(65, started=60, evidence={"gpu_temp": 90.0, "sm_clock": 1005.0}),
        alert(150, state="resolved", started=60, evidence={"gpu_temp": 68.0}),
    ])
    return tel, alerts
