"""``gpuwarden eval`` scores the incidents of every detector beside its alerts, leaving the alert
tables as they are."""

from __future__ import annotations

import pytest
from producers.sim import Simulator

from pipeline.evaluation.detectors import detectors
from pipeline.evaluation.run import evaluate, run_detectors
from pipeline.evaluation.score import Score, score_incidents, score_run
from pipeline.evaluation.tables import detector_rows, family_rows, incident_rows
from pipeline.incidents.events import IncidentEvent, IncidentRoot

LABELS = [
    {"fault": "hbm_ecc_burst", "host": "n1", "gpu": 0, "onset": 100.0, "end": 400.0},
    {"fault": "nccl_straggler", "host": "n2", "gpu": 3, "onset": 1000.0, "end": 1300.0},
    {"fault": None, "condition": "power_cap", "host": "n3", "onset": 0.0, "end": 50.0},
]


def _opened(iid: str, host: str, ts: float, fault: str = "f") -> IncidentEvent:
    return IncidentEvent(incident=iid, state="opened", ts=ts, opened_at=ts, host=host,
                         root=IncidentRoot(alert=iid, rule="r", fault=fault), severity="warning", action="watch")


def test_score_incidents_counts_faults_covered_and_stray_incidents() -> None:
    s = Score("x")
    # n1's fault is covered; n2's is not (its incident is on another host); n9's incident is stray.
    score_incidents(s, LABELS, [_opened("a", "n1", 150.0), _opened("b", "n9", 1100.0)])
    assert (s.incident_faults, s.incidents, s.faults_in_incident, s.stray_incidents) == (2, 2, 1, 1)
    row = incident_rows([s]).rows[0]
    assert row == ["x", "2", "0", "0.00", "2", "1.00", "1/2 (50%)", "0/2 (0%)", "1"]


def test_a_fault_has_an_incident_of_its_own_only_where_its_family_opened_one() -> None:
    # n1's HBM burst is covered by a thermal incident opened in its window (another fault's, which
    # its alerts joined) but opened none of its own until an HBM-rooted one; n2's opened one.
    labels = LABELS[:2]
    joined = [_opened("t", "n1", 100.0, "thermal_throttling"), _opened("s", "n2", 1010.0, "nccl_straggler")]
    s = Score("x")
    score_incidents(s, labels, joined)
    assert (s.faults_in_incident, s.faults_with_own_incident) == (2, 1)
    own = Score("x")
    score_incidents(own, labels, [*joined, _opened("h", "n1", 120.0, "hbm_sbe_rate")])
    assert own.faults_with_own_incident == 2
    # Opened before the fault's onset (another fault's, of the same family): not its own.
    early = Score("x")
    score_incidents(early, labels[:1], [_opened("h0", "n1", 50.0, "hbm_sbe_rate")])
    assert early.faults_with_own_incident == 0


@pytest.mark.slow
def test_the_alert_tables_are_the_same_with_incidents_scored() -> None:
    # The alert tables come from the alerts alone: scoring incidents beside them changes nothing.
    dets = detectors()
    sim = Simulator(hosts=1, duration=600, seed=1, scenario="thermal_hbm")
    alone = [Score(d.name) for d in dets]
    for s, alerts in zip(alone, run_detectors(dets, sim).values()):
        score_run(s, sim.labels(), alerts, sim.n_gpus * 600 / 3600.0, run="thermal_hbm/1s/1")
    scores = evaluate("thermal_hbm", seeds=1, hosts=1, duration=600, dets=dets)
    assert family_rows(scores, "t").rows == family_rows(alone, "t").rows
    assert detector_rows(scores).rows == detector_rows(alone).rows
    ours = incident_rows(scores).rows
    assert [r[0] for r in ours] == ["gpuwarden", "community", "dcgm-health"]
    assert ours[0][1] == "1" and ours[0][4] == "1" and ours[0][7] == "1/1 (100%)" and ours[0][8] == "0"
