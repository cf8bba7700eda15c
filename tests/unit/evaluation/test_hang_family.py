"""The hang family end to end: the simulator's progress source through the default detector
(packs, models and the fleet stage's hang detector), scored as ``gpuwarden eval`` scores it."""

from __future__ import annotations

import dataclasses

from pipeline.evaluation.detectors import detectors
from pipeline.evaluation.run import evaluate, replay_batches
from producers.sim import Simulator, load_scenario


def default_detector():
    return next(d for d in detectors() if d.name == "gpuwarden")


def test_a_healthy_job_reporting_its_progress_raises_nothing():
    # Checkpoints stop every rank's progress at once; nothing lags, so nothing is a hang.
    sc = dataclasses.replace(load_scenario("healthy"), sources=["progress"], checkpoint_every=300.0)
    sim = Simulator(hosts=4, duration=900.0, seed=2, scenario=sc)
    recs = [r for b in sim.batches() for r in b]
    assert sum(r["kind"] == "progress" for r in recs) >= 29 * 4 * 8 * 2
    alerts = replay_batches(default_detector().engine(), sim.batches())
    assert [a for a in alerts if a.state == "firing"] == []


def test_a_hang_is_found_on_the_hung_rank_without_false_alerts():
    det = default_detector()
    (score,) = evaluate("hang", seeds=1, hosts=4, duration=900.0, dets=[det])
    fam = score.families["hang"]
    assert (fam.injected, fam.detected, fam.right_gpu) == (1, 1, 1)
    assert score.false_alerts == 0
    sim = Simulator(hosts=4, duration=900.0, seed=1, scenario="hang")
    (lab,) = [x for x in sim.labels() if x["fault"]]
    hangs = [a for a in replay_batches(det.engine(), sim.batches()) if a.rule == "hang_collective"]
    assert hangs and all(a.state != "firing" or (a.host, a.gpu) == (lab["host"], lab["gpu"]) for a in hangs)
    firing = [a for a in hangs if a.state == "firing"]
    assert {(s["host"], s["gpu"]) for a in firing for s in a.evidence["suspects"]} == {(lab["host"], lab["gpu"])}
