"""Simulated H100/H200 training fleet with labelled fault injection.

The project's test-data generator, demo driver and evaluation ground truth::

    from producers.sim import Simulator, load_scenario, SCENARIOS
    sim = Simulator(hosts=4, duration=600.0, seed=1, scenario="mixed")
    for batch in sim.batches():   # list[dict] per time step, records of docs/architecture.md §3
        ...
    sim.labels()                  # faults and benign conditions, with onset/end timestamps

Modules: ``fleet`` (physics), ``faults`` (fault/condition effects), ``nccl`` (collective
telemetry), ``scenarios`` (Scenario, YAML loading, built-ins), ``llama3`` (Meta's failure mix),
``plan`` (placement and labels), ``records`` (DCGM dicts), ``simulator`` (the driver).
"""

from .faults import CONDITION_TYPES, FAULT_TYPES
from .scenarios import SCENARIOS, FaultSpec, Scenario, load_scenario
from .simulator import SimSource, Simulator

__all__ = [
    "CONDITION_TYPES",
    "FAULT_TYPES",
    "SCENARIOS",
    "FaultSpec",
    "Scenario",
    "SimSource",
    "Simulator",
    "load_scenario",
]
