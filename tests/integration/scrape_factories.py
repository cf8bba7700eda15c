"""A source for the producer tests through a real broker: the real H100 dcgm-exporter scrape."""

from __future__ import annotations

from producers.dcgm_exporter import parse_metrics
from tests.factories import T0, SHARED_DATA as DATA


class ScrapeSource:
    """The real H100 scrape, once per poll, each with its own timestamp (one record per GPU)."""

    def __init__(self):
        self.text = (DATA / "dcgm_exporter_h100_8gpu_sampled.prom").read_text()
        self.polls = 0
        self.done = False

    def poll(self):
        recs, _ = parse_metrics(self.text, ts=T0 + self.polls)
        self.polls += 1
        return recs

    def close(self):
        pass
