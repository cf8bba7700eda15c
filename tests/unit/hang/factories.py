"""Jobs' progress reports for the hang detector's tests: a job of ``nranks`` ranks, one per host
(``n<rank>``, GPU ``rank % 8``), reporting as its watchdogs or NCCL's RAS would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.detection import build_detector
from pipeline.topology import Topology
from tests.factories import fleet, progress, run_batched

RULES = str(Path(__file__).resolve().parents[3] / "rules")


def healthy_reports(nranks: int, seconds: range, every: int = 10, job: str = "j1") -> list:
    """Every rank reports the same progress every ``every`` seconds, one work a second."""
    return [progress(t + 0.3, f"n{r}", r, gpu=r % 8, job=job, nranks=nranks, last_enqueued=t, last_completed=t - 1)
            for t in seconds if t % every == 0 for r in range(nranks)]  # fmt: skip


def watchdog_timeouts(nranks: int, at: float, behind: dict[int, int], done: int = 546, job: str = "j1") -> list:
    """Every rank's watchdog times out at ``at`` on work ``done + 1``; ranks in ``behind`` had
    completed only the work given."""
    return [progress(at + 0.1 * r, f"n{r}", r, gpu=r % 8, job=job, state="timeout", seq=done + 1, op="ALLREDUCE",
                     timeout_ms=600000, last_enqueued=done + 1, last_completed=behind.get(r, done))
            for r in range(nranks)]  # fmt: skip


def detector() -> Topology:
    det, diags = build_detector([RULES], "auto")
    assert isinstance(det, Topology) and not diags
    return det


def hang_alerts(records: list, batch: int = 50, det: Any = None) -> list[tuple]:
    """The hang alerts of ``records`` beside a small healthy fleet, fed ``batch`` at a time:
    (state, host, gpu, job, ts, summary, suspect ranks)."""
    det = det or detector()
    seconds = {int(r.ts - fleet([0], 1, 1)[0].ts) for r in records}
    base = fleet(range(0, max(seconds, default=0) + 30), hosts=2, gpus=1)
    recs = sorted(base + records, key=lambda r: r.ts)
    out = run_batched(recs, batch, det)
    return [(a.state, a.host, a.gpu, a.job, a.ts, a.summary, [s["rank"] for s in a.evidence.get("suspects", [])])
            for a in out.alerts if a.rule == "hang_collective"]  # fmt: skip


def serve_both_stages(messages: list[tuple[bytes, bytes]], partitions: int = 4) -> list[dict]:
    """``messages`` (key, value) on an in-process bus's telemetry topic, through ``serve``'s
    host and fleet stages (one ``Service`` each, as two replicas would run them); the alerts
    topic's events, decoded."""
    import json

    import msgspec

    from pipeline.bus import MemoryBus, Topics
    from pipeline.bus.retry import Backoff
    from pipeline.service.app import Service
    from pipeline.service.config import load_config_text
    from pipeline.service.state import MemoryStateStore
    from tests.factories import Clock

    bus, topics, clock = MemoryBus(partitions=partitions), Topics("t"), Clock()
    p = bus.producer()
    for key, value in messages:
        p.send(topics.telemetry, value, key)
    cfg = load_config_text(json.dumps({
        "kafka": {"prefix": "t", "max_poll_records": 16, "partitions": partitions},
        "service": {"rules": [RULES], "models": "auto", "flush_idle_s": 3, "checkpoint_interval_s": 5}}),
        env={})  # fmt: skip
    services = []
    for stage, group, topic in (("host", "svc", topics.telemetry), ("fleet", "svc.fleet", topics.fleet)):
        state = MemoryStateStore(bus, topics.state, group, topic, key=b"unit-test-state-key-0123456789ab")
        services.append(Service(cfg, consumer=bus.group_consumer(topic, group), producer=bus.producer(), state=state,
                                clock=clock, backoff=Backoff(sleep=lambda s: None), stage=stage))  # fmt: skip
    for _ in range(3000):
        for s in services:
            s.step()
        clock.t += 0.5
    for s in services:
        s.shutdown()
    return [msgspec.json.decode(m.value) for m in bus.messages(topics.alerts)]


def tp_dp_job(
    hosts: int,
    gpus: int,
    duration: int,
    hung: tuple[int, int] | None = None,
    start: int = 60,
    end: int | None = None,
    timeout: float = 120.0,
    job: str = "j1",
) -> list:
    """A job of ``hosts`` x ``gpus`` ranks in a TP communicator per host and a DP one per GPU
    index, as the simulator lays them out (producers/sim/progress.py): RAS counts of every rank
    every 30 s (communicators keyed ``tp<h>``/``dp<g>``, one operation a second) and, with
    ``hung`` (host, GPU) stuck from ``start`` to ``end``, the watchdog timeouts of its two
    communicators ``timeout`` later (keyed by process-group id ``1``.., as PyTorch numbers them).
    The hung GPU's counts stay one behind its peers' while it hangs."""
    comms = [("tp", h, [(h, g) for g in range(gpus)]) for h in range(hosts)]
    comms += [("dp", g, [(h, g) for h in range(hosts)]) for g in range(gpus)]
    recs = []
    for t in range(0, duration, 30):
        frozen = hung is not None and start <= t and (end is None or t < end)
        for kind, i, ranks in comms:
            stuck = frozen and hung in ranks
            for r, hg in enumerate(ranks):
                count = (start + (1 if hg == hung else 2)) if stuck else t
                recs.append(progress(t + 0.5, f"n{hg[0]}", r, gpu=hg[1], job=job, comm=f"{kind}{i}", source="ras",
                                     state="lagging" if stuck and hg == hung else "progress", nranks=len(ranks),
                                     last_enqueued=count))  # fmt: skip
    if hung is not None and start + timeout < min(duration, end if end is not None else duration):
        for pg, (kind, i, ranks) in enumerate(comms, 1):
            if hung not in ranks:
                continue
            for r, hg in enumerate(ranks):
                done = start if hg == hung else start + 1
                recs.append(progress(start + timeout + 0.1 * r, f"n{hg[0]}", r, gpu=hg[1], job=job, comm=str(pg),
                                     comm_name=f"{kind}{i}", state="timeout", seq=start + 2, op="ALLREDUCE",
                                     timeout_ms=int(timeout * 1000), last_enqueued=done + 1,
                                     last_completed=done))  # fmt: skip
    return sorted(recs, key=lambda x: x.ts)
