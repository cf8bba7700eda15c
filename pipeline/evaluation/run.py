"""Run labelled scenarios through each detector and score them."""

from __future__ import annotations

from typing import Callable, Iterable

from pipeline.bus.telemetry import as_consumed, per_host_messages
from pipeline.evaluation.detectors import Detector, detectors
from pipeline.evaluation.score import Score, score_run
from pipeline.runner import Pipeline
from pipeline.schema import AlertEvent


class _Feed:
    """Simulated record batches -> per-host messages -> decoder -> engine, one batch at a time."""

    def __init__(self, engine) -> None:
        self.pipe = Pipeline(engine)
        self.alerts: list[AlertEvent] = []
        self.offset = 0

    def send(self, batch: list[dict]) -> None:
        msgs = as_consumed(per_host_messages(batch), "eval", self.offset)
        self.offset += len(msgs)
        self.alerts += self.pipe.handle(msgs).alerts

    def close(self) -> list[AlertEvent]:
        self.alerts += self.pipe.flush().alerts
        return self.alerts


def replay_batches(engine, batches: Iterable[list[dict]]) -> list[AlertEvent]:
    """Simulated record batches -> per-host messages -> decoder -> ``engine``: every alert."""
    feed = _Feed(engine)
    for batch in batches:
        feed.send(batch)
    return feed.close()


def run_detectors(dets: list[Detector], sim) -> dict[str, list[AlertEvent]]:
    """Every detector's alerts on one simulated run, generating the run once."""
    feeds = {d.name: _Feed(d.engine()) for d in dets}
    for step, batch in enumerate(sim.batches()):
        for d in dets:
            seen = d.view(batch, step, sim.interval)
            if seen is not None:
                feeds[d.name].send(seen)
    return {name: f.close() for name, f in feeds.items()}


def evaluate(
    scenario: str,
    *,
    seeds: int = 3,
    hosts: int = 8,
    duration: float = 3600.0,
    progress: Callable[[str], None] | None = None,
    dets: list[Detector] | None = None,
    interval: float = 1.0,
) -> list[Score]:
    """Score every detector on ``seeds`` runs of ``scenario`` (seeds 1..N) sampled every
    ``interval`` seconds; one ``Score`` per detector, in ``detectors()`` order."""
    from producers.sim import Simulator

    dets = dets if dets is not None else detectors()
    scores = {d.name: Score(d.name) for d in dets}
    for seed in range(1, seeds + 1):
        if progress:
            progress(f"seed {seed}/{seeds}")
        sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=scenario, interval=interval)
        gpu_hours = sim.n_gpus * duration / 3600.0
        labels = sim.labels()
        for name, alerts in run_detectors(dets, sim).items():
            score_run(scores[name], labels, alerts, gpu_hours, run=f"{scenario}/{interval:g}s/{seed}")
    return list(scores.values())
