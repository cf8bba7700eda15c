"""Both stages in one object (pipeline/topology.py): rules only, the host stage forwards the
progress records alone (the fleet stage's hang detector reads nothing else) and restores the
engine checkpoint such a host stage wrote before it ran the hang detector."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.detection import build_detector
from pipeline.engine import Engine
from pipeline.topology import Topology

RULES = str(Path(__file__).resolve().parents[2] / "rules")


def _fleet_engine() -> Engine:
    det, _ = build_detector([RULES], "auto")
    assert isinstance(det, Topology)
    return det.make_fleet_engine()


def test_rules_only_a_host_stage_forwards_progress_records_alone_and_takes_back_an_engine_checkpoint():
    from pipeline.errors import StateError
    from tests.factories import fleet, progress

    det, _ = build_detector([RULES], "none")
    assert isinstance(det, Topology) and det.progress_only
    recs = sorted(fleet(range(40), hosts=2, gpus=1) + [progress(10.5, "n0", 0), progress(20.5, "n1", 1)],
                  key=lambda r: r.ts)  # fmt: skip
    out = det.process(recs)
    assert [(type(r).__name__, r.host) for r in out.forwarded] == [("ProgressRecord", "n0"), ("ProgressRecord", "n1")]
    # The service's host stage, rules only: a checkpoint its engine wrote before it ran the hang
    # detector (an Engine's snapshot) restores; one with the models in one stage does not.
    host_only, _ = build_detector([RULES], "none")
    old, _ = build_detector([RULES], "none")
    assert isinstance(host_only, Topology) and isinstance(old, Topology)
    remote = Topology(host_only.host, host_only.make_fleet_engine, local_fleet=False, progress_only=True)
    old.host.process(recs)
    remote.restore(old.host.snapshot())
    assert remote.host.released == old.host.released
    with pytest.raises(StateError):
        Topology(Engine(), _fleet_engine, local_fleet=False).restore(old.host.snapshot())
