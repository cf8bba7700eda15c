"""Run labelled scenarios through each detector and score them."""

from __future__ import annotations

from typing import Callable

from pipeline.bus.base import Message
from pipeline.bus.telemetry import per_host_messages
from pipeline.evaluation.detectors import Detector, detectors
from pipeline.evaluation.score import Score, score_run
from pipeline.runner import Pipeline
from pipeline.schema import AlertEvent


def run_detector(det: Detector, sim) -> list[AlertEvent]:
    return replay_batches(det.engine(), det.transform(sim.batches()))


def replay_batches(engine, batches) -> list[AlertEvent]:
    """Simulated record batches -> per-host messages -> decoder -> ``engine``: every alert."""
    pipe = Pipeline(engine)
    alerts: list[AlertEvent] = []
    offset = 0
    for batch in batches:
        msgs = []
        for key, value in per_host_messages(batch):
            msgs.append(Message("eval", 0, offset, key, value))
            offset += 1
        alerts += pipe.handle(msgs).alerts
    return alerts + pipe.flush().alerts


def evaluate(scenario: str, *, seeds: int = 3, hosts: int = 8, duration: float = 3600.0,
             progress: Callable[[str], None] | None = None) -> list[Score]:
    """Score every detector on ``seeds`` runs of ``scenario`` (seeds 1..N)."""
    from producers.sim import Simulator

    dets = detectors()
    scores = {d.name: Score(d.name) for d in dets}
    for seed in range(1, seeds + 1):
        sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=scenario)
        gpu_hours = sim.n_gpus * duration / 3600.0
        labels = sim.labels()
        for d in dets:
            if progress:
                progress(f"seed {seed}: {d.name}")
            score_run(scores[d.name], labels, run_detector(d, sim), gpu_hours)
    return list(scores.values())
