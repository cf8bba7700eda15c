"""Fixtures of these tests; the helpers they share are in factories.py beside this file."""

from __future__ import annotations

import pytest

from producers.sim import Simulator
from producers.sim.scenarios import FaultSpec, Scenario
from tests.unit.models.factories import records


@pytest.fixture(scope="session")
def sim_streams():
    """Decoded record batches of a few small labelled runs, shared by the tests."""
    cache: dict[tuple, tuple[Simulator, list[list]]] = {}

    def get(fault: str | None, hosts: int = 2, duration: float = 600.0, seed: int = 3, onset: float = 300.0):
        key = (fault, hosts, duration, seed, onset)
        if key not in cache:
            faults = [] if fault is None else [FaultSpec(type=fault, onset=onset, duration=duration - onset)]
            sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=Scenario(name="t", faults=faults))
            cache[key] = (sim, records(sim))
        return cache[key]
    return get
