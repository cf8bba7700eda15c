"""The engine's walks over ticks end whatever the timestamps: past ~1e16 s a 1 s tick is below the
float spacing, and stepping ``next_tick += tick`` stood still for ever (issue #36, row 1: a fleet
mark with ``upto`` ~1e17 hung the service)."""

from __future__ import annotations

import math

import pytest

from pipeline.engine import Engine, EngineConfig
from pipeline.schema import dcgm
from tests.factories import HEALTHY, T0
from tests.fleet_factories import no_hang


def _screened() -> Engine:
    return Engine(EngineConfig(), row_checks=[], tick_checks=[], screened=True)


@pytest.mark.parametrize("upto", [1e17, 2.0**60, 1e300])
def test_advancing_to_a_time_past_the_tick_grids_float_spacing_ends(upto):
    eng = _screened()
    eng.process([dcgm(T0, "n1", 0, HEALTHY)])
    with no_hang(20):
        eng.advance_to(upto)
    assert eng.released == upto


@pytest.mark.parametrize("far", [1e17, 2.0**60])
def test_a_record_past_the_float_spacing_of_a_tick_is_processed_and_ends(far):
    eng = _screened()
    eng.process([dcgm(T0, "n1", 0, HEALTHY), dcgm(far, "n1", 0, HEALTHY), dcgm(far, "n1", 1, HEALTHY)])
    with no_hang(20):
        eng.flush()
    assert eng.stats["records.dcgm"] == 3 and eng.released == far


def test_the_default_engine_with_its_checks_ends_too():
    eng = Engine(EngineConfig())
    eng.process([dcgm(T0 + t, "n1", 0, HEALTHY) for t in range(3)])
    with no_hang(20):
        eng.advance_to(1e17)
    assert math.isfinite(eng.released)
