"""Run labelled scenarios through each detector and score them: their alerts, and the incidents
the incident stage makes of those alerts."""

from __future__ import annotations

from typing import Callable, Iterable

from pipeline.bus.telemetry import as_consumed, per_host_messages
from pipeline.evaluation.detectors import Detector, detectors
from pipeline.evaluation.score import Score, score_incidents, score_run
from pipeline.incidents import IncidentConfig, IncidentEvent, IncidentStage, default_config
from pipeline.replay import incident_watermark
from pipeline.runner import Pipeline
from pipeline.schema import AlertEvent


class _Feed:
    """Simulated record batches -> per-host messages -> decoder -> engine, one batch at a time;
    the alerts through the incident stage too."""

    def __init__(self, engine, incidents: IncidentConfig | None = None) -> None:
        self.pipe = Pipeline(engine)
        self.stage = IncidentStage(incidents or default_config())
        self.feed = self.stage.feed()  # the stage's input in replay's and serve's order
        self.alerts: list[AlertEvent] = []
        self.incidents: list[IncidentEvent] = []
        self.offset = 0

    def _take(self, alerts: list[AlertEvent], final: bool = False) -> None:
        self.alerts += alerts
        self.feed.add(alerts)
        ready = self.feed.flush() if final else self.feed.release(incident_watermark(self.pipe.engine))
        self.incidents += self.stage.process(ready)

    def send(self, batch: list[dict]) -> None:
        msgs = as_consumed(per_host_messages(batch), "eval", self.offset)
        self.offset += len(msgs)
        self._take(self.pipe.handle(msgs).alerts)

    def close(self) -> list[AlertEvent]:
        self._take(self.pipe.flush().alerts, final=True)
        return self.alerts


def replay_batches(engine, batches: Iterable[list[dict]]) -> list[AlertEvent]:
    """Simulated record batches -> per-host messages -> decoder -> ``engine``: every alert."""
    feed = _Feed(engine)
    for batch in batches:
        feed.send(batch)
    return feed.close()


def _run_feeds(dets: list[Detector], sim) -> dict[str, _Feed]:
    incidents = default_config()
    feeds = {d.name: _Feed(d.engine(), incidents) for d in dets}
    for step, batch in enumerate(sim.batches()):
        for d in dets:
            seen = d.view(batch, step, sim.interval)
            if seen is not None:
                feeds[d.name].send(seen)
    for f in feeds.values():
        f.close()
    return feeds


def run_detectors(dets: list[Detector], sim) -> dict[str, list[AlertEvent]]:
    """Every detector's alerts on one simulated run, generating the run once."""
    return {name: f.alerts for name, f in _run_feeds(dets, sim).items()}


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
        for name, feed in _run_feeds(dets, sim).items():
            score_run(scores[name], labels, feed.alerts, gpu_hours, run=f"{scenario}/{interval:g}s/{seed}")
            score_incidents(scores[name], labels, feed.incidents)
    return list(scores.values())
